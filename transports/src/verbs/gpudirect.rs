//! GPUDirect RDMA on the NIC side: may this node's verbs stack register CUDA device memory,
//! and how should one region be registered?
//!
//! Two kernel paths exist. With a peer-memory client (`nvidia_peermem`, or the older
//! out-of-tree `nv_peer_mem`) loaded, plain `ibv_reg_mr` on a device virtual address works,
//! because the client pins the GPU pages for the RDMA core. Without one, Linux 5.12+ and
//! rdma-core 34+ accept a dma-buf exported by the CUDA driver (`ibv_reg_dmabuf_mr`); whether
//! the kernel and NIC driver take it is only known by asking, as NCCL does, with an invalid
//! file descriptor: `EOPNOTSUPP`/`EPROTONOSUPPORT` mean "no", anything else (`EBADF`) means
//! the call reached a kernel that would have looked at the descriptor.
//!
//! Everything here is pure over a sysfs root and the probe's errno, so the decisions are
//! tested without a NIC or a GPU; `ib` only supplies the errno.

use crate::{DmaBuf, MemRegion, MemoryKind, TransportError};
use std::path::Path;

/// Peer-memory modules, newest first: either makes `ibv_reg_mr` accept device pointers.
pub const PEERMEM_MODULES: [&str; 2] = ["nvidia_peermem", "nv_peer_mem"];

/// The loaded peer-memory module, if any, from `<sysfs>/module/<name>` (present exactly while
/// the module is loaded, also in containers that mount the host's `/sys`).
pub fn peermem_module(sysfs: &Path) -> Option<&'static str> {
    PEERMEM_MODULES
        .into_iter()
        .find(|m| sysfs.join("module").join(m).is_dir())
}

/// What `ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0)` answered: `None` when this libibverbs has
/// no such function, else the errno it failed with (`0` if it unexpectedly succeeded).
pub fn dmabuf_from_probe(errno: Option<i32>) -> Result<(), String> {
    match errno {
        None => Err("this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later needed)".into()),
        Some(e) if e == libc::EOPNOTSUPP || e == libc::EPROTONOSUPPORT => Err(
            "the kernel or the NIC driver cannot register dma-bufs (Linux 5.12 or later and a driver with dma-buf support needed)"
                .into(),
        ),
        Some(_) => Ok(()),
    }
}

/// What this node's verbs stack can do with device memory, decided once per transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDirect {
    /// The loaded peer-memory module.
    pub peermem: Option<&'static str>,
    /// Whether dma-bufs can be registered, or why not.
    pub dmabuf: Result<(), String>,
}

impl GpuDirect {
    /// `sysfs`: the sysfs root (`/sys`); `probe`: as for [`dmabuf_from_probe`].
    pub fn detect(sysfs: &Path, probe: Option<i32>) -> GpuDirect {
        GpuDirect {
            peermem: peermem_module(sysfs),
            dmabuf: dmabuf_from_probe(probe),
        }
    }

    /// Neither path: what a build without a NIC reports.
    pub fn none(why: &str) -> GpuDirect {
        GpuDirect {
            peermem: None,
            dmabuf: Err(why.to_string()),
        }
    }
}

/// How one region is registered with the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegPath {
    /// `ibv_reg_mr` on host memory, as always.
    Host,
    /// `ibv_reg_mr` on a device address, which the peer-memory module resolves.
    PeerMem,
    /// `ibv_reg_dmabuf_mr` with the region's dma-buf.
    DmaBuf(DmaBuf),
}

