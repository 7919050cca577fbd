//! The executor: one progress loop for every schedule.

use super::links::Conns;
use super::{Arrival, Dir, Key, Link, Progress, Schedule};
use crate::dtype::ReduceOp;
use crate::element::{Element, PAR_MIN_BYTES};
use crate::engine::data::Regs;
use crate::engine::space::{Failed, MemorySpace, Space};
use crate::engine::workspace::{reduce_pool, staging};
use crate::error::CommError;
use crate::link::{Communicator, Waiter};
use crate::offload::Ticket;
use busbw_transports::{RequestId, Sleep};

/// Run `schedule` to completion over the communicator's connections, in the memory `space` the
/// call's data lives in.
///
/// # Safety
/// Every pointer the schedule hands out must be valid for the message it describes, and the schedule
/// must not let two in-flight requests, or a request and a reduction, touch the same memory.
pub(crate) unsafe fn run<T: Element, P: Schedule<T>>(
    comm: &mut Communicator,
    schedule: &mut P,
    op: ReduceOp,
    space: &mut MemorySpace,
) -> Result<(), CommError> {
    let tag = comm.next_tag();
    let mut scratch = comm.kept::<Kept>().0.take().unwrap_or_default();
    let result = run_with(comm, schedule, op, tag, space, &mut scratch);
    scratch.clear();
    comm.kept::<Kept>().0 = Some(scratch);
    space.finish(comm.rank(), result, schedule.name())
}

/// The executor's bookkeeping as the communicator keeps it between calls (boxed: a call
/// takes it out and puts it back, which should move a pointer, not the vectors).
#[derive(Default)]
struct Kept(Option<Box<Scratch>>);

impl crate::link::Kept for Kept {
    const SLOT: usize = 0;
}

/// The executor's bookkeeping, kept by the communicator between calls: once warm a call
/// allocates nothing and copies no inline arrays (at 8 bytes either costs as much as the
/// transfers). A pointer a call leaves in it is never read by a later call (see `Send`).
#[derive(Default)]
pub(crate) struct Scratch {
    links: Vec<Link>,
    /// Staging pools by id: first slot and slots.
    pools: Vec<(usize, usize)>,
    /// Per link; the vector only grows, so each state's queues keep their capacity.
    states: Vec<State>,
    done: Vec<usize>,
    regs: Regs,
    on: Vec<Sleep>,
}

// SAFETY: the raw pointers the states and registrations hold are only used during the call
// that put them there (each call resets the states and releases the registrations before it
// returns); what travels with the communicator between calls is never dereferenced.
unsafe impl Send for Scratch {}

impl Scratch {
    /// Drops what a call left, keeping the capacity. The link states are reset when the next
    /// call starts, not here: after a call that ended well their queues are empty already.
    fn clear(&mut self) {
        self.links.clear();
        self.pools.clear();
        self.done.clear();
        self.on.clear();
    }
}

unsafe fn run_with<T: Element, P: Schedule<T>>(
    comm: &mut Communicator,
    schedule: &mut P,
    op: ReduceOp,
    tag: u32,
    space: &mut MemorySpace,
    scratch: &mut Scratch,
) -> Result<(), CommError> {
    let Scratch {
        links,
        pools,
        states,
        done,
        regs,
        on,
    } = scratch;
    links.extend_from_slice(schedule.links());
    let window = comm.config().window;
    for l in links.iter().filter(|l| l.dir == Dir::Recv) {
        if let Some(id) = l.staged {
            let id = usize::from(id);
            if pools.len() <= id {
                pools.resize(id + 1, (0, 0));
            }
            pools[id].1 = pools[id].1.max(l.messages.min(window));
        }
    }
    let mut slots = 0;
    for p in pools.iter_mut() {
        p.0 = slots;
        slots += p.1;
    }
    let slot = schedule.slot_elems();
    // (At least one slot's worth, so that the staging region is never empty.)
    let stage_elems = slots.max(1) * slot;
    // The pool splits only big reductions; smaller calls skip its reference count.
    let pool = if slot * std::mem::size_of::<T>() >= PAR_MIN_BYTES {
        reduce_pool(comm)
    } else {
        None
    };
    let (mut space, stage) = space.resolve(
        comm,
        &schedule.regions(),
        stage_elems,
        pool,
        |comm| staging::<T>(comm, stage_elems),
        schedule.name(),
        regs,
    )?;
    while states.len() < links.len() {
        states.push(State::default());
    }
    for (st, l) in states.iter_mut().zip(links.iter()) {
        st.reset(match l.staged {
            Some(id) if l.dir == Dir::Recv => pools[usize::from(id)],
            _ => (0, 0),
        });
    }
    done.clear();
    done.resize(links.len(), 0);
    let result = Conns::open(comm, links).and_then(|mut conns| {
        let ex = Exec {
            links,
            window,
            stage: stage as *mut u8,
            slot,
            regs,
            tag,
            op,
        };
        let states = &mut states[..links.len()];
        ex.drive::<T, P>(&mut conns, schedule, &mut space, states, done, on)
    });
    regs.release(comm);
    result
}

