//! What the protocol asks of verbs: work requests to post and completions to consume, as
//! traits, so that the state machines run against real queue pairs and against the tests'
//! in-memory link alike.

use super::Cts;
use crate::Result;

/// What a completion was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// One of our RDMA writes (payload, or a FIFO entry) was acknowledged.
    Write,
    /// A peer's WRITE_WITH_IMM landed: `imm` and the bytes written.
    RecvImm { imm: u32, bytes: u32 },
}

/// A work completion, reduced to what the protocol needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// `ibv_wc_status`; 0 is success (`op` is then meaningful).
    pub status: u32,
    pub vendor_err: u32,
    pub op: Op,
}

/// Local memory of a write: address, length, lkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// The verbs operations a sender needs (a queue pair set, its FIFO and its CQ).
pub trait SendWire {
    /// The current contents of FIFO slot `slot`.
    fn read_cts(&self, slot: usize) -> Cts;
    /// `RDMA_WRITE_WITH_IMM` of `local` to `remote_addr`/`rkey` on queue pair `qp`, signaled.
    fn post_write_imm(
        &mut self,
        qp: usize,
        local: Local,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
        wr_id: u64,
    ) -> Result<()>;
    /// Completions ready now, into `out`; returns how many.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize>;
    /// The receiver's released count as it last wrote it into the credit word.
    fn read_credit(&self) -> u64;
    /// Writes an eager header (`src.len`, `tag`, from staging slot `slot`) followed by
    /// `src` into the receiver's eager ring slot `slot` with `imm`, signaled: one write that
    /// gathers both, so the payload is never copied on this side.
    fn post_eager(
        &mut self,
        qp: usize,
        slot: usize,
        src: Local,
        tag: u32,
        imm: u32,
        wr_id: u64,
    ) -> Result<()>;
}

/// The verbs operations a receiver needs.
pub trait RecvWire {
    /// A zero-length receive on queue pair `qp` (it catches one immediate).
    fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()>;
    /// RDMA-writes `cts` into the sender's FIFO slot `slot` (signaled, `wr_id`).
    fn post_cts(&mut self, qp: usize, slot: usize, cts: &Cts, wr_id: u64) -> Result<()>;
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize>;
    /// RDMA-writes `released` into the sender's credit word (signaled, `wr_id`).
    fn post_credit(&mut self, released: u64, wr_id: u64) -> Result<()>;
    /// Length and tag from the header of eager ring slot `slot`.
    fn eager_header(&self, slot: usize) -> (u32, u32);
    /// Copies `len` payload bytes of eager ring slot `slot` to `dst` (host memory).
    fn eager_copy(&mut self, slot: usize, dst: u64, len: u32);
}
