//! The communicator: who we are, how to reach every peer, and how long to wait for them.
//!
//! Connections are made lazily, on the first message to or from a peer, so that a job only
//! opens the connections its algorithms use (a ring needs two per rank, not n-1). Connecting
//! never waits for the peer to accept, and accepting parks connections from other peers until
//! they are asked for, so ranks can set up in any order.

use crate::error::CommError;
use crate::link::nodes::NodeMap;
use crate::link::peers::PeerBook;
use busbw_transports::{Abort, Identity, Listener, RecvComm, SendComm, Transport, TransportError};
use std::any::{Any, TypeId};
use std::time::{Duration, Instant};

/// Channels a communicator keeps connections for: independent ordered streams between the
/// same two ranks, so pipelines that run at once never interleave their messages (0 by
/// default, 1 and 2 for a second and third pipeline), and [`SMALL_CHANNEL`].
pub const MAX_CHANNELS: u32 = 4;

/// The channel of small pairwise exchanges (small all-reduces, barriers, the harness's timing
/// reductions). Where the
/// transport can ([`busbw_transports::Transport::duplex`]: TCP), its connection carries both
/// directions, so a message's acknowledgement rides on the reply instead of a segment of its
/// own: an 8-byte exchange on TCP loopback takes about a quarter less. Bulk stays on one-way
/// connections: two directions of bulk on one socket serialise a rank's sending with what
/// arrives for it, and fresh shaped links collapsed (BENCHMARKS.md).
pub const SMALL_CHANNEL: u32 = 3;

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
    /// How long a rank with nothing to do polls its connections in a tight loop before it
    /// starts yielding the core ([`CommConfig::for_cores`]).
    pub spin: Duration,
    /// How long it then polls between `sched_yield` calls before it sleeps in poll(2).
    pub yield_for: Duration,
    /// Threads that share one large reduction (at least `element::PAR_MIN_BYTES`). More
    /// than one only where cores would otherwise idle: when every rank of the node already
    /// has a core busy, extra threads just take turns with the peers they wait for.
    pub reduce_threads: usize,
    /// Whether ranks of one host may map each other's buffers: set where the job moves local
    /// data through shared memory anyway, never where a transport was asked for by name to be
    /// measured between local ranks (`--transport tcp`).
    pub map_peers: bool,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            timeout: Duration::from_secs(300),
            abort: Abort::new(),
            segment_bytes: 1 << 20,
            window: 4,
            spin: Duration::from_micros(50),
            yield_for: Duration::from_millis(2),
            reduce_threads: 1,
            map_peers: false,
        }
    }
}

impl CommConfig {
    /// Waiting budgets for `local_ranks` ranks sharing `cores` cores. With a core each, a
    /// waiting rank spins: the data is usually microseconds away and a sleep costs a wake-up
    /// of about as much (TCP loopback at 8 bytes is then a few microseconds, not tens).
    /// Oversubscribed (more ranks than cores, the laptop case), spinning steals the core the
    /// peer needs: yield at the first clock reading, so the rank that shares our core runs,
    /// and sleep soon. Even a microsecond of spinning costs a call a microsecond or more per
    /// wait: 4 ranks on 2 cores (Intel Xeon family 6 model 167), AllReduce at 64 B took
    /// 2.7-4.9 us with 1 us of spin and 1.8 us with none, 512 B 3.4-5.5 us against 2.1.
    /// Cores left over (more cores than ranks) go to the reductions: `cores / local_ranks`
    /// threads each.
    pub fn for_cores(mut self, local_ranks: usize, cores: usize) -> Self {
        if local_ranks > cores.max(1) {
            self.spin = Duration::ZERO;
            self.yield_for = Duration::from_micros(500);
        }
        self.reduce_threads = (cores / local_ranks.max(1)).max(1);
        self
    }
}

