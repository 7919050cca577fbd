//! What one small call costs the CPU outside the wire: rank 0 of a 2-rank communicator whose
//! peer answers instantly (every send completes when posted, every receive when posted, with
//! the length asked for), so a call is only the algorithm's bookkeeping: schedule, post, test,
//! reduce, hand back. At 8 bytes over shared memory that bookkeeping sits on the critical path
//! of every hop, and unlike a ping-pong it does not depend on a peer's scheduling: its
//! instruction count is the same on a loaded machine (`bench/scripts/engine-instructions.sh`
//! counts it with callgrind).
//!
//! `cargo bench -p busbw-collectives --bench engine` prints ns per call (median of rounds)
//! for each algorithm at 8 bytes; `BUSBW_ENGINE_CALLS=N` sets calls per round.

use busbw_collectives::{
    broadcast, doubling_all_reduce, sendrecv, tree_all_reduce, CommConfig, Communicator, Data,
    DataType, ReduceOp,
};
use busbw_transports::{
    Handle, Identity, Listener, Properties, RecvComm, Registration, RequestId, Result, SendComm,
    Transport,
};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// The peer's side of every connection, reduced to "done".
struct Echo {
    id: Identity,
}

/// Requests complete when posted; the id only has to be distinct among those in flight.
struct EchoComm {
    peer: u32,
    channel: u32,
    next: u32,
    lens: [usize; 64],
}

impl EchoComm {
    fn post(&mut self, len: usize) -> RequestId {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        self.lens[id as usize % 64] = len;
        RequestId(id)
    }
    fn done(&self, r: RequestId) -> Option<usize> {
        Some(self.lens[r.0 as usize % 64])
    }
}

impl SendComm for EchoComm {
    unsafe fn isend(
        &mut self,
        _reg: &Registration,
        _ptr: *const u8,
        len: usize,
        _tag: u32,
    ) -> Result<RequestId> {
        Ok(self.post(len))
    }
    fn test(&mut self, r: RequestId) -> Result<Option<usize>> {
        Ok(self.done(r))
    }
    fn peer(&self) -> u32 {
        self.peer
    }
}

impl RecvComm for EchoComm {
    unsafe fn irecv(
        &mut self,
        _reg: &Registration,
        _ptr: *mut u8,
        len: usize,
        _tag: u32,
    ) -> Result<RequestId> {
        Ok(self.post(len))
    }
    fn test(&mut self, r: RequestId) -> Result<Option<usize>> {
        Ok(self.done(r))
    }
    fn peer(&self) -> u32 {
        self.peer
    }
    fn channel(&self) -> u32 {
        self.channel
    }
}

fn comm(peer: u32, channel: u32) -> EchoComm {
    EchoComm {
        peer,
        channel,
        next: 0,
        lens: [0; 64],
    }
}

/// Hands out the peer's connections channel by channel, as a peer connecting on demand would.
struct EchoListener {
    peer: u32,
    next_channel: u32,
}

impl Listener for EchoListener {
    fn accept(&mut self, _timeout: Duration) -> Result<Box<dyn RecvComm>> {
        self.next_channel += 1;
        Ok(Box::new(comm(self.peer, self.next_channel - 1)))
    }
}

impl Transport for Echo {
    fn properties(&self) -> Properties {
        Properties::host_only("echo", 64)
    }
    fn listen(&self) -> Result<(Handle, Box<dyn Listener>)> {
        Ok((
            Handle(vec![self.id.rank as u8]),
            Box::new(EchoListener {
                peer: 1 - self.id.rank,
                next_channel: 0,
            }),
        ))
    }
    fn identity(&self) -> Identity {
        self.id
    }
    fn connect(
        &self,
        handle: &Handle,
        channel: u32,
        _timeout: Duration,
    ) -> Result<Box<dyn SendComm>> {
        Ok(Box::new(comm(u32::from(handle.0[0]), channel)))
    }
}

type Call =
    fn(&mut Communicator, &mut [u8]) -> std::result::Result<(), busbw_collectives::CommError>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let calls: usize = std::env::var("BUSBW_ENGINE_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let t = Echo {
        id: Identity::new(0x5eed, 0),
    };
    let (h0, l) = t.listen().expect("echo listen");
    let handles = vec![h0, Handle(vec![1])];
    let mut c = Communicator::new(Box::new(t), l, handles, CommConfig::default())
        .expect("echo communicator");
    let cases: [(&str, Call); 5] = [
        ("ring", |c, b| {
            busbw_collectives::all_reduce(c, Data::in_place(b), 2, DataType::Float32, ReduceOp::Sum)
        }),
        ("rd", |c, b| {
            doubling_all_reduce(c, Data::in_place(b), 2, DataType::Float32, ReduceOp::Sum)
        }),
        ("tree", |c, b| {
            tree_all_reduce(c, Data::in_place(b), 2, DataType::Float32, ReduceOp::Sum)
        }),
        ("broadcast", |c, b| {
            broadcast(c, Data::in_place(b), 2, DataType::Float32, 0)
        }),
        ("sendrecv", |c, b| {
            sendrecv(c, Data::in_place(b), 2, DataType::Float32)
        }),
    ];
    let mut buf = vec![0u8; 8];
    println!("# 8-byte calls on rank 0 of 2, peer answering instantly; {calls} calls a round");
    println!("{:>10} {:>10}", "algorithm", "ns/call");
    for (name, f) in cases {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        for _ in 0..1000 {
            f(&mut c, &mut buf).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let rounds: Vec<f64> = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                for _ in 0..calls {
                    f(&mut c, black_box(&mut buf)).unwrap_or_else(|e| panic!("{name}: {e}"));
                }
                t0.elapsed().as_nanos() as f64 / calls as f64
            })
            .collect();
        println!("{name:>10} {:>10.1}", median(rounds));
    }
}
