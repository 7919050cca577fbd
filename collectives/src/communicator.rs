//! The communicator: who we are, how to reach every peer, and how long to wait for them.
//!
//! Connections are made lazily, on the first message to or from a peer, so that a job only
//! opens the connections its algorithms use (a ring needs two per rank, not n-1). Connecting
//! never waits for the peer to accept, and accepting parks connections from other peers until
//! they are asked for, so ranks can set up in any order.

use crate::buffer::HostBuffer;
use crate::error::CommError;
use busbw_transports::{
    Abort, Handle, Identity, Listener, RecvComm, SendComm, Transport, TransportError,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Knobs shared by every algorithm on a communicator.
#[derive(Clone, Debug)]
pub struct CommConfig {
    /// Longest time any wait may go without progress before the rank gives up, naming the
    /// peer it was waiting for.
    pub timeout: Duration,
    /// Raised by the control plane when another rank failed.
    pub abort: Abort,
    /// Pipeline segment size: one segment is on the wire while the previous one is reduced.
    pub segment_bytes: usize,
    /// Segments in flight per direction.
    pub window: usize,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            timeout: Duration::from_secs(300),
            abort: Abort::new(),
            segment_bytes: 1 << 20,
            window: 4,
        }
    }
}

/// A group of ranks that run collectives together.
pub struct Communicator {
    rank: usize,
    size: usize,
    transport: Box<dyn Transport>,
    listener: Box<dyn Listener>,
    handles: Vec<Handle>,
    /// Connections by (peer, channel). Looked up once per collective call, never per message.
    sends: HashMap<(usize, u32), Box<dyn SendComm>>,
    recvs: HashMap<(usize, u32), Box<dyn RecvComm>>,
    /// Node (host) index of every rank, for algorithms that treat intra- and inter-node links
    /// differently (the tree chains the ranks of a node).
    nodes: Vec<usize>,
    seq: u32,
    config: CommConfig,
    /// Receive staging for reductions.
    pub(crate) staging: HostBuffer,
    /// Partial results that must outlive a step (reduce-scatter, reduce).
    pub(crate) scratch: HostBuffer,
    /// This rank's input multiplied by its `mulsum` scalar.
    pub(crate) premul: HostBuffer,
}

impl Communicator {
    /// Build a communicator from this rank's transport and listener and every rank's listen
    /// handle (in rank order, as exchanged through the rendezvous store).
    pub fn new(
        transport: Box<dyn Transport>,
        listener: Box<dyn Listener>,
        handles: Vec<Handle>,
        config: CommConfig,
    ) -> Result<Self, CommError> {
        let size = handles.len();
        let rank = transport.identity().rank as usize;
        if rank >= size {
            return Err(CommError::Invalid(format!(
                "rank {rank} is outside a communicator of {size} ranks"
            )));
        }
        if config.window == 0 || config.segment_bytes == 0 {
            return Err(CommError::Invalid(
                "segment size and window must be positive".into(),
            ));
        }
        let empty = || {
            HostBuffer::new(0).ok_or(CommError::OutOfMemory {
                rank,
                bytes: 0,
                what: "staging",
            })
        };
        Ok(Communicator {
            rank,
            size,
            transport,
            listener,
            handles,
            sends: HashMap::new(),
            recvs: HashMap::new(),
            nodes: vec![0; size],
            seq: 0,
            config,
            staging: empty()?,
            scratch: empty()?,
            premul: empty()?,
        })
    }

    /// Declare which node (host) each rank runs on; ranks with equal values share a node.
    /// Without it every rank is taken to be on one node.
    pub fn set_nodes(&mut self, nodes: Vec<usize>) -> Result<(), CommError> {
        if nodes.len() != self.size {
            return Err(CommError::Invalid(format!(
                "node map has {} entries for {} ranks",
                nodes.len(),
                self.size
            )));
        }
        self.nodes = nodes;
        Ok(())
    }

