//! The only code that calls libibverbs: owned wrappers over raw device, protection domain,
//! completion queue, queue pair and memory region handles from `ibverbs::ffi`.
//!
//! Raw bindings rather than the `ibverbs` 0.9 safe API because that API fixes the port to 1,
//! cannot set traffic class or service level, has no RDMA WRITE (with immediate), and its
//! lifetimes (`QueuePair<'res>` borrowing a `Context`) make a comm that owns its queue pairs
//! self-referential. Drop order is the safety contract: queue pairs before their completion
//! queue, memory regions and everything else before the protection domain and the context,
//! which live in the `Arc<Device>` every comm holds.

use super::gpudirect::RegPath;
use super::handshake::PortAddr;
use super::proto::{Completion, Local, Op};
use crate::{MemRegion, Registration, Result, TransportError};
use ibverbs_sys as ffi;
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::ptr;
use std::sync::{Mutex, OnceLock};

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

/// An open device with one protection domain and the chosen port.
pub struct Device {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    pub port: u8,
    pub gid_index: u8,
    pub addr: PortAddr,
    pub max_qp_wr: u32,
    mrs: Mutex<MrCache>,
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

    /// NCCL's dma-buf probe: register nothing from an invalid descriptor and return the errno
    /// (see [`super::gpudirect::dmabuf_from_probe`]); `None` when libibverbs lacks the call.
    pub fn dmabuf_probe(&self) -> Option<i32> {
        let f = reg_dmabuf_mr()?;
        // SAFETY: pd is valid; fd -1 makes the kernel reject the call before touching memory.
        let mr = unsafe { f(self.pd, 0, 0, 0, -1, 0) };
        if mr.is_null() {
            return Some(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        // SAFETY: a region the call above returned; deregistered once.
        unsafe { ffi::ibv_dereg_mr(mr) };
        Some(0)
    }

    /// Registers `region` by `path`, reusing a cached registration of the same range. The key
    /// carries both keys (lkey high, rkey low) so the data path needs no lookup.
    pub fn register(&self, region: MemRegion, path: RegPath) -> Result<Registration> {
        if region.is_empty() {
            // Nothing to read or write: zero-length messages carry no SGE.
            return Ok(Registration { region, key: 0 });
        }
        let mut cache = self.mrs.lock().unwrap_or_else(|p| p.into_inner());
        let k = (region.ptr() as usize, region.len());
        if let Some(e) = cache.map.get_mut(&k) {
            e.refs += 1;
            return Ok(Registration {
                region,
                key: e.mr.key(),
            });
        }
        // A freed buffer whose address range was reused must not keep its old pages pinned
        // behind a stale registration: drop unused entries that overlap the new range.
        cache.evict_overlapping(k);
        // A device registration that fails leaves staging as the way out: say so in the
        // error callers already handle that way.
        let device = |what: String| TransportError::DeviceMemory {
            transport: "verbs",
            missing: what,
        };
        let mr = match path {
            RegPath::Host => Mr::new(self.pd, region.ptr(), region.len())?,
            RegPath::PeerMem => Mr::reg(self.pd, region.ptr(), region.len()).map_err(|e| {
                device(format!(
                    "ibv_reg_mr of {} bytes of device memory through the peer-memory module failed: {e}",
                    region.len()
                ))
            })?,
            RegPath::DmaBuf(d) => Mr::dmabuf(self.pd, &region, d)
                .map_err(|e| device(format!("registering its dma-buf failed: {e}")))?,
        };
        let key = mr.key();
        cache.map.insert(k, MrEntry { mr, refs: 1 });
        cache.trim();
        Ok(Registration { region, key })
    }

    /// Releases a registration; the memory region stays cached for the next collective call
    /// on the same buffers (registration costs milliseconds on large buffers).
    pub fn release(&self, r: &Registration) {
        let mut cache = self.mrs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = cache
            .map
            .get_mut(&(r.region.ptr() as usize, r.region.len()))
        {
            e.refs = e.refs.saturating_sub(1);
        }
        cache.trim();
    }

    /// A registered, zeroed buffer owned by a comm (FIFO, FIFO staging).
    pub fn buffer(&self, len: usize) -> Result<OwnedMr> {
        let mut mem = vec![0u8; len.max(64)].into_boxed_slice();
        let mr = Mr::new(self.pd, mem.as_mut_ptr(), mem.len())?;
        Ok(OwnedMr { mr, mem })
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

/// QP parameters both ends settled on.
pub struct PathParams {
    pub mtu: u8,
    pub traffic_class: u8,
    pub service_level: u8,
    pub ack_timeout: u8,
    pub retry_cnt: u8,
}

pub struct Qp {
    qp: *mut ffi::ibv_qp,
}

impl Qp {
    pub fn num(&self) -> u32 {
        // SAFETY: qp is valid for self's lifetime.
        unsafe { (*self.qp).qp_num }
    }

    fn modify(
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

pub struct Cq {
    cq: *mut ffi::ibv_cq,
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

pub struct Mr {
    mr: *mut ffi::ibv_mr,
}

const ACCESS: ffi::ibv_access_flags = ffi::ibv_access_flags(
    ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
);

impl Mr {
    fn new(pd: *mut ffi::ibv_pd, ptr: *mut u8, len: usize) -> Result<Mr> {
        Mr::reg(pd, ptr, len).map_err(|e| {
            TransportError::Unsupported(format!(
                "registering {len} bytes for RDMA: {e} (raise `ulimit -l`, the locked-memory limit)"
            ))
        })
    }

    /// `ibv_reg_mr`, with the bare OS error: host memory's failure is usually the
    /// locked-memory limit, device memory's is not, so callers word it.
    fn reg(pd: *mut ffi::ibv_pd, ptr: *mut u8, len: usize) -> io::Result<Mr> {
        // SAFETY: pd is valid; the caller keeps ptr..ptr+len allocated while registered.
        let mr = unsafe { ffi::ibv_reg_mr(pd, ptr as *mut _, len.max(1), ACCESS.0 as i32) };
        if mr.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Mr { mr })
    }

    /// Registers `region` from dma-buf `d` with the region's own address as the I/O virtual
    /// address, so work requests name device memory exactly as they name host memory.
    fn dmabuf(pd: *mut ffi::ibv_pd, region: &MemRegion, d: crate::DmaBuf) -> Result<Mr> {
        let f = reg_dmabuf_mr().ok_or_else(|| {
            TransportError::Unsupported("this libibverbs has no ibv_reg_dmabuf_mr".into())
        })?;
        let len = region.len();
        // SAFETY: pd is valid; the caller keeps the dma-buf's memory allocated while
        // registered and fd open for the call (MemRegion::with_dmabuf's contract).
        let mr = unsafe {
            f(
                pd,
                d.offset,
                len,
                region.ptr() as u64,
                d.fd,
                ACCESS.0 as i32,
            )
        };
        if mr.is_null() {
            return Err(TransportError::Unsupported(format!(
                "ibv_reg_dmabuf_mr of {len} bytes at offset {} of dma-buf fd {}: {}",
                d.offset,
                d.fd,
                io::Error::last_os_error()
            )));
        }
        Ok(Mr { mr })
    }
    pub fn lkey(&self) -> u32 {
        // SAFETY: mr is valid for self's lifetime.
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
    fn key(&self) -> u64 {
        ((self.lkey() as u64) << 32) | self.rkey() as u64
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

// SAFETY: the handles are only used through &self methods that libibverbs makes thread-safe,
// and each comm (the only user of its Qp/Cq) is used by one thread at a time.
unsafe impl Send for Mr {}
unsafe impl Send for Qp {}
unsafe impl Send for Cq {}

/// A registered buffer and its memory (dropped after the registration: field order).
pub struct OwnedMr {
    pub mr: Mr,
    pub mem: Box<[u8]>,
}

impl OwnedMr {
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
}

struct MrEntry {
    mr: Mr,
    refs: usize,
}

/// Registrations keyed by exact range, kept after release up to [`MrCache::KEEP`] unused
/// entries.
#[derive(Default)]
struct MrCache {
    map: HashMap<(usize, usize), MrEntry>,
}

impl MrCache {
    const KEEP: usize = 64;

    fn evict_overlapping(&mut self, (p, l): (usize, usize)) {
        self.map
            .retain(|&(q, m), e| e.refs > 0 || q + m <= p || p + l <= q);
    }

    fn trim(&mut self) {
        let idle = self.map.values().filter(|e| e.refs == 0).count();
        if idle > Self::KEEP {
            self.map.retain(|_, e| e.refs > 0);
        }
    }
}
