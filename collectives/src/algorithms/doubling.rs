//! Recursive-doubling AllReduce: MPI's algorithm for short messages (Thakur, Rabenseifner and
//! Gropp, "Optimization of Collective Communication Operations in MPICH", 2005).
//!
//! A ring takes `2(n-1)` dependent hops and a tree `2·depth`; recursive doubling takes
//! `log2(n)`: in step k every rank swaps its whole partial result with the rank whose index
//! differs in bit k and reduces. It moves `log2(n)` times the buffer instead of the ring's
//! `2(n-1)/n`, so it only wins while latency dominates, which is exactly where the ring and
//! the tree lose most (8 bytes on 2 ranks: one hop instead of two; on 4 ranks sharing 2 cores:
//! two scheduler round trips instead of six).
//!
//! A rank count that is not a power of two, `n = p + rem` with `p` the largest power of two
//! below it, is folded first: each of the first `rem` even ranks hands its input to the odd
//! rank after it and waits; the remaining `p` ranks double; the folded ranks get the result
//! back at the end (two extra hops, still far fewer than a ring's).
//!
//! Every pair reduces in the same order, lower-numbered side first, so all ranks end with the
//! same bits even where an operator is not commutative bit for bit (min/max of +0 and -0, NaN
//! payloads).

use crate::algorithms::peer::{self, Call, Kind};
use crate::dtype::{DataType, ReduceOp};
use crate::element::Element;
use crate::engine::data::{bytes_of, Data};
use crate::engine::space::MemorySpace;
use crate::engine::workspace::premultiplied;
use crate::engine::{self, Arrival, Dir, In, Key, Link, Out, Progress, Regions, Schedule};
use crate::error::CommError;
use crate::link::Communicator;
use crate::with_dtype;
use smallvec::SmallVec;

/// Channel of recursive doubling above [`SMALL_BYTES`]: the ring's. Calls never overlap, so
/// sharing it is safe, and on two ranks the partner is the ring neighbour whose connections
/// already exist.
const CHANNEL: u32 = 0;

/// Up to this many bytes recursive doubling exchanges on [`crate::SMALL_CHANNEL`] with partners the
/// transport reaches over one connection for both directions
/// ([`Communicator::small_channel`]); other partners stay on [`CHANNEL`], which costs no
/// connection beyond the ring's.
pub const SMALL_BYTES: usize = 16 << 10;

/// AllReduce `count` elements of `dtype` with `op` by recursive doubling; same contract as
/// [`crate::all_reduce`].
pub fn doubling_all_reduce(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let Some(data) = peer::offer(
        comm,
        data,
        Call::reducing(Kind::AllReduce, "doubling_all_reduce", count, dtype, op)
            .by(doubling_all_reduce),
    )?
    else {
        return Ok(());
    };
    let bytes = bytes_of(count, dtype)?;
    let mut b = data.bufs(
        comm.rank(),
        "doubling_all_reduce",
        bytes,
        bytes,
        dtype,
        (0, 0),
    )?;
    // Recursive doubling reduces on the host: device data is staged around it.
    let (inputs, outputs) = ([(b.src, bytes)], [(b.dst, bytes)]);
    b.space
        .around(comm, "doubling_all_reduce", &inputs, &outputs, |comm| {
            let host = &mut MemorySpace::Host;
            with_dtype!(dtype, T => {
                // SAFETY: Data::bufs checked sizes and alignment; the borrows outlive the call.
                unsafe {
                    let src = premultiplied(comm, host, op, b.src as *const T, count)?;
                    doubling_all_reduce_raw::<T>(comm, src, b.dst as *mut T, count, op)
                }
            })
        })
}

/// Number of dependent hops recursive doubling takes on `n` ranks (for the cost model).
pub fn doubling_hops(n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    p.trailing_zeros() as usize + if p == n { 0 } else { 2 }
}

/// What a connection carries in the schedule: its step, and for a receive whether it is
/// combined with our result (`Some(theirs_first)`) or is the result itself (`None`).
#[derive(Clone, Copy)]
struct Role {
    step: usize,
    combine: Option<bool>,
}

/// Recursive doubling as a schedule: each step's send and receive may start once the step
/// before is complete (its data combined, its send off the buffer the next receive may
/// overwrite); a step's combine waits for its send, which reads the buffer the combine
/// writes.
struct DoublingSchedule<T> {
    n: usize,
    dst: *mut T,
    count: usize,
    links: SmallVec<[Link; 4]>,
    roles: SmallVec<[Role; 4]>,
    /// Per step, its connections.
    steps: SmallVec<[[Option<usize>; 2]; 4]>,
    /// The step whose combine is the last (it applies avg's division).
    last_combine: Option<usize>,
    avg: bool,
}

impl<T> DoublingSchedule<T> {
    fn add(&mut self, peer: usize, channel: u32, dir: Dir, combine: Option<bool>) {
        let step = self.steps.len().saturating_sub(1);
        self.links.push(Link {
            peer,
            channel,
            dir,
            messages: 1,
            // One slot for every step: a step's receive waits for the step before.
            staged: combine.map(|_| 0),
            label: "",
        });
        self.roles.push(Role { step, combine });
        let l = self.links.len() - 1;
        self.steps[step][usize::from(dir == Dir::Recv)] = Some(l);
        if combine.is_some() {
            self.last_combine = Some(step);
        }
    }

    fn step(&mut self) {
        self.steps.push([None, None]);
    }

