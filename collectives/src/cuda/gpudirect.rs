//! Can the NIC read and write GPU memory directly (GPUDirect RDMA)? Either the
//! `nvidia-peermem` kernel module (peer memory client, what `ibv_reg_mr` on a device pointer
//! needs) or dma-buf (kernel 5.12+ with `ibv_reg_dmabuf_mr` and a driver that exports
//! dma-bufs, `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`). Without either, device data is staged
//! through pinned host memory. Read from an injectable sysfs root so tests can fake both.
//!
//! The NIC side of the same question (does the verbs stack accept the registration, and how
//! is one region registered) lives in `busbw_transports::verbs::gpudirect`, which every
//! transport's [`Properties::ptr_support`] summarises; this module joins that with what the
//! GPU offers into the one line a run prints.

use busbw_transports::verbs::gpudirect::{peermem_module, PEERMEM_MODULES};
use busbw_transports::{Properties, TransportError};
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
    peermem_module(sysfs).is_some()
}

/// The path device buffers take over a transport with `props`, given whether the GPU exports
/// dma-bufs (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`). dma-buf first, as the transport
/// registers it first when a buffer carries one.
pub fn decide(props: &Properties, gpu_dmabuf: bool) -> DevicePath {
    let p = props.ptr_support;
    if p.dmabuf && gpu_dmabuf {
        DevicePath::DmaBuf
    } else if p.cuda {
        DevicePath::PeerMem
    } else {
        DevicePath::Staged
    }
}

/// The one line a run prints about device buffers: the path, with the NIC that registers
/// device memory (`nic`: the verbs port description) or why GPUDirect is not used. Users
/// read it to learn whether their numbers include the PCIe round trip through host memory.
pub fn path_line(
    props: &Properties,
    nic: Option<&str>,
    gpu_dmabuf: bool,
    sysfs: &Path,
) -> (DevicePath, String) {
    let path = decide(props, gpu_dmabuf);
    let line = match path {
        DevicePath::Staged => staged_line(&why_staged(props, sysfs)),
        p => format!(
            "{}: device memory registered with {}",
            p.describe(),
            nic.unwrap_or(props.name)
        ),
    };
    (path, line)
}

/// The staged line after a transport refused to register device memory, with its reason;
/// `None` for any other error, which is a failure rather than a reason to stage.
pub fn refused_line(e: &TransportError) -> Option<String> {
    match e {
        TransportError::DeviceMemory { transport, missing } => Some(staged_line(&format!(
            "the {transport} transport: {missing}"
        ))),
        _ => None,
    }
}

fn staged_line(why: &str) -> String {
    format!("{}: {why}", DevicePath::Staged.describe())
}

fn why_staged(props: &Properties, sysfs: &Path) -> String {
    if props.name == "multi" {
        return "one registration serves every member of the multi transport, and its shared-memory or TCP member moves bytes with the CPU".into();
    }
    if props.name != "verbs" {
        return format!(
            "the {} transport moves bytes with the CPU (GPUDirect RDMA needs the verbs transport)",
            props.name
        );
    }
    let peermem = if peermem_loaded(sysfs) {
        // Loaded but not advertised: the transport read another sysfs (a container's).
        "the verbs transport did not find a peer-memory module".to_string()
    } else {
        format!(
            "no peer-memory module is loaded ({} not in {})",
            PEERMEM_MODULES.join(" or "),
            sysfs.join("module").display()
        )
    };
    // Staged with dma-buf working on the NIC side means the GPU side lacks it (see decide).
    let dmabuf = if props.ptr_support.dmabuf {
        "the GPU or its driver cannot export dma-bufs"
    } else {
        "the kernel, rdma-core or NIC driver cannot register dma-bufs"
    };
    format!("{peermem} and {dmabuf}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_transports::PtrSupport;

    fn props(name: &'static str, cuda: bool, dmabuf: bool) -> Properties {
        Properties {
            name,
            speed_mbps: None,
            latency_us: None,
            ptr_support: PtrSupport {
                host: true,
                cuda,
                dmabuf,
            },
            max_requests: 8,
        }
    }

    #[test]
    fn the_path_line_names_the_nic_or_why_gpudirect_is_not_used() {
        let root = std::env::temp_dir().join(format!("busbw-gdr-line-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("module/ib_core")).unwrap();
        let nic = Some("mlx5_0:1 GID 3");
        let (p, l) = path_line(&props("verbs", true, false), nic, true, &root);
        assert_eq!(p, DevicePath::PeerMem);
        assert_eq!(
            l,
            "GPUDirect RDMA (nvidia-peermem): device memory registered with mlx5_0:1 GID 3"
        );
        let (p, l) = path_line(&props("verbs", true, true), nic, true, &root);
        assert_eq!(p, DevicePath::DmaBuf);
        assert!(
            l.starts_with("GPUDirect RDMA (dma-buf): device memory registered with mlx5_0"),
            "{l}"
        );
        // dma-buf needs both ends; peermem then still works.
        assert_eq!(
            decide(&props("verbs", true, true), false),
            DevicePath::PeerMem
        );
        let (p, l) = path_line(&props("verbs", false, true), nic, false, &root);
        assert_eq!(p, DevicePath::Staged);
        assert!(
            l.starts_with("staged through pinned host memory: no peer-memory module is loaded (nvidia_peermem or nv_peer_mem")
                && l.ends_with("the GPU or its driver cannot export dma-bufs"),
            "{l}"
        );
        let (_, l) = path_line(&props("verbs", false, false), nic, true, &root);
        assert!(
            l.ends_with("the kernel, rdma-core or NIC driver cannot register dma-bufs"),
            "{l}"
        );
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        let (_, l) = path_line(&props("verbs", false, false), nic, true, &root);
        assert!(l.contains("did not find a peer-memory module"), "{l}");
        let (_, l) = path_line(&props("multi", false, false), None, true, &root);
        assert!(l.contains("its shared-memory or TCP member"), "{l}");
        for name in ["tcp", "shm"] {
            let (p, l) = path_line(&props(name, false, false), None, true, &root);
            assert_eq!(p, DevicePath::Staged);
            assert!(
                l.contains(&format!("the {name} transport moves bytes with the CPU")),
                "{l}"
            );
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_refused_registration_becomes_the_staged_line_and_other_errors_do_not() {
        let e = TransportError::DeviceMemory {
            transport: "verbs",
            missing: "no peer-memory module is loaded".into(),
        };
        assert_eq!(
            refused_line(&e).as_deref(),
            Some("staged through pinned host memory: the verbs transport: no peer-memory module is loaded")
        );
        assert_eq!(refused_line(&TransportError::OutsideRegistration), None);
    }

    #[test]
    fn peermem_is_found_by_either_module_name() {
        let root = std::env::temp_dir().join(format!("busbw-gdr-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("module/ib_core")).unwrap();
        assert!(!peermem_loaded(&root));
        std::fs::create_dir_all(root.join("module/nv_peer_mem")).unwrap();
        assert!(peermem_loaded(&root));
        std::fs::remove_dir_all(root.join("module/nv_peer_mem")).unwrap();
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        assert!(peermem_loaded(&root));
        assert!(DevicePath::Staged.describe().contains("pinned host memory"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
