//! Buffers that live on a device while the algorithms move their host twins.
//!
//! A rank whose data is in GPU memory but whose transport moves host memory (TCP, shared
//! memory, verbs without GPUDirect) keeps a page-locked host twin of every buffer. The ring,
//! chain and tree engines then run exactly as on host memory, on the twins, with an
//! [`Offload`] doing per segment what the device must: copy our own input out before it is
//! sent, reduce what arrived on the device (`out = mine op staged`) and copy the result out
//! only if it travels on, copy received final data in. Each of these is asynchronous and
//! returns a [`Ticket`]; the engine keeps the network busy meanwhile and releases a send or a
//! staging slot only when its ticket is complete, so copies of one segment overlap the
//! transfer of the next (the pipelining NCCL's proxy does without GPUDirect).
//!
//! The device, not the twin, holds the truth: twins are written only by downloads and
//! received data. A call says its data is on a device with
//! [`MemorySpace::Device`](crate::MemorySpace), and the space module decides what each
//! message costs; algorithms that only move host memory run with every input copied out
//! first and every output copied in afterwards, the boundary staging of a transport-only
//! view.
//!
//! Addresses are host-twin addresses throughout: the offload translates them to the device
//! through its [`Mirror`]s. [`sim`] is a device made of host memory behind a worker thread,
//! which tests the engines' use of tickets without a GPU; the CUDA offload is
//! `cuda::offload` (feature `cuda`).
//!
//! Devices of one host may also reach each other's memory ([`peer`]): a device that offers
//! it ([`Offload::peer_id`]) exports ranges as handles, opens its peers' handles into
//! device addresses, and reduces and copies on those addresses in place; the GPU-to-GPU
//! path of the algorithms (`crate::algorithms::peer`) runs on that alone.

pub mod peer;
pub mod sim;

pub use peer::{PeerHandle, PeerId};

use crate::dtype::{DataType, ReduceOp};
use busbw_transports::{MemRegion, MemoryKind};

/// Completion handle of one asynchronous device operation. Tickets of one offload complete
/// in the order they were issued (one device stream), so a later ticket implies every
/// earlier one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

impl Ticket {
    /// An operation that needed no device work.
    pub const DONE: Ticket = Ticket(0);
}

/// A host range with a device twin: host `host + i` mirrors device address `device + i`.
#[derive(Clone, Copy, Debug)]
pub struct Mirror {
    pub host: *mut u8,
    pub device: u64,
    pub len: usize,
}

// SAFETY: a Mirror is a pair of address ranges; whoever builds one keeps both allocations
// alive while it is in use, like MemRegion.
unsafe impl Send for Mirror {}

impl Mirror {
    /// The device address of host `p`, if `p..p+len` lies inside this mirror.
    pub fn device_of(&self, p: *const u8, len: usize) -> Option<u64> {
        let (start, at) = (self.host as usize, p as usize);
        let end = at.checked_add(len)?;
        (at >= start && end <= start + self.len).then(|| self.device + (at - start) as u64)
    }
}

/// What went wrong on the device, in the driver's words plus what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OffloadError(pub String);

/// One reduction of a received segment: `out = mine op staged` on the device, then, when
/// `avg_over` is set, `out /= avg_over` (the owner's final division for `avg`), then, when
/// `download`, `out` copied to its host twin because it is sent next.
#[derive(Clone, Copy, Debug)]
pub struct Reduce {
    /// Host-twin addresses of the output and the local contribution (equal in place).
    pub out: *mut u8,
    pub mine: *const u8,
    /// Received data in the offload's [`Offload::staging`] memory.
    pub staged: *const u8,
    pub elems: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub avg_over: Option<usize>,
    pub download: bool,
}

