//! The protocol against an in-memory link: both ends of a connection in one `Link`, with real
//! byte copies for the payload writes, so that every test runs without a NIC.

use super::*;
use crate::verbs::wc;
use crate::{Result, TransportError};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;

mod eager;
mod rendezvous;

/// Both ends of a connection in memory: the sender's FIFO, both CQs, posted receives per
/// queue pair, and real byte copies for the payload writes.
#[derive(Default)]
struct Link {
    fifo: Vec<Cts>,
    send_cq: VecDeque<Completion>,
    recv_cq: VecDeque<Completion>,
    recvs: Vec<VecDeque<u64>>,
    cts_posts: usize,
    writes: Vec<(usize, u32)>,
    /// The receiver's eager ring and the sender's credit word.
    eager: Vec<u8>,
    eager_stride: usize,
    credit: u64,
    credit_posts: usize,
    /// Completions are produced but not delivered (a dead peer / lost acks).
    hold: bool,
    /// Status for the next payload write's completion.
    fail_next_write: Option<u32>,
}

impl Link {
    /// Logs a write with immediate of `bytes` and queues its completions, or a failed one
    /// when asked (`false`: nothing lands).
    fn write_imm(&mut self, qp: usize, imm: u32, bytes: u32, wr_id: u64) -> bool {
        self.writes.push((qp, imm));
        if let Some(status) = self.fail_next_write.take() {
            self.send_cq.push_back(Completion {
                wr_id,
                status,
                vendor_err: 0x81,
                op: Op::Write,
            });
            return false;
        }
        let Some(_) = self.recvs[qp].pop_front() else {
            panic!("write with immediate on qp {qp} without a posted receive (RNR)");
        };
        self.recv_cq.push_back(ok(0, Op::RecvImm { imm, bytes }));
        self.send_cq.push_back(ok(wr_id, Op::Write));
        true
    }
}

struct Tx(Rc<RefCell<Link>>);
struct Rx(Rc<RefCell<Link>>);

fn ok(wr_id: u64, op: Op) -> Completion {
    Completion {
        wr_id,
        status: 0,
        vendor_err: 0,
        op,
    }
}

impl SendWire for Tx {
    fn read_cts(&self, slot: usize) -> Cts {
        self.0.borrow().fifo[slot]
    }
    fn post_write_imm(
        &mut self,
        qp: usize,
        local: Local,
        remote: u64,
        _rkey: u32,
        imm: u32,
        wr_id: u64,
    ) -> Result<()> {
        if self.0.borrow_mut().write_imm(qp, imm, local.len, wr_id) {
            // SAFETY: the tests' buffers outlive the link; addresses come from them.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    local.addr as *const u8,
                    remote as *mut u8,
                    local.len as usize,
                )
            };
        }
        Ok(())
    }
    fn read_credit(&self) -> u64 {
        self.0.borrow().credit
    }
    fn post_eager(
        &mut self,
        qp: usize,
        slot: usize,
        src: Local,
        tag: u32,
        imm: u32,
        wr_id: u64,
    ) -> Result<()> {
        let mut l = self.0.borrow_mut();
        if !l.write_imm(qp, imm, EAGER_HEADER as u32 + src.len, wr_id) {
            return Ok(());
        }
        let off = slot * l.eager_stride;
        assert!(
            src.len as usize + EAGER_HEADER <= l.eager_stride,
            "eager message larger than a slot"
        );
        l.eager[off..off + 4].copy_from_slice(&src.len.to_le_bytes());
        l.eager[off + 4..off + 8].copy_from_slice(&tag.to_le_bytes());
        // SAFETY: the tests' buffers outlive the link.
        let payload =
            unsafe { std::slice::from_raw_parts(src.addr as *const u8, src.len as usize) };
        let at = off + EAGER_HEADER;
        l.eager[at..at + payload.len()].copy_from_slice(payload);
        Ok(())
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let mut l = self.0.borrow_mut();
        if l.hold {
            return Ok(0);
        }
        let n = out.len().min(l.send_cq.len());
        for o in out.iter_mut().take(n) {
            *o = l.send_cq.pop_front().unwrap();
        }
        Ok(n)
    }
}

impl RecvWire for Rx {
    fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()> {
        self.0.borrow_mut().recvs[qp].push_back(wr_id);
        Ok(())
    }
    fn post_cts(&mut self, _qp: usize, slot: usize, cts: &Cts, wr_id: u64) -> Result<()> {
        let mut l = self.0.borrow_mut();
        // Through the wire format, as the NIC would carry it.
        l.fifo[slot] = Cts::decode(&cts.encode());
        l.cts_posts += 1;
        l.recv_cq.push_back(ok(wr_id, Op::Write));
        Ok(())
    }
    fn post_credit(&mut self, released: u64, wr_id: u64) -> Result<()> {
        let mut l = self.0.borrow_mut();
        l.credit = released;
        l.credit_posts += 1;
        l.recv_cq.push_back(ok(wr_id, Op::Write));
        Ok(())
    }
    fn eager_header(&self, slot: usize) -> (u32, u32) {
        let l = self.0.borrow();
        let off = slot * l.eager_stride;
        let w = |i: usize| u32::from_le_bytes(l.eager[i..i + 4].try_into().unwrap());
        (w(off), w(off + 4))
    }
    fn eager_copy(&mut self, slot: usize, dst: u64, len: u32) {
        let l = self.0.borrow();
        let at = slot * l.eager_stride + EAGER_HEADER;
        // SAFETY: the tests' buffers outlive the link; dst holds len bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(l.eager[at..].as_ptr(), dst as *mut u8, len as usize)
        };
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let mut l = self.0.borrow_mut();
        if l.hold {
            return Ok(0);
        }
        let n = out.len().min(l.recv_cq.len());
        for o in out.iter_mut().take(n) {
            *o = l.recv_cq.pop_front().unwrap();
        }
        Ok(n)
    }
}

fn setup(depth: usize, qps: usize) -> (SendProto, RecvProto, Tx, Rx, Rc<RefCell<Link>>) {
    setup_eager(depth, qps, 0)
}

fn setup_eager(
    depth: usize,
    qps: usize,
    eager: usize,
) -> (SendProto, RecvProto, Tx, Rx, Rc<RefCell<Link>>) {
    let cfg = ProtoConfig {
        depth,
        qps,
        timeout: Duration::from_secs(10),
        eager,
    };
    let stride = EAGER_HEADER + eager;
    let link = Rc::new(RefCell::new(Link {
        fifo: vec![Cts::default(); depth],
        recvs: vec![VecDeque::new(); qps],
        eager: vec![0; depth * stride],
        eager_stride: stride,
        ..Link::default()
    }));
    (
        SendProto::new(3, cfg),
        RecvProto::new(5, cfg),
        Tx(link.clone()),
        Rx(link.clone()),
        link,
    )
}

fn local(buf: &[u8]) -> Local {
    Local {
        addr: buf.as_ptr() as u64,
        len: buf.len() as u32,
        lkey: 1,
    }
}

#[test]
fn fifo_entries_round_trip_and_markers_wrap() {
    let c = Cts {
        addr: 0x1234_5678_9abc,
        rkey: 0xdead,
        len: 4096,
        tag: 77,
        marker: marker(41),
    };
    assert_eq!(Cts::decode(&c.encode()), c);
    assert_eq!(marker(41), 42);
    assert_eq!(marker(u32::MAX as u64), 0);
    assert_ne!(
        marker(u32::MAX as u64),
        marker(u32::MAX as u64 - 4),
        "a stale entry never matches"
    );
}