/// A group of ranks that run collectives together.
pub struct Communicator {
    rank: usize,
    size: usize,
    transport: Box<dyn Transport>,
    listener: Box<dyn Listener>,
    /// Every peer's handle, looked up on a peer's first connection.
    peers: Box<dyn PeerBook>,
    /// Connections by `peer × MAX_CHANNELS + channel`: an index, not a hash, because a
    /// latency-bound collective looks them up on every call.
    sends: Vec<Option<Box<dyn SendComm>>>,
    recvs: Vec<Option<Box<dyn RecvComm>>>,
    /// Per peer, whether the transport reaches it over two-way connections, once asked (the
    /// answer parses the peer's handle, which a small call must not do every time).
    duplex_to: Vec<Option<bool>>,
    /// Node (host) index of every rank, for algorithms that treat intra- and inter-node links
    /// differently.
    nodes: Vec<usize>,
    /// The same as segments, which an algorithm can look a rank's neighbours up in on every
    /// call without a walk over the ranks.
    node_map: NodeMap,
    seq: u32,
    config: CommConfig,
    /// What the layers above keep for as long as the communicator lives (the engine's
    /// staging and bookkeeping, an algorithm's mappings of peers' buffers), one value per
    /// type: the link layer holds it for them without knowing what it is.
    kept: [Option<(TypeId, Box<dyn Any + Send>)>; KEPT_SLOTS],
}

/// How many values the layers above may keep with a communicator ([`Kept`]).
pub const KEPT_SLOTS: usize = 5;

/// A value a layer above keeps with each communicator for as long as it lives
/// ([`Communicator::kept`]).
pub trait Kept: Any + Send + Default {
    /// Its slot, below [`KEPT_SLOTS`], chosen where the type is defined; no two kept types
    /// share one.
    const SLOT: usize;
}

