//! Collective algorithms for busbw.
//!
//! Algorithms are plain functions over a [`Communicator`] (gloo's habit): no class tree, no
//! hidden state beyond the connections and a staging buffer. They are written against the
//! transport trait only, so the same ring runs over TCP, shared memory or RDMA, and over the
//! in-process transport in unit tests.
//!
//! Validation data ([`verifiable`]) is designed so that float reductions are exact in any
//! order: results are compared bit for bit, whatever algorithm produced them.

pub mod buffer;
pub mod communicator;
pub mod dtype;
pub mod element;
mod error;
pub mod ring;
pub mod testing;
pub mod verifiable;

pub use buffer::HostBuffer;
pub use communicator::{CommConfig, Communicator};
pub use dtype::{DataType, ParseNameError, ReduceOp};
pub use error::CommError;
pub use ring::{all_reduce, all_reduce_values, barrier, Data};
