//! CUDA device buffers.
//!
//! Everything that can be decided or checked without a GPU is always compiled, so the default
//! build tests it: the kernel sources ([`kernels`], checked against the host generators by
//! building them as host C++), the driver probe ([`probe`]), device selection ([`select`]) and
//! the GPUDirect RDMA check and path line ([`gpudirect`]). The driver calls themselves
//! ([`device`], and [`dmabuf`], the dma-buf export for GPUDirect RDMA without nvidia-peermem,
//! and `peer`, CUDA IPC and peer access between the ranks of one host) need feature `cuda` (cudarc, loaded at run time, so the build needs no CUDA toolkit either).

pub mod gpudirect;
pub mod kernels;
pub mod probe;
pub mod select;

#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod dmabuf;
#[cfg(feature = "cuda")]
pub mod offload;
#[cfg(feature = "cuda")]
mod peer;

pub use probe::{probe, CudaLibs, ProbeError};
pub use select::{select_device, DeviceChoice, SelectError, Slot};