/// Picks the registration of `region`, or refuses device memory with the reason both paths
/// are closed. dma-buf is preferred when the region carries one (as NCCL does): it needs no
/// out-of-tree module and its pages stay valid for as long as the dma-buf is held.
pub fn reg_path(region: &MemRegion, gd: &GpuDirect) -> Result<RegPath, TransportError> {
    if region.kind() == MemoryKind::Host {
        return Ok(RegPath::Host);
    }
    if let (Some(d), Ok(())) = (region.dmabuf(), &gd.dmabuf) {
        return Ok(RegPath::DmaBuf(d));
    }
    if gd.peermem.is_some() {
        return Ok(RegPath::PeerMem);
    }
    let dmabuf = match &gd.dmabuf {
        Err(why) => why.clone(),
        Ok(()) => "the buffer came without a dma-buf to register (the GPU or its driver cannot export one)".into(),
    };
    Err(TransportError::DeviceMemory {
        transport: "verbs",
        missing: format!(
            "no peer-memory module is loaded ({} not in /sys/module) and {dmabuf}",
            PEERMEM_MODULES.join(" or ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::super::sysfs::fake;
    use super::*;

    fn region(kind: MemoryKind, dmabuf: Option<DmaBuf>) -> MemRegion {
        // SAFETY: never dereferenced; only the kind and the dma-buf are looked at.
        let r = unsafe { MemRegion::new(0x7000_0000 as *mut u8, 4096, kind) };
        match dmabuf {
            Some(d) => unsafe { r.with_dmabuf(d) },
            None => r,
        }
    }

    #[test]
    fn peermem_is_found_under_either_module_name() {
        let root = fake::tempdir("peermem");
        std::fs::create_dir_all(root.join("module/ib_core")).unwrap();
        assert_eq!(peermem_module(&root), None);
        std::fs::create_dir_all(root.join("module/nv_peer_mem")).unwrap();
        assert_eq!(peermem_module(&root), Some("nv_peer_mem"));
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        assert_eq!(peermem_module(&root), Some("nvidia_peermem"));
        // A file of that name is not a loaded module.
        let other = fake::tempdir("peermem-file");
        std::fs::create_dir_all(other.join("module")).unwrap();
        std::fs::write(other.join("module/nvidia_peermem"), "").unwrap();
        assert_eq!(peermem_module(&other), None);
        let _ = std::fs::remove_dir_all(root);
        let _ = std::fs::remove_dir_all(other);
    }

    #[test]
    fn the_dmabuf_probe_reads_like_nccls() {
        assert_eq!(dmabuf_from_probe(Some(libc::EBADF)), Ok(()));
        assert_eq!(dmabuf_from_probe(Some(0)), Ok(()));
        for e in [libc::EOPNOTSUPP, libc::EPROTONOSUPPORT] {
            let why = dmabuf_from_probe(Some(e)).unwrap_err();
            assert!(why.contains("kernel or the NIC driver"), "{why}");
        }
        let why = dmabuf_from_probe(None).unwrap_err();
        assert!(why.contains("rdma-core 34"), "{why}");
    }

    #[test]
    fn registration_takes_dmabuf_then_peermem_then_refuses() {
        let root = fake::tempdir("regpath");
        let fd = DmaBuf { fd: 9, offset: 512 };
        let cuda = MemoryKind::Cuda { device: 0 };
        let none = GpuDirect::detect(&root, Some(libc::EOPNOTSUPP));
        let dmabuf_only = GpuDirect::detect(&root, Some(libc::EBADF));
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        let both = GpuDirect::detect(&root, Some(libc::EBADF));
        let peermem_only = GpuDirect::detect(&root, None);
        assert_eq!(peermem_only.peermem, Some("nvidia_peermem"));

        // Host memory keeps its path whatever the node offers.
        for gd in [&none, &dmabuf_only, &both, &peermem_only] {
            assert_eq!(
                reg_path(&region(MemoryKind::Host, None), gd).unwrap(),
                RegPath::Host
            );
        }
        let path = |r: &MemRegion, gd: &GpuDirect| reg_path(r, gd).map_err(|e| e.to_string());
        assert_eq!(
            path(&region(cuda, Some(fd)), &both),
            Ok(RegPath::DmaBuf(fd))
        );
        assert_eq!(path(&region(cuda, None), &both), Ok(RegPath::PeerMem));
        assert_eq!(
            path(&region(cuda, Some(fd)), &dmabuf_only),
            Ok(RegPath::DmaBuf(fd))
        );
        assert_eq!(
            path(&region(cuda, Some(fd)), &peermem_only),
            Ok(RegPath::PeerMem)
        );

        let e = reg_path(&region(cuda, None), &dmabuf_only).unwrap_err();
        assert!(
            matches!(
                e,
                TransportError::DeviceMemory {
                    transport: "verbs",
                    ..
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("nvidia_peermem") && msg.contains("without a dma-buf"),
            "{msg}"
        );
        assert!(msg.contains("pinned host memory"), "{msg}");
        let msg = path(&region(cuda, Some(fd)), &none).unwrap_err();
        assert!(msg.contains("cannot register dma-bufs"), "{msg}");
        let msg = path(&region(cuda, None), &GpuDirect::none("built without verbs")).unwrap_err();
        assert!(msg.contains("built without verbs"), "{msg}");
        let _ = std::fs::remove_dir_all(root);
    }
}
