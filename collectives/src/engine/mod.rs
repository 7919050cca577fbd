//! One executor for every algorithm that moves segments between peers.
//!
//! An algorithm is a [`Schedule`]: which connections it uses, and, one message at a time, what
//! each connection carries, when a message may go (a forward waits for the receive it
//! forwards; a broadcast's receive into a buffer waits for the send that read it), where a
//! received message lands and what becomes of it (kept as it landed, or reduced into an
//! output). [`run`] does everything else, once: it opens the connections it lacks and borrows
//! them in place (nothing to hand back on any exit path), allocates the staging slots and
//! registers memory, posts within the in-flight window, tests completions in order, checks
//! lengths, runs reductions in the call's memory [space](crate::engine::space) (host, a device staged
//! through pinned twins, or a device the transport moves directly), waits and sleeps without
//! burning a core, enforces the timeout, and words every error with the peer it names.
//!
//! Messages on one connection complete in posting order and both ends walk the same schedule,
//! so every receive is posted for exactly the message that will fill it; the per-call tag
//! catches ranks that disagree.

pub(crate) mod data;
mod exec;
mod links;
pub mod space;
pub(crate) mod workspace;

use smallvec::SmallVec;

pub(crate) use exec::run;

/// Which way a connection carries data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    Send,
    Recv,
}

/// One connection a schedule uses. The executor opens every send connection before any receive
/// connection (connecting never waits for the peer, accepting waits for the peer's connect,
/// which every peer makes in its own send phase), so ranks cannot wait on each other in a
/// cycle while they set up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Link {
    pub peer: usize,
    pub channel: u32,
    pub dir: Dir,
    /// Messages this connection carries in the call.
    pub messages: usize,
    /// The pool of staging slots its receives may land in (slots of the schedule's
    /// [`Schedule::slot_elems`] each): a pool has as many slots as the in-flight window, or as
    /// its connections have messages if fewer. Connections share a pool only when the schedule
    /// never has their receives in flight together.
    pub staged: Option<u8>,
    /// Added to error and timeout messages after the call's tag (", tree 1").
    pub label: &'static str,
}

/// What a posted receive carries back to the schedule: two indices of its choosing (a ring's
/// step and segment, a tree's chunk).
pub(crate) type Key = (usize, usize);

/// A message to send: `len` elements at `from`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Out<T> {
    pub from: *const T,
    pub len: usize,
    /// Read from memory the call did not write (the rank's own input): on a staged device
    /// the twin must first be fetched from the device.
    pub own: bool,
}

/// Where a receive lands: `len` elements at `into`, or in a staging slot when `None`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct In<T> {
    pub into: Option<*mut T>,
    pub len: usize,
    /// Handed back with [`Schedule::arrived`] and [`Schedule::processed`].
    pub key: Key,
}

/// What becomes of a completed receive.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arrival<T> {
    /// It landed where it belongs (in a staged space the device is given it).
    Landed,
    /// `out = mine op staged` (`staged op mine` when `theirs_first`), then `avg`'s division
    /// by `avg_over` when set.
    Reduce {
        out: *mut T,
        mine: *const T,
        avg_over: Option<usize>,
        /// `out` is sent next: a staged device copies it back to its twin.
        travels_on: bool,
        /// The peer's data is the left operand: pairs that reduce each other's data keep one
        /// order, so both get the same bits where an operator is not commutative bit for bit
        /// (min/max of +0 and -0, NaN payloads). Host memory only, in place only.
        theirs_first: bool,
    },
}

/// How far each connection has got: messages completed (sends) or received and processed
/// (receives), indexed like [`Schedule::links`].
pub(crate) struct Progress<'a> {
    done: &'a [usize],
}

impl Progress<'_> {
    pub fn done(&self, link: usize) -> usize {
        self.done[link]
    }
}

/// Memory a transport must have registered: `(pointer, elements)`.
pub(crate) type Regions<T> = SmallVec<[(*const T, usize); 4]>;

/// An algorithm as data and a few callbacks; see the module documentation.
pub(crate) trait Schedule<T> {
    /// The collective's name, for messages.
    fn name(&self) -> &'static str;
    fn links(&self) -> &[Link];
    /// Elements per staging slot (0 when nothing is staged).
    fn slot_elems(&self) -> usize;
    fn regions(&self) -> Regions<T>;
    /// The next message on send connection `link`, or `None` while it must wait. Called in
    /// message order; a `Some` is the schedule's promise that the memory stays as it is until the
    /// send completes.
    fn next_send(&mut self, link: usize, at: &Progress) -> Option<Out<T>>;
    /// The next receive on connection `link`, or `None` while its target is still being
    /// read. Called in message order.
    fn next_recv(&mut self, link: usize, at: &Progress) -> Option<In<T>>;
    /// Whether receive `key` on `link`, once complete, may be processed yet: a reduction into
    /// memory that an in-flight send still reads (a transport may read it until the send
    /// completes: RDMA does, TCP does while its socket is full) must wait for that send. The
    /// receive is still tested meanwhile, since the send may complete only once the peer's
    /// message is taken. Default: at once.
    fn may_process(&self, link: usize, key: Key, at: &Progress) -> bool {
        let _ = (link, key, at);
        true
    }
    /// Receive `key` on `link` completed with the expected length.
    fn arrived(&mut self, link: usize, key: Key) -> Arrival<T>;
    /// Receive `key` on `link` is processed (reduced, on the device too): sends it enabled
    /// may go. Default: nothing to release.
    fn processed(&mut self, link: usize, key: Key) {
        let _ = (link, key);
    }
}
