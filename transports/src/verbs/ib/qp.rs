//! RC queue pairs: the move to RTS towards the peer, and the work requests the protocol posts
//! (RDMA writes, with or without immediate, and empty receives that catch an immediate).

use super::{errno_err, Device};
use crate::verbs::handshake::PortAddr;
use crate::verbs::proto::Local;
use crate::{Result, TransportError};
use ibverbs_sys as ffi;
use std::ptr;

/// QP parameters both ends settled on.
pub struct PathParams {
    pub mtu: u8,
    pub traffic_class: u8,
    pub service_level: u8,
    pub ack_timeout: u8,
    pub retry_cnt: u8,
}

pub struct Qp {
    pub(super) qp: *mut ffi::ibv_qp,
}

impl Qp {
    pub fn num(&self) -> u32 {
        // SAFETY: qp is valid for self's lifetime.
        unsafe { (*self.qp).qp_num }
    }

    pub(super) fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        state: &str,
    ) -> Result<()> {
        // SAFETY: qp is valid; attr is initialised for the fields in mask.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(errno_err(&format!("moving a queue pair to {state}"), rc));
        }
        Ok(())
    }

    /// INIT → RTR → RTS towards `remote` queue pair `qpn`.
    pub fn connect(&self, dev: &Device, qpn: u32, remote: &PortAddr, p: &PathParams) -> Result<()> {
        let mut ah = ffi::ibv_ah_attr {
            dlid: remote.lid,
            sl: p.service_level,
            port_num: dev.port,
            ..Default::default()
        };
        if remote.roce || dev.addr.roce {
            ah.is_global = 1;
            ah.grh.dgid = ffi::ibv_gid { raw: remote.gid };
            ah.grh.sgid_index = dev.gid_index;
            ah.grh.hop_limit = 255;
            ah.grh.flow_label = 0;
            ah.grh.traffic_class = p.traffic_class;
        }
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: p.mtu as ffi::ibv_mtu,
            dest_qp_num: qpn,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        let m = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, m, "RTR (check the GID and the path MTU)")?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout: p.ack_timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let m = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, m, "RTS")
    }

    fn post_send(&self, wr: &mut ffi::ibv_send_wr) -> Result<()> {
        let mut bad = ptr::null_mut();
        // SAFETY: qp is valid; the driver's post_send is set for every opened device; wr and
        // its SGE list are valid for the call (the payload's validity is the comm's contract).
        let rc = unsafe {
            let ops = &mut (*(*self.qp).context).ops;
            match ops.post_send {
                Some(f) => f(self.qp, wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(errno_err("ibv_post_send", rc));
        }
        Ok(())
    }

    /// A signaled RDMA write of `local` to `remote`/`rkey`, with `imm` when given.
    pub fn write(
        &self,
        local: Local,
        remote: u64,
        rkey: u32,
        imm: Option<u32>,
        wr_id: u64,
    ) -> Result<()> {
        self.write_gather(&[local], remote, rkey, imm, wr_id)
    }

    /// [`Qp::write`] of the concatenation of `parts` (at most two; empty ones are skipped).
    pub fn write_gather(
        &self,
        parts: &[Local],
        remote: u64,
        rkey: u32,
        imm: Option<u32>,
        wr_id: u64,
    ) -> Result<()> {
        let mut sges = [ffi::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; 2];
        let mut n = 0;
        for p in parts.iter().filter(|p| p.len > 0) {
            if n == sges.len() {
                return Err(TransportError::Unsupported(
                    "a write of more than two pieces".into(),
                ));
            }
            sges[n] = ffi::ibv_sge {
                addr: p.addr,
                length: p.len,
                lkey: p.lkey,
            };
            n += 1;
        }
        // SAFETY: an all-zero ibv_send_wr is a valid empty request.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = sges.as_mut_ptr();
        wr.num_sge = n as i32;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        match imm {
            Some(v) => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.__bindgen_anon_1.imm_data = v.to_be();
            }
            None => wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        }
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = rkey;
        self.post_send(&mut wr)
    }

    /// A receive without buffers: it only catches a WRITE_WITH_IMM's immediate.
    pub fn post_empty_recv(&self, wr_id: u64) -> Result<()> {
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: as in post_send.
        let rc = unsafe {
            let ops = &mut (*(*self.qp).context).ops;
            match ops.post_recv {
                Some(f) => f(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(errno_err("ibv_post_recv", rc));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once. A failure (never expected for an
        // unattached RC QP) leaks it rather than panicking in drop.
        unsafe { ffi::ibv_destroy_qp(self.qp) };
    }
}