/// A send the schedule released, waiting for its turn (and, on a staged device, for its fetch).
#[derive(Clone, Copy)]
struct Queued {
    from: *const u8,
    /// Elements.
    len: usize,
    fetch: Option<Ticket>,
}

/// A posted receive; `reducing` once its reduction runs on a device.
#[derive(Clone, Copy)]
struct Posted {
    id: RequestId,
    key: Key,
    at: *mut u8,
    /// Elements.
    len: usize,
    /// Complete and checked, waiting for [`Schedule::may_process`].
    landed: bool,
    reducing: Option<Ticket>,
}

/// A queue of a handful of entries: a vector and a read index, emptied (capacity kept) each
/// time it runs dry, cheaper than a ring buffer's wrap-around. A pipeline whose queue never
/// runs dry (a window kept full for a whole call) moves its few live entries to the front
/// once the read index has passed half the vector, so memory stays bounded by the window,
/// not the call's message count.
struct Fifo<T> {
    items: Vec<T>,
    head: usize,
}

/// Read index at which a [`Fifo`] that has not run dry moves its entries to the front.
const COMPACT_AT: usize = 32;

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Fifo {
            items: Vec::new(),
            head: 0,
        }
    }
}

impl<T: Copy> Fifo<T> {
    fn len(&self) -> usize {
        self.items.len() - self.head
    }
    fn is_empty(&self) -> bool {
        self.head == self.items.len()
    }
    fn push_back(&mut self, t: T) {
        self.items.push(t);
    }
    fn front(&self) -> Option<&T> {
        self.items.get(self.head)
    }
    fn front_mut(&mut self) -> Option<&mut T> {
        self.items.get_mut(self.head)
    }
    fn pop_front(&mut self) {
        self.head += 1;
        if self.head == self.items.len() {
            self.clear();
        } else if self.head >= COMPACT_AT && 2 * self.head >= self.items.len() {
            self.items.drain(..self.head);
            self.head = 0;
        }
    }
    fn clear(&mut self) {
        self.items.clear();
        self.head = 0;
    }
}

/// One connection's requests.
#[derive(Default)]
struct State {
    /// Messages the schedule has handed out so far.
    handed: usize,
    queue: Fifo<Queued>,
    sends: Fifo<RequestId>,
    recvs: Fifo<Posted>,
    /// A staged receive connection's pool: first slot and slots.
    pool: (usize, usize),
}

impl State {
    fn reset(&mut self, pool: (usize, usize)) {
        self.handed = 0;
        self.queue.clear();
        self.sends.clear();
        self.recvs.clear();
        self.pool = pool;
    }
}

/// What one call's loop needs besides the schedule and the connections.
struct Exec<'a> {
    links: &'a [Link],
    window: usize,
    stage: *mut u8,
    slot: usize,
    regs: &'a Regs,
    tag: u32,
    op: ReduceOp,
}