/// A device holding a call's buffers (see the module documentation). Methods take host-twin
/// addresses inside [`Offload::mirrors`] (or staging memory where said) and fail with an
/// [`OffloadError`] on a device error or an address outside every mirror.
pub trait Offload: Send {
    /// Host ranges with device twins.
    fn mirrors(&self) -> &[Mirror];
    /// Page-locked host memory of at least `bytes` for receives that are reduced; the
    /// pointer stays valid until the next call asks for more.
    fn staging(&mut self, bytes: usize) -> Result<*mut u8, OffloadError>;
    /// A mirrored scratch buffer of at least `bytes` (partial results an algorithm keeps
    /// between steps); valid until the next call asks for more.
    fn scratch(&mut self, bytes: usize) -> Result<*mut u8, OffloadError>;
    /// A second mirrored scratch buffer of at least `bytes`, apart from [`Offload::scratch`]:
    /// for a call made of other calls (the hierarchical path across hosts), whose
    /// intermediate result must outlive the scratch those calls ask for; valid until the next
    /// call asks for more.
    fn workspace(&mut self, bytes: usize) -> Result<*mut u8, OffloadError> {
        let _ = bytes;
        Err(OffloadError(
            "this device keeps no workspace apart from its scratch".into(),
        ))
    }
    /// Copy device → host twin.
    fn download(&mut self, host: *const u8, len: usize) -> Result<Ticket, OffloadError>;
    /// Copy host twin → device.
    fn upload(&mut self, host: *const u8, len: usize) -> Result<Ticket, OffloadError>;
    /// Device copy between two mirrored ranges, then to `dst`'s twin when `download`.
    fn copy(
        &mut self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        download: bool,
    ) -> Result<Ticket, OffloadError>;
    fn reduce(&mut self, job: Reduce) -> Result<Ticket, OffloadError>;
    /// `mulsum`'s premultiplied input: `src × scalar(rank)` on the device, in a mirrored
    /// buffer of the offload's whose host-twin address is returned. Complete when the next
    /// ticket is (stream order).
    fn premultiply(
        &mut self,
        src: *const u8,
        elems: usize,
        dtype: DataType,
        rank: usize,
    ) -> Result<*const u8, OffloadError>;
    /// Whether `t` (and so every earlier ticket) has completed.
    fn complete(&mut self, t: Ticket) -> Result<bool, OffloadError>;
    /// Wait for everything issued so far.
    fn sync(&mut self) -> Result<(), OffloadError>;

    /// The kind of memory the device addresses are, for a transport that can move device
    /// memory itself (GPUDirect RDMA); `None` when only the twins may be handed to a
    /// transport. Engines try to register the device ranges with this kind and fall back to
    /// the twins when the transport refuses.
    fn device_kind(&self) -> Option<MemoryKind> {
        None
    }

    /// The region a transport registers for device range `addr..addr+len` on the direct
    /// path; a device that exports dma-bufs attaches one (the transport prefers it).
    fn device_region(&mut self, addr: u64, len: usize) -> Result<MemRegion, OffloadError> {
        let kind = self.device_kind().ok_or_else(|| {
            OffloadError("this device cannot hand its memory to a transport".into())
        })?;
        // SAFETY: the engines pass ranges of mirrored device buffers or device staging, which
        // stay allocated while the call's registrations are in use.
        Ok(unsafe { MemRegion::new(addr as usize as *mut u8, len, kind) })
    }

    /// The direct path failed (the transport refused the device ranges, or exporting them
    /// did); `why` says how. A device stops offering its memory after this, so later calls
    /// stage without trying again.
    fn direct_refused(&mut self, why: String) {
        let _ = why;
    }

    /// Device memory of at least `bytes` for received segments that are reduced, when the
    /// transport moves device memory itself; valid until the next call asks for more.
    fn device_staging(&mut self, bytes: usize) -> Result<u64, OffloadError> {
        let _ = bytes;
        Err(OffloadError(
            "this device cannot hand its memory to a transport".into(),
        ))
    }

