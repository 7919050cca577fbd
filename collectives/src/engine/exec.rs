//! The executor: one progress loop for every plan.

use super::links::Conns;
use super::space::{Failed, Space};
use super::{Arrival, Dir, Link, Plan, Progress};
use crate::communicator::{Communicator, Waiter};
use crate::data::Regs;
use crate::dtype::ReduceOp;
use crate::element::Element;
use crate::error::CommError;
use crate::offload::{self, Offload, Ticket};
use crate::workspace::staging;
use busbw_transports::{RequestId, Sleep};
use std::collections::VecDeque;

/// Run `plan` to completion over the communicator's connections, in the memory space of the
/// attached device when that device holds the plan's memory, else on the host.
///
/// # Safety
/// Every pointer the plan hands out must be valid for the message it describes, and the plan
/// must not let two in-flight requests, or a request and a reduction, touch the same memory.
pub(crate) unsafe fn run<T: Element, P: Plan<T>>(
    comm: &mut Communicator,
    plan: &mut P,
    op: ReduceOp,
) -> Result<(), CommError> {
    let tag = comm.next_tag();
    let esize = std::mem::size_of::<T>();
    // Host memory (the common case, and latency-bound at small sizes) allocates nothing here.
    let mut dev = if comm.has_offload() {
        let ranges: Vec<(*const u8, usize)> = plan
            .regions()
            .iter()
            .map(|&(p, e)| (p as *const u8, e * esize))
            .collect();
        comm.take_offload(&ranges)
    } else {
        None
    };
    let result = run_in(comm, plan, op, tag, dev.as_deref_mut());
    offload::finish(comm, dev, result, plan.name())
}

/// [`run`] with the device, if any, already taken from the communicator.
unsafe fn run_in<T: Element, P: Plan<T>>(
    comm: &mut Communicator,
    plan: &mut P,
    op: ReduceOp,
    tag: u32,
    mut dev: Option<&mut (dyn Offload + 'static)>,
) -> Result<(), CommError> {
    let links: Vec<Link> = plan.links().to_vec();
    let window = comm.config().window;
    // Each pool's first slot and size, by pool id.
    let mut pools: Vec<(usize, usize)> = Vec::new();
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
    let slot = plan.slot_elems();
    // (At least one slot's worth, so that the staging region is never empty.)
    let stage_elems = slots.max(1) * slot;
    let (stage, regs, direct) = offload::prepare(
        comm,
        dev.as_deref_mut(),
        &plan.regions(),
        stage_elems,
        |comm| staging::<T>(comm, stage_elems, 1),
        plan.name(),
    )?;
    let mut space = match dev {
        None => Space::Host(comm.reduce_pool()),
        Some(d) if direct => {
            let mirrors = d.mirrors().to_vec();
            Space::Direct(d, mirrors)
        }
        Some(d) => Space::Staged(d),
    };
    let result = Conns::take(comm, &links).and_then(|mut conns| {
        let ex = Exec {
            links: &links,
            pools: &pools,
            window,
            stage: stage as *mut u8,
            slot,
            regs: &regs,
            tag,
            op,
        };
        ex.drive(&mut conns, plan, &mut space)
    });
    regs.release(comm);
    result
}

/// A send the plan released, waiting for its turn (and, on a staged device, for its fetch).
struct Queued<T> {
    from: *const T,
    len: usize,
    fetch: Option<Ticket>,
}

/// A posted receive; `reducing` once its reduction runs on a device.
struct Posted<T, K> {
    id: RequestId,
    key: K,
    at: *mut T,
    len: usize,
    reducing: Option<Ticket>,
}

/// One connection's requests.
struct State<T, K> {
    /// Messages the plan has handed out so far.
    handed: usize,
    queue: VecDeque<Queued<T>>,
    sends: VecDeque<RequestId>,
    recvs: VecDeque<Posted<T, K>>,
    /// A staged receive connection's pool: first slot and slots.
    pool: (usize, usize),
}

/// What one call's loop needs besides the plan and the connections.
struct Exec<'a> {
    links: &'a [Link],
    /// Staging pools: first slot and slots.
    pools: &'a [(usize, usize)],
    window: usize,
    stage: *mut u8,
    slot: usize,
    regs: &'a Regs,
    tag: u32,
    op: ReduceOp,
}

