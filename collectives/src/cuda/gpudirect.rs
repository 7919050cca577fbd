//! Can the NIC read and write GPU memory directly (GPUDirect RDMA)? Either the
//! `nvidia-peermem` kernel module (peer memory client, what `ibv_reg_mr` on a device pointer
//! needs) or dma-buf (kernel 5.12+ with `ibv_reg_dmabuf_mr` and a driver that exports
//! dma-bufs, `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`). Without either, device data is staged
//! through pinned host memory. Read from an injectable sysfs root so tests can fake both.

use std::path::Path;

/// How device memory reaches a transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevicePath {
    /// Registered with the NIC through nvidia-peermem.
    PeerMem,
    /// Registered with the NIC as a dma-buf.
    DmaBuf,
    /// Copied through pinned host memory in pipelined chunks.
    Staged,
}

impl DevicePath {
    /// The words printed in the header comment and the docs.
    pub fn describe(self) -> &'static str {
        match self {
            DevicePath::PeerMem => "GPUDirect RDMA (nvidia-peermem)",
            DevicePath::DmaBuf => "GPUDirect RDMA (dma-buf)",
            DevicePath::Staged => "staged through pinned host memory",
        }
    }
}

/// Whether the nvidia-peermem (or the older nv_peer_mem) module is loaded.
pub fn peermem_loaded(sysfs: &Path) -> bool {
    ["nvidia_peermem", "nv_peer_mem"]
        .iter()
        .any(|m| sysfs.join("module").join(m).is_dir())
}

/// The path for one transport: `rdma` says whether the transport is RDMA verbs (TCP and
/// shared memory always stage), `dmabuf` whether the device reports dma-buf support.
pub fn choose(rdma: bool, sysfs: &Path, dmabuf: bool) -> DevicePath {
    if !rdma {
        DevicePath::Staged
    } else if peermem_loaded(sysfs) {
        DevicePath::PeerMem
    } else if dmabuf {
        DevicePath::DmaBuf
    } else {
        DevicePath::Staged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_uses_peermem_then_dmabuf_and_everything_else_stages() {
        let root = std::env::temp_dir().join(format!("busbw-gdr-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("module/ib_core")).unwrap();
        assert_eq!(choose(true, &root, false), DevicePath::Staged);
        assert_eq!(choose(true, &root, true), DevicePath::DmaBuf);
        assert_eq!(choose(false, &root, true), DevicePath::Staged);
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        assert_eq!(choose(true, &root, true), DevicePath::PeerMem);
        assert_eq!(choose(false, &root, true), DevicePath::Staged);
        assert!(DevicePath::Staged.describe().contains("pinned host memory"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
