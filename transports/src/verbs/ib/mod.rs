//! The only code that calls libibverbs: owned wrappers over raw device, protection domain,
//! completion queue, queue pair and memory region handles from `ibverbs::ffi`.
//!
//! Raw bindings rather than the `ibverbs` 0.9 safe API because that API fixes the port to 1,
//! cannot set traffic class or service level, has no RDMA WRITE (with immediate), and its
//! lifetimes (`QueuePair<'res>` borrowing a `Context`) make a comm that owns its queue pairs
//! self-referential. Drop order is the safety contract: queue pairs before their completion
//! queue, memory regions and everything else before the protection domain and the context,
//! which live in the `Arc<Device>` every comm holds.
//!
//! One module per kind of handle: `device` (context, protection domain, port, and the queues
//! made on it), `qp` (connecting and posting), `cq` (polling) and `mr` (registrations, the
//! buffers comms own, and the cache that keeps registrations from call to call).

mod cq;
mod device;
mod mr;
mod qp;

pub use cq::Cq;
pub use device::Device;
pub use mr::OwnedMr;
pub use qp::{PathParams, Qp};

use mr::Mr;

use crate::TransportError;
use ibverbs_sys as ffi;
use std::io;
use std::sync::OnceLock;

/// `ibv_reg_dmabuf_mr`, looked up at run time rather than linked: it exists only since
/// rdma-core 34 (IBVERBS_1.12), and linking it would stop the binary from starting at all on
/// hosts with an older libibverbs, where host-memory RDMA works fine.
type RegDmabufMr =
    unsafe extern "C" fn(*mut ffi::ibv_pd, u64, usize, u64, i32, i32) -> *mut ffi::ibv_mr;

fn reg_dmabuf_mr() -> Option<RegDmabufMr> {
    static F: OnceLock<Option<RegDmabufMr>> = OnceLock::new();
    *F.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name; libibverbs is already loaded (linked).
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ibv_reg_dmabuf_mr".as_ptr()) };
        // SAFETY: the symbol, when present, has this C signature (verbs.h).
        (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, RegDmabufMr>(f) })
    })
}

fn os_err(what: &str) -> TransportError {
    TransportError::Unsupported(format!("{what}: {}", io::Error::last_os_error()))
}

fn errno_err(what: &str, rc: i32) -> TransportError {
    TransportError::Unsupported(format!(
        "{what}: {}",
        io::Error::from_raw_os_error(rc.abs())
    ))
}

/// Names of the devices libibverbs sees (for `doctor` and fail-fast checks). Uses the safe
/// API: this is exactly what it offers.
pub fn device_names() -> io::Result<Vec<String>> {
    let list = ibverbs::devices()?;
    Ok(list
        .iter()
        .map(|d| {
            d.name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect())
}

// SAFETY: the handles are only used through &self methods that libibverbs makes thread-safe,
// and each comm (the only user of its Qp/Cq) is used by one thread at a time.
unsafe impl Send for Mr {}
unsafe impl Send for Qp {}
unsafe impl Send for Cq {}