impl Exec<'_> {
    fn transport_err(
        &self,
        rank: usize,
        name: &'static str,
        link: usize,
        what: &'static str,
    ) -> impl Fn(busbw_transports::TransportError) -> CommError {
        let (peer, label, tag) = (self.links[link].peer, self.links[link].label, self.tag);
        move |cause| CommError::Transport {
            rank,
            peer: Some(peer),
            during: format!("{name} (call {tag}{label}): {what} rank {peer}"),
            cause,
        }
    }

    /// # Safety
    /// As [`run`].
    unsafe fn drive<T: Element, P: Plan<T>>(
        &self,
        conns: &mut Conns,
        plan: &mut P,
        space: &mut Space,
    ) -> Result<(), CommError> {
        let (r, name, w) = (conns.comm.rank(), plan.name(), self.window);
        let esize = std::mem::size_of::<T>();
        let f = Failed { rank: r, name };
        let stage = self.stage as *mut T;
        let mut at = Progress {
            done: vec![0; self.links.len()],
        };
        let mut states: Vec<State<T, P::Key>> = self
            .links
            .iter()
            .map(|l| State {
                handed: 0,
                queue: VecDeque::new(),
                sends: VecDeque::new(),
                recvs: VecDeque::new(),
                pool: match l.staged {
                    Some(id) => self.pools[usize::from(id)],
                    None => (0, 0),
                },
            })
            .collect();
        let mut remaining: usize = self.links.iter().map(|l| l.messages).sum();
        let mut waiter = Waiter::new(conns.comm);
        let mut on: Vec<Sleep> = Vec::new();

        while remaining > 0 {
            let mut progressed = false;
            for (l, link) in self.links.iter().enumerate() {
                let st = &mut states[l];
                match link.dir {
                    Dir::Send => {
                        let err = self.transport_err(r, name, l, "sending to");
                        while st.handed < link.messages {
                            let Some(o) = plan.next_send(l, &at) else {
                                break;
                            };
                            let fetch = if o.own {
                                space.fetch(o.from, o.len, &f)?
                            } else {
                                None
                            };
                            st.queue.push_back(Queued {
                                from: o.from,
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
                            let p = space.at(q.from, q.len, &f)? as *const u8;
                            let bytes = q.len * esize;
                            // SAFETY: the plan keeps the memory as it is until the send
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
                            at.done[l] += 1;
                            remaining -= 1;
                            progressed = true;
                        }
                    }
                    Dir::Recv => {
                        let err = self.transport_err(r, name, l, "receiving from");
                        while st.handed < link.messages && st.recvs.len() < w {
                            let Some(i) = plan.next_recv(l, &at) else {
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
                                at: p,
                                len: i.len,
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
                                match plan.arrived(l, p.key) {
                                    Arrival::Landed => space.landed(p.at, p.len, &f)?,
                                    Arrival::Reduce {
                                        out,
                                        mine,
                                        avg_over,
                                        travels_on,
                                        theirs_first,
                                    } => {
                                        let ends = (out, mine, p.at);
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
                            plan.processed(l, p.key);
                            st.recvs.pop_front();
                            at.done[l] += 1;
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

            let device_busy = states.iter().any(|s| {
                s.queue.front().is_some_and(|q| q.fetch.is_some())
                    || s.recvs.front().is_some_and(|p| p.reducing.is_some())
            });
            let sleep = waiter.idle(conns.comm, || self.waiting_for(r, name, &at, device_busy))?;
            if !sleep {
                continue;
            }
            if device_busy {
                // The device signals nothing a poll(2) could wait on.
                std::thread::yield_now();
                continue;
            }
            // Only connections with requests in flight: one with nothing posted cannot make
            // progress whatever its socket says.
            let busy = |s: &State<T, P::Key>| !s.sends.is_empty() || !s.recvs.is_empty();
            on.clear();
            for (l, s) in states.iter().enumerate() {
                if busy(s) {
                    on.push(conns.sleep_on(l));
                }
            }
            waiter.sleep(&on);
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
        at: &Progress,
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
                .find(|(i, l)| l.dir == dir && at.done[*i] < l.messages)
        };
        if let Some((i, l)) = behind(Dir::Recv) {
            let (peer, label, done, all) = (l.peer, l.label, at.done[i], l.messages);
            return (
                peer,
                format!("waiting for data from rank {peer} ({name} call {tag}{label}, {done}/{all} segments received)"),
            );
        }
        if let Some((i, l)) = behind(Dir::Send) {
            let (peer, label, done, all) = (l.peer, l.label, at.done[i], l.messages);
            return (
                peer,
                format!("waiting for rank {peer} to take data ({name} call {tag}{label}, {done}/{all} segments sent)"),
            );
        }
        (r, format!("{name} call {tag}"))
    }
}