    /// `out = mine op staged` (and `avg`'s division) on device addresses only: the direct
    /// path's reduction, nothing copied.
    #[allow(clippy::too_many_arguments)]
    fn reduce_on_device(
        &mut self,
        out: u64,
        mine: u64,
        staged: u64,
        elems: usize,
        dtype: DataType,
        op: ReduceOp,
        avg_over: Option<usize>,
    ) -> Result<Ticket, OffloadError>;

    /// `avg`'s last step alone, `out /= n` on device addresses, for a call whose sum a
    /// reduction by another communicator finished (the hierarchical path across hosts).
    fn avg_on_device(
        &mut self,
        out: u64,
        elems: usize,
        dtype: DataType,
        n: usize,
    ) -> Result<Ticket, OffloadError>;

    /// Who this device is for peers that may map its memory; `None` when it offers none
    /// (the default, and a device not told to): its calls stage through the twins. Offering
    /// is the owner's decision, never the algorithms' guess.
    fn peer_id(&mut self) -> Option<PeerId> {
        None
    }

    /// Whether this device can read and write the memory of the device `peer` describes
    /// (`cuDeviceCanAccessPeer`; the same device: yes).
    fn can_access_peer(&mut self, peer: &PeerId) -> Result<bool, OffloadError> {
        let _ = peer;
        Ok(false)
    }

    /// A handle for peers to the device range `addr..addr+len` of this device's memory
    /// (a mirrored buffer, scratch or `mulsum` input).
    fn export_peer(&mut self, addr: u64, len: usize) -> Result<PeerHandle, OffloadError> {
        let _ = (addr, len);
        Err(OffloadError("this device offers no peer memory".into()))
    }

    /// The device address, here, of a peer's exported range. The mapping stays open (and
    /// the peer's memory with it) until [`Offload::close_peers`]; opening one allocation
    /// twice is one mapping. Fails, naming the handle, when the owner has freed the memory.
    fn open_peer(&mut self, handle: &PeerHandle) -> Result<u64, OffloadError> {
        let _ = handle;
        Err(OffloadError("this device offers no peer memory".into()))
    }

    /// Closes every peer mapping (their buffers changed, or the device is done with them).
    fn close_peers(&mut self) {}

    /// Copies `len` bytes between device addresses, either of which may be a peer's opened
    /// range (the copy engines, as NCCL's P2P transport copies).
    fn copy_on_device(&mut self, dst: u64, src: u64, len: usize) -> Result<Ticket, OffloadError> {
        let _ = (dst, src, len);
        Err(OffloadError("this device offers no peer memory".into()))
    }
}

/// The device address of host-twin `p..p+len` in `mirrors`.
pub fn device_of(mirrors: &[Mirror], p: *const u8, len: usize) -> Result<u64, OffloadError> {
    mirrors
        .iter()
        .find_map(|m| m.device_of(p, len))
        .ok_or_else(|| {
            OffloadError(format!(
                "{len} bytes at host {p:p} have no device twin (not inside any mirrored buffer)"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_translate_only_ranges_inside_them() {
        let mut host = [0u8; 64];
        let m = Mirror {
            host: host.as_mut_ptr(),
            device: 0x10_0000,
            len: 64,
        };
        let p = host.as_ptr();
        assert_eq!(m.device_of(p, 64), Some(0x10_0000));
        // SAFETY: offsets inside (or one past) the array.
        let (mid, end) = unsafe { (p.add(16), p.add(64)) };
        assert_eq!(m.device_of(mid, 48), Some(0x10_0010));
        assert_eq!(m.device_of(mid, 49), None, "runs past the end");
        assert_eq!(m.device_of(end, 0), Some(0x10_0040));
        assert_eq!(m.device_of(p.wrapping_sub(1), 2), None, "starts before");
        let e = device_of(&[m], end, 1).unwrap_err().to_string();
        assert!(e.contains("no device twin"), "{e}");
    }
}