impl Exec<'_> {
    /// Words a transport failure on `link` (built only when one happens: this runs on every
    /// pass of an 8-byte call).
    #[cold]
    fn transport_err(
        &self,
        rank: usize,
        name: &'static str,
        link: usize,
        cause: busbw_transports::TransportError,
    ) -> CommError {
        let (peer, label, tag) = (self.links[link].peer, self.links[link].label, self.tag);
        let what = match self.links[link].dir {
            Dir::Send => "sending to",
            Dir::Recv => "receiving from",
        };
        CommError::Transport {
            rank,
            peer: Some(peer),
            during: format!("{name} (call {tag}{label}): {what} rank {peer}"),
            cause,
        }
    }

    /// # Safety
    /// As [`run`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn drive<T: Element, P: Schedule<T>>(
        &self,
        conns: &mut Conns,
        schedule: &mut P,
        space: &mut Space,
        states: &mut [State],
        done: &mut [usize],
        on: &mut Vec<Sleep>,
    ) -> Result<(), CommError> {
        let (r, name, w) = (conns.comm.rank(), schedule.name(), self.window);
        let esize = std::mem::size_of::<T>();
        let f = Failed { rank: r, name };
        let stage = self.stage as *mut T;
        let mut remaining: usize = self.links.iter().map(|l| l.messages).sum();
        let mut waiter = Waiter::new(conns.comm);

        while remaining > 0 {
            let mut progressed = false;
            for (l, link) in self.links.iter().enumerate() {
                if done[l] == link.messages {
                    continue;
                }
                let st = &mut states[l];
                match link.dir {
                    Dir::Send => {
                        let err = |c| self.transport_err(r, name, l, c);
                        while st.handed < link.messages {
                            let Some(o) = schedule.next_send(l, &Progress { done }) else {
                                break;
                            };
                            let fetch = if o.own {
                                space.fetch(o.from, o.len, &f)?
                            } else {
                                None
                            };
                            st.queue.push_back(Queued {
                                from: o.from as *const u8,
                                len: o.len,
                                fetch,
                            });
                            st.handed += 1;
                            progressed = true;
                        }
                        while st.sends.len() < w {
                            let Some(q) = st.queue.front_mut() else {
                                break;
                            };
                            if let Some(t) = q.fetch {
                                if !space.complete(t, &f)? {
                                    break;
                                }
                                q.fetch = None;
                            }
                            let p = space.at(q.from as *const T, q.len, &f)? as *const u8;
                            let bytes = q.len * esize;
                            // SAFETY: the schedule keeps the memory as it is until the send
                            // completes; the region holding it is registered.
                            let id = conns
                                .send(l)
                                .isend(self.regs.find(p, bytes), p, bytes, self.tag)
                                .map_err(&err)?;
                            st.queue.pop_front();
                            st.sends.push_back(id);
                            progressed = true;
                        }
                        while let Some(&id) = st.sends.front() {
                            if conns.send(l).test(id).map_err(&err)?.is_none() {
                                break;
                            }
                            st.sends.pop_front();
                            done[l] += 1;
                            remaining -= 1;
                            progressed = true;
                        }
                    }
                    Dir::Recv => {
                        let err = |c| self.transport_err(r, name, l, c);
                        while st.handed < link.messages && st.recvs.len() < w {
                            let Some(i) = schedule.next_recv(l, &Progress { done }) else {
                                break;
                            };
                            let p = match i.into {
                                // A pool's slots outnumber the receives in flight on its
                                // connections, which complete in order: this slot is free.
                                None if st.pool.1 > 0 => {
                                    let (slot0, slots) = st.pool;
                                    stage.wrapping_add((slot0 + st.handed % slots) * self.slot)
                                }
                                None => {
                                    return Err(CommError::Invalid(format!(
                                        "rank {r}: {name}: a receive from rank {} wants a staging slot on a connection without any",
                                        link.peer
                                    )))
                                }
                                Some(p) => space.at(p, i.len, &f)? as *mut T,
                            };
                            let bytes = i.len * esize;
                            // SAFETY: nobody else writes the target until this completes.
                            let id = conns
                                .recv(l)
                                .irecv(
                                    self.regs.find(p as *const u8, bytes),
                                    p as *mut u8,
                                    bytes,
                                    self.tag,
                                )
                                .map_err(&err)?;
                            st.recvs.push_back(Posted {
                                id,
                                key: i.key,
                                at: p as *mut u8,
                                len: i.len,
                                landed: false,
                                reducing: None,
                            });
                            st.handed += 1;
                            progressed = true;
                        }
                        while let Some(p) = st.recvs.front_mut() {
                            if let Some(t) = p.reducing {
                                if !space.complete(t, &f)? {
                                    break;
                                }
                            } else {
                                if !p.landed {
                                    let Some(got) = conns.recv(l).test(p.id).map_err(&err)? else {
                                        break;
                                    };
                                    if got != p.len * esize {
                                        return Err(CommError::short_message(
                                            r,
                                            name,
                                            link.peer,
                                            got,
                                            p.len * esize,
                                        ));
                                    }
                                    p.landed = true;
                                    progressed = true;
                                }
                                // Tested all along (a send's completion may need the peer to
                                // take this message first), processed only when allowed.
                                if !schedule.may_process(l, p.key, &Progress { done }) {
                                    break;
                                }
                                match schedule.arrived(l, p.key) {
                                    Arrival::Landed => space.landed(p.at as *const T, p.len, &f)?,
                                    Arrival::Reduce {
                                        out,
                                        mine,
                                        avg_over,
                                        travels_on,
                                        theirs_first,
                                    } => {
                                        let ends = (out, mine, p.at as *mut T);
                                        let how = (avg_over, travels_on, theirs_first);
                                        if let Some(t) =
                                            space.reduce(ends, p.len, self.op, how, &f)?
                                        {
                                            // The slot and whatever waits on it wait for this.
                                            p.reducing = Some(t);
                                            progressed = true;
                                            continue;
                                        }
                                    }
                                }
                            }
                            schedule.processed(l, p.key);
                            st.recvs.pop_front();
                            done[l] += 1;
                            remaining -= 1;
                            progressed = true;
                        }
                    }
                }
            }
            if progressed {
                waiter.progressed();
                continue;
            }

            // (Looked at only when the wait is long enough to matter: the spinning passes
            // are what an 8-byte call's latency is made of.)
            let device_busy = |states: &[State]| {
                states.iter().any(|s| {
                    s.queue.front().is_some_and(|q| q.fetch.is_some())
                        || s.recvs.front().is_some_and(|p| p.reducing.is_some())
                })
            };
            let sleep = waiter.idle(conns.comm, || {
                self.waiting_for(r, name, done, device_busy(states))
            })?;
            if !sleep {
                continue;
            }
            if device_busy(states) {
                // The device signals nothing a poll(2) could wait on.
                std::thread::yield_now();
                continue;
            }
            // Only connections with requests in flight: one with nothing posted cannot make
            // progress whatever its socket says.
            let busy = |s: &State| !s.sends.is_empty() || !s.recvs.is_empty();
            on.clear();
            for (l, s) in states.iter().enumerate() {
                if busy(s) {
                    on.push(conns.sleep_on(l));
                }
            }
            waiter.sleep(on);
            for (l, s) in states.iter().enumerate() {
                if busy(s) {
                    conns.woke(l);
                }
            }
        }
        Ok(())
    }

    /// Who the call waits for, for the timeout message: data from a peer first (the usual
    /// culprit), then a peer that does not take our data.
    fn waiting_for(
        &self,
        r: usize,
        name: &str,
        done: &[usize],
        device_busy: bool,
    ) -> (usize, String) {
        let tag = self.tag;
        if device_busy {
            return (r, format!("waiting for the device ({name} call {tag})"));
        }
        let behind = |dir: Dir| {
            self.links
                .iter()
                .enumerate()
                .find(|(i, l)| l.dir == dir && done[*i] < l.messages)
        };
        if let Some((i, l)) = behind(Dir::Recv) {
            let (peer, label, done, all) = (l.peer, l.label, done[i], l.messages);
            return (
                peer,
                format!("waiting for data from rank {peer} ({name} call {tag}{label}, {done}/{all} segments received)"),
            );
        }
        if let Some((i, l)) = behind(Dir::Send) {
            let (peer, label, done, all) = (l.peer, l.label, done[i], l.messages);
            return (
                peer,
                format!("waiting for rank {peer} to take data ({name} call {tag}{label}, {done}/{all} segments sent)"),
            );
        }
        (r, format!("{name} call {tag}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_keeps_order_and_stays_bounded_when_never_dry() {
        let mut q = Fifo::default();
        let mut next_in = 0usize;
        let mut next_out = 0usize;
        // A window of 4 kept full for 10000 messages, as a long pipeline does.
        for _ in 0..4 {
            q.push_back(next_in);
            next_in += 1;
        }
        for _ in 0..10_000 {
            assert_eq!(q.front(), Some(&next_out));
            q.pop_front();
            next_out += 1;
            q.push_back(next_in);
            next_in += 1;
            assert_eq!(q.len(), 4);
            assert!(q.items.len() <= 2 * COMPACT_AT, "grew to {}", q.items.len());
        }
        while !q.is_empty() {
            assert_eq!(q.front(), Some(&next_out));
            q.pop_front();
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        assert!(q.items.is_empty());
    }
}