impl Communicator {
    /// Build a communicator from this rank's transport and listener and the book of its
    /// peers' listen handles: a `Vec<Handle>` in rank order when they were exchanged up
    /// front, or a book that fetches each from the rendezvous store on first use.
    pub fn new(
        transport: Box<dyn Transport>,
        listener: Box<dyn Listener>,
        peers: impl PeerBook + 'static,
        config: CommConfig,
    ) -> Result<Self, CommError> {
        let size = peers.size();
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
        Ok(Communicator {
            rank,
            size,
            transport,
            listener,
            peers: Box::new(peers),
            sends: (0..size * MAX_CHANNELS as usize).map(|_| None).collect(),
            recvs: (0..size * MAX_CHANNELS as usize).map(|_| None).collect(),
            duplex_to: vec![None; size],
            nodes: vec![0; size],
            node_map: NodeMap::uniform(size, size),
            seq: 0,
            config,
            kept: Default::default(),
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
        self.node_map = NodeMap::from_labels(&nodes);
        self.nodes = nodes;
        Ok(())
    }

    /// [`Communicator::set_nodes`] from the map the bootstrap published.
    pub fn set_node_map(&mut self, map: NodeMap) -> Result<(), CommError> {
        if map.len() != self.size {
            return Err(CommError::Invalid(format!(
                "node map has {} ranks for {} ranks",
                map.len(),
                self.size
            )));
        }
        self.nodes = map.to_vec();
        self.node_map = map;
        Ok(())
    }

    /// Node index of every rank (see [`Communicator::set_nodes`]).
    pub fn nodes(&self) -> &[usize] {
        &self.nodes
    }

    /// [`Communicator::nodes`] as segments, for lookups that should not walk every rank.
    pub fn node_map(&self) -> &NodeMap {
        &self.node_map
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

    /// The value of type `T` kept with this communicator, if one was made.
    pub fn peek<T: Kept>(&self) -> Option<&T> {
        match &self.kept[T::SLOT] {
            Some((id, v)) if *id == TypeId::of::<T>() => v.downcast_ref::<T>(),
            _ => None,
        }
    }

    /// The value of type `T` that a layer above keeps with this communicator, made by
    /// `T::default()` on first use. A type per purpose (the engine's workspace, the direct
    /// AllReduce's mappings), so nothing here names an algorithm; a slot per type, so a
    /// small call's lookup is an index and one type check.
    #[inline]
    pub fn kept<T: Kept>(&mut self) -> &mut T {
        let (id, v) =
            self.kept[T::SLOT].get_or_insert_with(|| (TypeId::of::<T>(), Box::new(T::default())));
        // Two kept types given one slot: a programming error, caught by any test that uses
        // both.
        assert!(
            *id == TypeId::of::<T>(),
            "two kept types share the communicator's slot {}",
            T::SLOT
        );
        let any: *mut dyn Any = &mut **v;
        // SAFETY: the slot holds a `Box<T>`: it was filed with `T`'s id, just compared (the
        // cast drops the vtable that `downcast_mut` would call only to compare it again).
        unsafe { &mut *(any as *mut T) }
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

    /// Slot of (peer, channel) in `sends`/`recvs`.
    fn slot(&self, peer: usize, channel: u32) -> Result<usize, CommError> {
        if peer >= self.size || peer == self.rank {
            return Err(CommError::Invalid(format!(
                "rank {}: invalid peer {peer} in a communicator of {}",
                self.rank, self.size
            )));
        }
        if channel >= MAX_CHANNELS {
            return Err(CommError::Invalid(format!(
                "rank {}: channel {channel} is beyond the {MAX_CHANNELS} a communicator keeps",
                self.rank
            )));
        }
        Ok(index(peer, channel))
    }

    /// Opens the send comm to `peer` on `channel` if it is not open yet. A call borrows its
    /// comms in place ([`Communicator::send_to`]) rather than taking them out, so there is
    /// nothing to hand back on any exit path.
    pub(crate) fn connect_send(&mut self, peer: usize, channel: u32) -> Result<(), CommError> {
        let slot = self.slot(peer, channel)?;
        if self.sends[slot].is_some() {
            return Ok(());
        }
        if self.duplex(peer, channel)? {
            return self.open_duplex(peer, channel);
        }
        let c = self.dial(peer, channel, |t, h, ch, timeout| t.connect(h, ch, timeout))?;
        self.sends[slot] = Some(c);
        Ok(())
    }

    /// Opens the receive comm from `peer` on `channel` if it is not open yet, accepting
    /// connections until it shows up.
    pub(crate) fn accept_recv(&mut self, peer: usize, channel: u32) -> Result<(), CommError> {
        let slot = self.slot(peer, channel)?;
        if self.recvs[slot].is_some() {
            return Ok(());
        }
        if self.duplex(peer, channel)? {
            return self.open_duplex(peer, channel);
        }
        self.accept_until(peer, channel)
    }

    /// The channel for small exchanges with `peer`: [`SMALL_CHANNEL`] where the transport
    /// carries both directions on one connection to it, else 0 (the ring's, which a separate
    /// channel would only duplicate). Both ranks of a pair get the same answer.
    pub(crate) fn small_channel(&mut self, peer: usize) -> Result<u32, CommError> {
        Ok(if self.duplex(peer, SMALL_CHANNEL)? {
            SMALL_CHANNEL
        } else {
            0
        })
    }

    /// Whether `channel` to `peer` is one connection for both directions: the
    /// [`SMALL_CHANNEL`], where the transport can ([`Transport::duplex`]).
    fn duplex(&mut self, peer: usize, channel: u32) -> Result<bool, CommError> {
        if channel != SMALL_CHANNEL || peer == self.rank {
            return Ok(false);
        }
        if let Some(&Some(known)) = self.duplex_to.get(peer) {
            return Ok(known);
        }
        let rank = self.rank;
        let handle =
            self.peers
                .handle(peer)
                .map_err(|cause| CommError::Lookup { rank, peer, cause })?;
        let two_way = self.transport.duplex(handle);
        if let Some(d) = self.duplex_to.get_mut(peer) {
            *d = Some(two_way);
        }
        Ok(two_way)
    }

    /// Opens the two-way connection with `peer` on `channel`, both comms at once: the lower
    /// rank of the pair connects, the higher one accepts. Whichever direction a rank needs
    /// first, its peer needs the matching one in the same call, so the higher rank's wait is
    /// answered; and as only higher ranks wait, on lower ones, the waits cannot form a cycle.
    fn open_duplex(&mut self, peer: usize, channel: u32) -> Result<(), CommError> {
        let slot = self.slot(peer, channel)?;
        if self.rank < peer {
            let (s, r) = self.dial(peer, channel, |t, h, ch, timeout| {
                t.connect_duplex(h, ch, timeout)
            })?;
            self.sends[slot] = Some(s);
            self.recvs[slot] = Some(r);
            return Ok(());
        }
        self.accept_until(peer, channel)?;
        if self.sends[slot].is_none() {
            return Err(CommError::Invalid(format!(
                "rank {}: rank {peer} opened a one-way connection on channel {channel} where \
                 one for both directions was expected (ranks built or configured differently?)",
                self.rank
            )));
        }
        Ok(())
    }

    /// `open` on the transport towards `peer`'s handle, with errors that name both ranks.
    fn dial<C>(
        &mut self,
        peer: usize,
        channel: u32,
        open: impl FnOnce(
            &dyn Transport,
            &busbw_transports::Handle,
            u32,
            Duration,
        ) -> Result<C, TransportError>,
    ) -> Result<C, CommError> {
        let rank = self.rank;
        let handle =
            self.peers
                .handle(peer)
                .map_err(|cause| CommError::Lookup { rank, peer, cause })?;
        open(&*self.transport, handle, channel, self.config.timeout).map_err(|cause| {
            CommError::Transport {
                rank,
                peer: Some(peer),
                during: format!("connecting to rank {peer}"),
                cause,
            }
        })
    }

    /// Accepts connections, filing each under its peer and channel (with the sending half of
    /// a two-way one), until the one from `peer` on `channel` is in.
    fn accept_until(&mut self, peer: usize, channel: u32) -> Result<(), CommError> {
        let slot = self.slot(peer, channel)?;
        let deadline = Instant::now() + self.config.timeout;
        loop {
            if self.recvs[slot].is_some() {
                return Ok(());
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
                Ok(mut c) => {
                    let (from, ch) = (c.peer() as usize, c.channel());
                    let reverse = c.take_reverse();
                    match self.slot(from, ch) {
                        Ok(s)
                            if self.recvs[s].is_none()
                                && (reverse.is_none() || self.sends[s].is_none()) =>
                        {
                            self.recvs[s] = Some(c);
                            if reverse.is_some() {
                                self.sends[s] = reverse;
                            }
                        }
                        _ => {
                            return Err(CommError::Invalid(format!(
                                "rank {}: unexpected connection claiming to be rank {from} channel {ch}",
                                self.rank
                            )))
                        }
                    }
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

    /// The send comm [`Communicator::connect_send`] opened, if it did.
    pub(crate) fn send_to(
        &mut self,
        peer: usize,
        channel: u32,
    ) -> Option<&mut (dyn SendComm + 'static)> {
        self.sends.get_mut(index(peer, channel))?.as_deref_mut()
    }

    /// The receive comm [`Communicator::accept_recv`] opened, if it did.
    pub(crate) fn recv_from(
        &mut self,
        peer: usize,
        channel: u32,
    ) -> Option<&mut (dyn RecvComm + 'static)> {
        self.recvs.get_mut(index(peer, channel))?.as_deref_mut()
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
}

/// Where (peer, channel) sits in `sends`/`recvs` (unchecked: [`Communicator::slot`] checks).
fn index(peer: usize, channel: u32) -> usize {
    peer * MAX_CHANNELS as usize + channel as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_transports::inproc::InprocTransport;

    #[derive(Default)]
    struct Counter(u32);
    impl Kept for Counter {
        const SLOT: usize = KEPT_SLOTS - 1;
    }

    #[derive(Default)]
    struct Squatter;
    impl Kept for Squatter {
        const SLOT: usize = KEPT_SLOTS - 1;
    }

    fn comm() -> Communicator {
        let t = InprocTransport::new(Identity::new(7, 0));
        let (h, l) = t.listen().unwrap();
        Communicator::new(Box::new(t), l, vec![h], CommConfig::default()).unwrap()
    }

    #[test]
    fn a_kept_value_lives_with_the_communicator_and_a_shared_slot_is_refused() {
        let mut c = comm();
        assert!(
            c.peek::<Counter>().is_none(),
            "nothing is made before it is asked for"
        );
        c.kept::<Counter>().0 += 2;
        c.kept::<Counter>().0 += 3;
        assert_eq!(c.peek::<Counter>().map(|k| k.0), Some(5));
        assert!(c.peek::<Squatter>().is_none());
        let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.kept::<Squatter>();
        }));
        assert!(
            taken.is_err(),
            "a second type in an occupied slot must not read its value"
        );
    }

    #[test]
    fn oversubscribed_ranks_yield_at_once_and_ranks_with_a_core_spin() {
        let d = CommConfig::default();
        let over = CommConfig::default().for_cores(4, 2);
        assert_eq!(over.spin, Duration::ZERO);
        assert!(over.yield_for < d.yield_for, "{over:?}");
        assert_eq!(over.reduce_threads, 1);
        let own = CommConfig::default().for_cores(2, 2);
        assert_eq!((own.spin, own.yield_for), (d.spin, d.yield_for));
        assert!(own.spin > Duration::ZERO);
        assert_eq!(CommConfig::default().for_cores(2, 8).reduce_threads, 4);
    }
}