    /// Whether `link`'s step may start.
    fn ready(&self, link: usize, at: &Progress) -> bool {
        let s = self.roles[link].step;
        s == 0 || self.steps[s - 1].iter().flatten().all(|&l| at.done(l) > 0)
    }
}

impl<T> Schedule<T> for DoublingSchedule<T> {
    fn name(&self) -> &'static str {
        "doubling_all_reduce"
    }
    fn links(&self) -> &[Link] {
        &self.links
    }
    fn slot_elems(&self) -> usize {
        self.count
    }
    fn regions(&self) -> Regions<T> {
        smallvec::smallvec![(self.dst as *const T, self.count)]
    }
    fn next_send(&mut self, link: usize, at: &Progress) -> Option<Out<T>> {
        self.ready(link, at).then_some(Out {
            from: self.dst as *const T,
            len: self.count,
            own: false,
        })
    }
    fn next_recv(&mut self, link: usize, at: &Progress) -> Option<In<T>> {
        let into = match self.roles[link].combine {
            Some(_) => None,
            None => Some(self.dst),
        };
        self.ready(link, at).then_some(In {
            into,
            len: self.count,
            key: (0, 0),
        })
    }
    /// The combine writes the result buffer the same step's send reads: not before that
    /// send is complete.
    fn may_process(&self, link: usize, _key: Key, at: &Progress) -> bool {
        let step = self.roles[link].step;
        self.steps[step][0].is_none_or(|send| at.done(send) > 0)
    }
    fn arrived(&mut self, link: usize, _key: Key) -> Arrival<T> {
        let role = self.roles[link];
        let Some(theirs_first) = role.combine else {
            return Arrival::Landed;
        };
        let last = self.last_combine == Some(role.step);
        Arrival::Reduce {
            out: self.dst,
            mine: self.dst as *const T,
            avg_over: (last && self.avg).then_some(self.n),
            travels_on: false,
            theirs_first,
        }
    }
}

/// # Safety
/// `src` and `dst` valid for `count` elements (possibly equal: in place).
pub(crate) unsafe fn doubling_all_reduce_raw<T: Element>(
    comm: &mut Communicator,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let n = comm.size();
    let r = comm.rank();
    if !std::ptr::eq(src, dst) && count > 0 {
        std::ptr::copy_nonoverlapping(src, dst, count);
    }
    if n == 1 || count == 0 {
        comm.next_tag();
        return Ok(());
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    // Index among the `p` ranks that double, or None for a rank folded away.
    let vrank = if r < 2 * rem {
        (r % 2 == 1).then_some(r / 2)
    } else {
        Some(r - rem)
    };
    let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };
    let small = count * std::mem::size_of::<T>() <= SMALL_BYTES;
    let channel = |comm: &mut Communicator, peer: usize| -> Result<u32, CommError> {
        if small {
            comm.small_channel(peer)
        } else {
            Ok(CHANNEL)
        }
    };
    let mut schedule = DoublingSchedule {
        n,
        dst,
        count,
        links: SmallVec::new(),
        roles: SmallVec::new(),
        steps: SmallVec::new(),
        last_combine: None,
        avg: op == ReduceOp::Avg,
    };
    match vrank {
        None => {
            // Folded: hand our input to r+1, get the result back at the end.
            let ch = channel(comm, r + 1)?;
            schedule.step();
            schedule.add(r + 1, ch, Dir::Send, None);
            schedule.step();
            schedule.add(r + 1, ch, Dir::Recv, None);
        }
        Some(v) => {
            if r < 2 * rem {
                // Absorb the even rank before us: its data is the lower side.
                schedule.step();
                schedule.add(r - 1, channel(comm, r - 1)?, Dir::Recv, Some(true));
            }
            let mut mask = 1;
            while mask < p {
                let partner = real(v ^ mask);
                let ch = channel(comm, partner)?;
                schedule.step();
                schedule.add(partner, ch, Dir::Send, None);
                schedule.add(partner, ch, Dir::Recv, Some(v > v ^ mask));
                mask <<= 1;
            }
            if r < 2 * rem {
                schedule.step();
                schedule.add(r - 1, channel(comm, r - 1)?, Dir::Send, None);
            }
        }
    }
    engine::run(comm, &mut schedule, op, &mut MemorySpace::Host)
}

/// AllReduce a few control values (timings, error counts) over the same connections, so the
/// harness needs no second communication channel. Recursive doubling: these are a few bytes,
/// and the harness's barrier and timing exchanges should cost as little as possible.
pub fn all_reduce_values<T: Element>(
    comm: &mut Communicator,
    values: &mut [T],
    op: ReduceOp,
) -> Result<(), CommError> {
    let count = values.len();
    // SAFETY: a slice of plain numbers viewed as bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            values.as_mut_ptr() as *mut u8,
            std::mem::size_of_val(values),
        )
    };
    doubling_all_reduce(comm, Data::in_place(bytes), count, T::DTYPE, op)
}

/// A barrier: returns once every rank has entered it.
pub fn barrier(comm: &mut Communicator) -> Result<(), CommError> {
    let mut v = [0u8; 1];
    all_reduce_values(comm, &mut v, ReduceOp::Sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops() {
        assert_eq!(doubling_hops(1), 0);
        assert_eq!(doubling_hops(2), 1);
        assert_eq!(doubling_hops(3), 3);
        assert_eq!(doubling_hops(4), 2);
        assert_eq!(doubling_hops(6), 4);
        assert_eq!(doubling_hops(8), 3);
        assert_eq!(doubling_hops(9), 5);
    }
}
