//! The completion queue, polled into the protocol's [`Completion`]s.

use super::errno_err;
use crate::verbs::proto::{Completion, Op};
use crate::Result;
use ibverbs_sys as ffi;

pub struct Cq {
    pub(super) cq: *mut ffi::ibv_cq,
}

impl Cq {
    /// Moves ready completions into `out`.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        // SAFETY: ibv_wc is plain data; zeroed is a valid initial value.
        let mut wcs: [ffi::ibv_wc; 32] = unsafe { std::mem::zeroed() };
        let want = out.len().min(wcs.len()) as i32;
        // SAFETY: cq is valid; wcs has room for `want` entries.
        let n = unsafe {
            let ops = &mut (*(*self.cq).context).ops;
            match ops.poll_cq {
                Some(f) => f(self.cq, want, wcs.as_mut_ptr()),
                None => -libc::ENOSYS,
            }
        };
        if n < 0 {
            return Err(errno_err("polling the completion queue", n));
        }
        for (o, w) in out.iter_mut().zip(&wcs[..n as usize]) {
            let (status, vendor_err) = w.error().unwrap_or((0, 0));
            let op = if status == 0 && w.opcode() == ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
                Op::RecvImm {
                    imm: u32::from_be(w.imm_data),
                    bytes: w.len() as u32,
                }
            } else {
                Op::Write
            };
            *o = Completion {
                wr_id: w.wr_id(),
                status,
                vendor_err,
                op,
            };
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq; its queue pairs are dropped first (field order).
        unsafe { ffi::ibv_destroy_cq(self.cq) };
    }
}
