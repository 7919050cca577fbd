//! The opened device: its context, protection domain and chosen port, and the completion
//! queues and queue pairs made on it. What it registers lives in [`super::mr`].

use super::mr::MrCache;
use super::{errno_err, os_err, Cq, Qp};
use crate::verbs::handshake::PortAddr;
use crate::{Result, TransportError};
use ibverbs_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::ptr;
use std::sync::Mutex;

/// An open device with one protection domain and the chosen port.
pub struct Device {
    ctx: *mut ffi::ibv_context,
    pub(super) pd: *mut ffi::ibv_pd,
    pub port: u8,
    pub gid_index: u8,
    pub addr: PortAddr,
    pub max_qp_wr: u32,
    pub(super) mrs: Mutex<MrCache>,
}

// SAFETY: verbs objects may be used from any thread (libibverbs locks internally); the cache
// is behind a mutex and the raw handles are never freed while a comm holds the Arc.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    /// Opens `name`, checks `port` is active and reads GID `gid_index`.
    pub fn open(name: &str, port: u8, gid_index: u32) -> Result<Device> {
        let mut n = 0i32;
        // SAFETY: plain FFI; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(os_err(
                "libibverbs cannot list RDMA devices (ibv_get_device_list)",
            ));
        }
        let mut ctx = ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: i < n entries of the list returned above.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is a valid device; the name is a NUL-terminated string it owns.
            let dname = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) };
            if dname.to_bytes() == name.as_bytes() {
                // SAFETY: dev is valid until the list is freed; the context outlives it.
                ctx = unsafe { ffi::ibv_open_device(dev) };
                break;
            }
        }
        // SAFETY: list came from ibv_get_device_list.
        unsafe { ffi::ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(TransportError::Unsupported(format!(
                "RDMA device {name} is in sysfs but libibverbs cannot open it ({}); in a container, \
                 /dev/infiniband must be mounted",
                io::Error::last_os_error()
            )));
        }
        let close = |e| {
            // SAFETY: ctx was opened above and nothing else refers to it yet.
            unsafe { ffi::ibv_close_device(ctx) };
            e
        };
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: ctx is open; attr is a valid out-parameter of the right type.
        let rc = unsafe { ffi::ibv_query_port(ctx, port, &mut attr as *mut _ as *mut _) };
        if rc != 0 {
            return Err(close(errno_err(
                &format!("querying {name} port {port}"),
                rc,
            )));
        }
        if attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(close(TransportError::Unsupported(format!(
                "{name} port {port} is not active (state {})",
                attr.state
            ))));
        }
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: as above.
        let rc = unsafe { ffi::ibv_query_gid(ctx, port, gid_index as i32, &mut gid) };
        if rc != 0 {
            return Err(close(errno_err(
                &format!("reading GID {gid_index} of {name}:{port}"),
                rc,
            )));
        }
        let mut dattr = ffi::ibv_device_attr::default();
        // SAFETY: as above.
        let rc = unsafe { ffi::ibv_query_device(ctx, &mut dattr) };
        if rc != 0 {
            return Err(close(errno_err(&format!("querying {name}"), rc)));
        }
        // SAFETY: ctx is open.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(close(os_err(&format!(
                "allocating a protection domain on {name}"
            ))));
        }
        Ok(Device {
            ctx,
            pd,
            port,
            gid_index: gid_index as u8,
            addr: PortAddr {
                // SAFETY: reading the raw bytes of a plain-data union.
                gid: unsafe { gid.raw },
                lid: attr.lid,
                mtu: attr.active_mtu as u8,
                roce: attr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET as u8,
            },
            max_qp_wr: dattr.max_qp_wr.max(1) as u32,
            mrs: Mutex::new(MrCache::default()),
        })
    }

    pub fn cq(&self, entries: usize) -> Result<Cq> {
        // SAFETY: ctx is open; no channel, vector 0.
        let cq = unsafe {
            ffi::ibv_create_cq(
                self.ctx,
                entries as i32,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(os_err("creating a completion queue"));
        }
        Ok(Cq { cq })
    }

    /// An RC queue pair on `cq`, moved to INIT with remote-write access.
    pub fn qp(&self, cq: &Cq, send_wr: u32, recv_wr: u32) -> Result<Qp> {
        let cap = |n: u32| n.min(self.max_qp_wr);
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.cq,
            recv_cq: cq.cq,
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: cap(send_wr),
                max_recv_wr: cap(recv_wr),
                // An eager write from device memory gathers its header and payload.
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: pd and cq are valid; init is fully initialised.
        let qp = unsafe { ffi::ibv_create_qp(self.pd, &mut init) };
        if qp.is_null() {
            return Err(os_err("creating a queue pair"));
        }
        let q = Qp { qp };
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.port,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE)
                .0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        q.modify(&mut attr, mask, "INIT")?;
        Ok(q)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let cache = std::mem::take(&mut *self.mrs.lock().unwrap_or_else(|p| p.into_inner()));
        drop(cache);
        // SAFETY: every comm (queue pairs, CQs, MRs) holds an Arc to this device and has been
        // dropped; the cache's regions were just deregistered.
        unsafe {
            ffi::ibv_dealloc_pd(self.pd);
            ffi::ibv_close_device(self.ctx);
        }
    }
}