    /// Node index of every rank (see [`Communicator::set_nodes`]).
    pub fn nodes(&self) -> &[usize] {
        &self.nodes
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    pub fn transport(&self) -> &dyn Transport {
        self.transport.as_ref()
    }

    pub fn identity(&self) -> Identity {
        self.transport.identity()
    }

    /// A fresh tag per collective call: every message of one call carries it, so ranks that
    /// fall out of step are caught by the transport's tag check instead of mixing data.
    pub(crate) fn next_tag(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn check_peer(&self, peer: usize) -> Result<(), CommError> {
        if peer >= self.size || peer == self.rank {
            return Err(CommError::Invalid(format!(
                "rank {}: invalid peer {peer} in a communicator of {}",
                self.rank, self.size
            )));
        }
        Ok(())
    }

    /// Take the send comm to `peer` out of the communicator (connecting if needed); give it
    /// back with [`Communicator::put_send`]. Taking rather than borrowing lets an algorithm
    /// drive a send and a receive comm at once.
    pub(crate) fn take_send(
        &mut self,
        peer: usize,
        channel: u32,
    ) -> Result<Box<dyn SendComm>, CommError> {
        self.check_peer(peer)?;
        if let Some(c) = self.sends.remove(&(peer, channel)) {
            return Ok(c);
        }
        self.transport
            .connect(&self.handles[peer], channel, self.config.timeout)
            .map_err(|cause| CommError::Transport {
                rank: self.rank,
                peer: Some(peer),
                during: format!("connecting to rank {peer}"),
                cause,
            })
    }

    pub(crate) fn put_send(&mut self, peer: usize, channel: u32, comm: Box<dyn SendComm>) {
        self.sends.insert((peer, channel), comm);
    }

    /// Take the receive comm from `peer`, accepting connections until it shows up.
    pub(crate) fn take_recv(
        &mut self,
        peer: usize,
        channel: u32,
    ) -> Result<Box<dyn RecvComm>, CommError> {
        self.check_peer(peer)?;
        let deadline = Instant::now() + self.config.timeout;
        loop {
            if let Some(c) = self.recvs.remove(&(peer, channel)) {
                return Ok(c);
            }
            if self.config.abort.is_raised() {
                return Err(self.aborted());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    peer: Some(peer),
                    secs: self.config.timeout.as_secs_f64(),
                    what: format!("waiting for rank {peer} to connect"),
                });
            }
            // Short slices so that an abort is noticed while waiting.
            match self.listener.accept(left.min(Duration::from_millis(200))) {
                Ok(c) => {
                    let key = (c.peer() as usize, c.channel());
                    if key.0 >= self.size || key.0 == self.rank || self.recvs.contains_key(&key) {
                        return Err(CommError::Invalid(format!(
                            "rank {}: unexpected connection claiming to be rank {} channel {}",
                            self.rank, key.0, key.1
                        )));
                    }
                    self.recvs.insert(key, c);
                }
                Err(TransportError::Timeout { .. }) => {}
                Err(cause) => {
                    return Err(CommError::Transport {
                        rank: self.rank,
                        peer: Some(peer),
                        during: format!("accepting the connection from rank {peer}"),
                        cause,
                    })
                }
            }
        }
    }

    pub(crate) fn put_recv(&mut self, peer: usize, channel: u32, comm: Box<dyn RecvComm>) {
        self.recvs.insert((peer, channel), comm);
    }

    pub(crate) fn aborted(&self) -> CommError {
        CommError::Aborted {
            rank: self.rank,
            reason: self
                .config
                .abort
                .reason()
                .unwrap_or_else(|| "abort requested".into()),
        }
    }

    /// Open the ring connections (to rank+1, from rank-1) now rather than inside the first
    /// timed collective.
    pub fn connect_ring(&mut self) -> Result<(), CommError> {
        if self.size < 2 {
            return Ok(());
        }
        let right = (self.rank + 1) % self.size;
        let left = (self.rank + self.size - 1) % self.size;
        let s = self.take_send(right, 0)?;
        self.put_send(right, 0, s);
        let r = self.take_recv(left, 0)?;
        self.put_recv(left, 0, r);
        Ok(())
    }
}

/// Waiting without burning the core a peer needs: spin briefly (the data is usually a few
/// microseconds away), then yield, then sleep in poll(2) on the comms' readiness descriptors.
/// It also enforces the no-progress timeout and notices the abort flag.
pub(crate) struct Waiter {
    last_progress: Instant,
    idle: u32,
}

/// What a progress loop is blocked on, for poll(2).
#[derive(Clone, Copy)]
pub(crate) enum Readiness {
    Readable(i32),
    Writable(i32),
}

const SPIN: u32 = 16;
const YIELD: u32 = 64;
const POLL_MS: i32 = 5;

impl Waiter {
    pub(crate) fn new() -> Self {
        Waiter {
            last_progress: Instant::now(),
            idle: 0,
        }
    }

    pub(crate) fn progressed(&mut self) {
        if self.idle > 0 {
            self.idle = 0;
            self.last_progress = Instant::now();
        }
    }

    /// Called when a pass made no progress. `blocked_on` lists descriptors that signal
    /// possible progress; `waiting_for` names the peer and what is awaited, for the timeout
    /// message.
    pub(crate) fn idle(
        &mut self,
        comm: &Communicator,
        blocked_on: &[Option<Readiness>],
        waiting_for: impl FnOnce() -> (usize, String),
    ) -> Result<(), CommError> {
        self.idle = self.idle.saturating_add(1);
        if self.idle == 1 {
            self.last_progress = Instant::now();
        }
        if self.idle <= SPIN {
            std::hint::spin_loop();
            return Ok(());
        }
        if self.idle <= YIELD {
            std::thread::yield_now();
            return Ok(());
        }
        if comm.config.abort.is_raised() {
            return Err(comm.aborted());
        }
        if self.last_progress.elapsed() > comm.config.timeout {
            let (peer, what) = waiting_for();
            return Err(CommError::Timeout {
                rank: comm.rank,
                peer: Some(peer),
                secs: comm.config.timeout.as_secs_f64(),
                what,
            });
        }
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 16];
        let mut nfds = 0;
        for r in blocked_on.iter().flatten() {
            if nfds == fds.len() {
                break;
            }
            fds[nfds] = match *r {
                Readiness::Readable(fd) => libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                Readiness::Writable(fd) => libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                },
            };
            nfds += 1;
        }
        if nfds == 0 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            // SAFETY: fds[..nfds] are initialised pollfd structs. Errors (EINTR) just end
            // the sleep early; the caller's next test() reports real socket errors.
            unsafe { libc::poll(fds.as_mut_ptr(), nfds as libc::nfds_t, POLL_MS) };
        }
        Ok(())
    }
}
