//! Collective algorithms for busbw.
//!
//! Algorithms are plain functions over a [`Communicator`] (gloo's habit): no class tree, no
//! hidden state beyond the connections and a staging buffer. They are written against the
//! transport trait only, so the same ring runs over TCP, shared memory or RDMA, and over the
//! in-process transport in unit tests.
//!
//! Validation data ([`verifiable`]) is designed so that float reductions are exact in any
//! order: results are compared bit for bit, whatever algorithm produced them.

pub mod algo;
pub mod buffer;
pub mod chain;
pub mod communicator;
pub mod cuda;
mod data;
pub mod direct;
pub mod dtype;
pub mod element;
mod engine;
mod error;
pub mod offload;
pub mod p2p;
pub mod peers;
pub mod rd;
pub mod ring;
pub mod space;
pub mod testing;
pub mod tree;
pub mod verifiable;
mod workspace;

pub use algo::{all_reduce_with, calibrate, Algo, CostModel};
pub use buffer::HostBuffer;
pub use chain::{broadcast, reduce};
pub use communicator::{CommConfig, Communicator, SMALL_CHANNEL};
pub use data::Data;
pub use direct::direct_all_reduce;
pub use dtype::{DataType, ParseNameError, ReduceOp};
pub use error::CommError;
pub use offload::{Mirror, Offload, OffloadError, Ticket};
pub use p2p::{alltoall, alltoallv, gather, hypercube, scatter, sendrecv};
pub use peers::{neighbours, PeerBook};
pub use rd::{all_reduce_values, barrier, rd_all_reduce};
pub use ring::{all_gather, all_reduce, reduce_scatter};
pub use space::MemorySpace;
pub use tree::tree_all_reduce;
