//! Collective algorithms for busbw.
//!
//! Algorithms are plain functions over a [`Communicator`] (gloo's habit): no class tree, no
//! hidden state beyond the connections and a staging buffer. They are written against the
//! transport trait only, so the same ring runs over TCP, shared memory or RDMA, and over the
//! in-process transport in unit tests.
//!
//! Validation data ([`verifiable`]) is designed so that float reductions are exact in any
//! order: results are compared bit for bit, whatever algorithm produced them.

pub mod algorithms;
pub mod buffer;
pub mod cuda;
pub mod dtype;
pub mod element;
mod engine;
mod error;
pub mod link;
pub mod nccl;
pub mod offload;
pub mod select;
pub mod testing;
pub mod verifiable;

pub use algorithms::chain::{broadcast, reduce};
pub use algorithms::direct::direct_all_reduce;
pub use algorithms::doubling::{all_reduce_values, barrier, doubling_all_reduce};
pub use algorithms::grouped::{alltoall, alltoallv, gather, hypercube, scatter, sendrecv};
pub use algorithms::ring::{all_gather, all_reduce, reduce_scatter};
pub use algorithms::tree::tree_all_reduce;
pub use algorithms::{connect_ring, neighbours};
pub use buffer::HostBuffer;
pub use dtype::{DataType, ParseNameError, ReduceOp};
pub use engine::data::Data;
pub use engine::space::MemorySpace;
pub use error::{CommError, LookupError};
pub use link::peers::PeerBook;
pub use link::{CommConfig, Communicator, SMALL_CHANNEL};
pub use offload::{Mirror, Offload, OffloadError, Ticket};
pub use select::{all_reduce_with, calibrate, Algo, CostModel};
