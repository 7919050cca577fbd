//! GPU to GPU: ranks of one host whose devices reach each other's memory run every
//! collective on device memory alone, as NCCL's P2P transport does.
//!
//! Staging moves a device buffer through its pinned host twin and a transport, twice over
//! PCIe. When every rank's device offers peer memory ([`Offload::peer_id`]: CUDA IPC between
//! processes, peer access between the devices of one process) and every device can reach
//! every other (`cuDeviceCanAccessPeer`, or one device shared), each rank instead exports
//! its send and receive ranges as handles, trades them in one small all-to-all exchange,
//! opens its peers' and works on their memory in place: reductions by the reduction kernel
//! reading every peer's slice, data movement by device copies from peers' send buffers
//! (what a rank needs it pulls; reductions are split so that each rank reduces the slice it
//! owns and writes the result where it belongs, as the host direct AllReduce does).
//!
//! Exchanges over the communicator's connections order each call, as in
//! [`crate::algorithms::direct`]: the handles themselves (each rank has entered the call
//! and its device has finished writing its input), a middle one when a rank's output is
//! some peer's input still to be read (AlltoAll, AlltoAllv and SendRecv in place), and a
//! final one (every rank has finished reading and writing the others' buffers, so each may
//! return).
//! AlltoAllv adds one exchange after the handles: every rank's sizes per peer, from which
//! each finds its block in every peer's send buffer and checks it is the size it expects.
//! Every rank waits for its own device before each exchange.
//!
//! Whether the path applies is agreed once per communicator, on its first call with device
//! data: the job must let local ranks map each other's memory (`CommConfig::map_peers`),
//! all ranks must be on one host, and each rank says whether its device offers peer memory
//! and reaches every peer's. If not, every call stages as before and [`why`] says why in one
//! line (rank 0 prints it). Nothing is guessed from addresses: the data's
//! [`MemorySpace`](crate::MemorySpace) and the device's own offer decide.
//!
//! A job of several hosts gives its communicator a [`Hierarchy`] ([`set_hierarchy`]): the
//! collectives then run GPU to GPU inside each host and cross hosts by rail or over the
//! job's communicator ([`hier`]).

mod hier;

pub use hier::Hierarchy;

use crate::algorithms::direct::{all_to_all, all_to_all_rows, slice, Agreed};
use crate::dtype::{DataType, ReduceOp};
use crate::engine::data::{bytes_of, Data};
use crate::engine::space::MemorySpace;
use crate::error::CommError;
use crate::link::Communicator;
use crate::offload::{device_of, Offload, OffloadError, PeerHandle, PeerId};
use smallvec::SmallVec;

/// First word of every description: the peer runs this path, not another algorithm that
/// happens to use the same channel.
const MAGIC: u64 = u64::from_le_bytes(*b"bbwpeer1");
/// Words of one rank's call description: magic, kind, count, root, dtype and op, in place,
/// then the send and the receive range's handles.
const WORDS: usize = 7 + 2 * PeerHandle::WORDS;

/// Which collective a call is: what each rank's buffers hold and what it pulls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    ReduceScatter,
    Reduce,
    AllGather,
    Broadcast,
    Alltoall,
    Alltoallv,
    Scatter,
    Gather,
    SendRecv,
    HyperCube,
}

impl Kind {
    fn reduces(self) -> bool {
        matches!(self, Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce)
    }
    fn rooted(self) -> bool {
        matches!(
            self,
            Kind::Reduce | Kind::Broadcast | Kind::Scatter | Kind::Gather
        )
    }
}

/// An AllReduce algorithm: a call names the one it is, which the steps across hosts
/// ([`hier`]) then run on the rail.
pub(crate) type AllReduceFn =
    fn(&mut Communicator, Data<'_>, usize, DataType, ReduceOp) -> Result<(), CommError>;

/// One collective call as the peer path sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call<'v> {
    pub kind: Kind,
    pub name: &'static str,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
    /// The AllReduce this call is (ring unless [`Call::by`] says otherwise).
    pub all_reduce: AllReduceFn,
    /// AlltoAllv's bytes to and from each rank (empty for the other kinds).
    pub sends: &'v [usize],
    pub recvs: &'v [usize],
}

impl<'v> Call<'v> {
    /// A call that moves data only.
    pub fn moving(kind: Kind, name: &'static str, count: usize, dtype: DataType) -> Call<'v> {
        Call::reducing(kind, name, count, dtype, ReduceOp::Sum)
    }

    /// AlltoAllv: `sends[j]` bytes to rank j, `recvs[j]` from it, blocks back to back in
    /// rank order. Its count is a placeholder every rank shares, so that all take this path
    /// together even where one moves nothing.
    pub fn varying(sends: &'v [usize], recvs: &'v [usize]) -> Call<'v> {
        Call {
            sends,
            recvs,
            ..Call::moving(Kind::Alltoallv, "alltoallv", 1, DataType::Uint8)
        }
    }

    /// A call that reduces with `op`.
    pub fn reducing(
        kind: Kind,
        name: &'static str,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Call<'v> {
        Call {
            kind,
            name,
            count,
            dtype,
            op,
            root: 0,
            all_reduce: crate::algorithms::ring::all_reduce,
            sends: &[],
            recvs: &[],
        }
    }

    /// The same call with a root.
    pub fn at(self, root: usize) -> Call<'v> {
        Call { root, ..self }
    }

    /// The same AllReduce call, as algorithm `all_reduce`.
    pub fn by(self, all_reduce: AllReduceFn) -> Call<'v> {
        Call { all_reduce, ..self }
    }
}

/// What the peer path keeps on a communicator between calls.
#[derive(Default)]
pub(crate) struct Peers {
    agreed: Agreed,
    why: Option<String>,
    /// The allocations of the peers' handles opened for the last call: when they change,
    /// the old mappings are closed.
    keys: Vec<[u64; 10]>,
    descs: Vec<[u64; WORDS]>,
    /// AlltoAllv: row p is the bytes rank p sends to each rank.
    rows: Vec<u64>,
    flags: Vec<u8>,
    ran: u64,
    staged: u64,
    /// The communicators across hosts, when the job has several.
    hier: Option<Box<Hierarchy>>,
    /// Calls run across hosts through them.
    across: u64,
}

impl crate::link::Kept for Peers {
    const SLOT: usize = 3;
}

/// How a communicator's calls on device data ran: (GPU to GPU, staged, why staged).
pub fn tally(comm: &Communicator) -> (u64, u64, Option<&str>) {
    comm.peek::<Peers>()
        .map_or((0, 0, None), |p| (p.ran, p.staged, p.why.as_deref()))
}

/// Why device data on this communicator is staged rather than moved GPU to GPU, once the
/// ranks have agreed (on the first call with device data, or [`agree`]); `None` before, or
/// when the peer path is in use.
pub fn why(comm: &Communicator) -> Option<&str> {
    tally(comm).2
}

/// Gives a communicator of several hosts its node and rail communicators: from then on its
/// calls on device data that [`hier`] splits run GPU to GPU inside each host.
pub fn set_hierarchy(comm: &mut Communicator, h: Hierarchy) {
    comm.kept::<Peers>().hier = Some(Box::new(h));
}

/// The communicators across hosts, if the communicator has them.
pub fn hierarchy(comm: &mut Communicator) -> Option<&mut Hierarchy> {
    comm.kept::<Peers>().hier.as_deref_mut()
}

/// Calls on device data that ran across hosts through the hierarchy.
pub fn across_hosts(comm: &Communicator) -> u64 {
    comm.peek::<Peers>().map_or(0, |p| p.across)
}

/// Agrees now whether the ranks use peer memory for `device`'s data (every rank must call
/// it, like a collective); `Ok(None)` when they do, else why not. Later calls reuse the
/// answer.
pub fn agree(
    comm: &mut Communicator,
    device: &mut dyn Offload,
) -> Result<Option<String>, CommError> {
    let mut st = std::mem::take(comm.kept::<Peers>());
    let r = agreed(comm, &mut st, device);
    *comm.kept::<Peers>() = st;
    r?;
    Ok(why(comm).map(str::to_string))
}

/// Closes every rank's mappings of its peers' buffers, and returns once all have (every
/// rank calls it, like a collective): before an owner frees or replaces device buffers its
/// peers may have open, since CUDA leaves freeing memory another process has mapped
/// undefined. Nothing to do (and no message) where the path is not in use.
pub fn release(comm: &mut Communicator, device: &mut dyn Offload) -> Result<(), CommError> {
    let mut st = std::mem::take(comm.kept::<Peers>());
    let r = (|| {
        if let Some(h) = st.hier.as_deref_mut() {
            release(h.node(), device)?;
        }
        if st.agreed != Agreed::Yes {
            return Ok(());
        }
        device.close_peers();
        st.keys.clear();
        fence(comm, &mut st, true, "peer memory: released").map(drop)
    })();
    *comm.kept::<Peers>() = st;
    r
}

/// Runs the call GPU to GPU when its data is on a device and the ranks agreed to use peer
/// memory; returns the data untouched (`Some`) when the call must run another way: host
/// data (one test, the common case), one rank, nothing to move, or no agreement.
pub(crate) fn offer<'a>(
    comm: &mut Communicator,
    mut data: Data<'a>,
    call: Call<'_>,
) -> Result<Option<Data<'a>>, CommError> {
    if data.on_host() {
        return Ok(Some(data));
    }
    let (n, me) = (comm.size(), comm.rank());
    let unsupported = n < 2
        || call.count == 0
        || (call.kind.rooted() && call.root >= n)
        || (call.kind == Kind::HyperCube && !n.is_power_of_two());
    if unsupported {
        // The other paths handle these (or word their errors).
        return Ok(Some(data));
    }
    let kb = bytes_of(call.count, call.dtype)?;
    let (sb, rb, offsets) = layout(call, n, me, kb);
    let (src, dst) = data.ptrs(me, call.name, sb, rb, call.dtype, offsets)?;
    let in_place = data.is_in_place();
    let MemorySpace::Device(d) = data.space_mut() else {
        return Ok(Some(data));
    };
    let d: &mut dyn Offload = &mut **d;
    if let Some(mut h) = comm.kept::<Peers>().hier.take() {
        // SAFETY: as for `run` below.
        let r = unsafe { hier::run(comm, &mut h, d, &call, src, dst, in_place) };
        let st = comm.kept::<Peers>();
        st.hier = Some(h);
        st.across += u64::from(r.is_ok());
        return r.map(|()| None);
    }
    let mut st = std::mem::take(comm.kept::<Peers>());
    let r = (|| {
        if !agreed(comm, &mut st, d)? {
            return Ok(false);
        }
        // SAFETY: Data::ptrs checked both ranges for their sizes, inside the device's
        // mirrors; the borrows outlive the call.
        unsafe { run(comm, &mut st, d, &call, (src, sb), (dst, rb), in_place)? };
        Ok(true)
    })();
    match r {
        Ok(true) => st.ran += 1,
        Ok(false) => st.staged += 1,
        Err(_) => {}
    }
    *comm.kept::<Peers>() = st;
    Ok(if r? { None } else { Some(data) })
}

/// (send bytes, receive bytes, (input offset, output offset) in an in-place buffer) of rank
/// `me`, the same as the host path's of each collective.
fn layout(c: Call<'_>, n: usize, me: usize, kb: usize) -> (usize, usize, (usize, usize)) {
    let root = me == c.root;
    match c.kind {
        Kind::AllReduce | Kind::Reduce | Kind::Broadcast | Kind::SendRecv => (kb, kb, (0, 0)),
        Kind::ReduceScatter => (n * kb, kb, (0, me * kb)),
        Kind::Scatter => (if root { n * kb } else { 0 }, kb, (0, me * kb)),
        Kind::AllGather | Kind::HyperCube => (kb, n * kb, (me * kb, 0)),
        Kind::Gather => (kb, if root { n * kb } else { 0 }, (me * kb, 0)),
        Kind::Alltoall => (n * kb, n * kb, (0, 0)),
        Kind::Alltoallv => (c.sends.iter().sum(), c.recvs.iter().sum(), (0, 0)),
    }
}

fn agreed(comm: &mut Communicator, st: &mut Peers, d: &mut dyn Offload) -> Result<bool, CommError> {
    if st.agreed == Agreed::Unknown {
        st.why = agreement(comm, d)?;
        st.agreed = if st.why.is_none() {
            Agreed::Yes
        } else {
            Agreed::No
        };
    }
    Ok(st.agreed == Agreed::Yes)
}

/// What a rank says of its peers in the agreement.
const FINE: u64 = 0;
const NO_PEER_MEMORY: u64 = 1;
const NO_ACCESS: u64 = 2;
const ASK_FAILED: u64 = 3;

/// `None` when every rank can use every peer's memory, else why not (the same words on
/// every rank).
fn agreement(comm: &mut Communicator, d: &mut dyn Offload) -> Result<Option<String>, CommError> {
    if !comm.config().map_peers {
        return Ok(Some(
            "the job does not let local ranks map each other's memory (a transport was \
             asked for by name)"
                .into(),
        ));
    }
    let hosts = comm.node_map().node_count();
    if hosts != 1 {
        return Ok(Some(format!("the ranks are on {hosts} hosts")));
    }
    let (n, me) = (comm.size(), comm.rank());
    let id = d.peer_id();
    let mut ids = vec![[0u64; 6]; n];
    ids[me][0] = MAGIC;
    if let Some(id) = id {
        ids[me][1] = 1;
        ids[me][2..].copy_from_slice(&id.0);
    }
    // SAFETY: one entry per rank.
    unsafe { all_to_all(comm, &mut ids, "peer memory: trading device ids")? };
    disagree(me, ids.iter().map(|i| i[0]))?;
    // This rank's verdict: the first peer it cannot reach, and why.
    let mut verdict = [FINE, 0];
    if id.is_none() {
        verdict = [NO_PEER_MEMORY, me as u64];
    } else {
        for (p, i) in ids
            .iter()
            .enumerate()
            .filter(|&(p, i)| p != me && i[1] == 1)
        {
            let mut words = [0u64; 4];
            words.copy_from_slice(&i[2..]);
            match d.can_access_peer(&PeerId(words)) {
                Ok(true) => continue,
                Ok(false) => verdict = [NO_ACCESS, p as u64],
                Err(_) => verdict = [ASK_FAILED, p as u64],
            }
            break;
        }
    }
    let mut verdicts = vec![[0u64; 2]; n];
    verdicts[me] = verdict;
    // SAFETY: as above.
    unsafe { all_to_all(comm, &mut verdicts, "peer memory: agreeing")? };
    let first = verdicts.iter().enumerate().find(|(_, v)| v[0] != FINE);
    Ok(first.map(|(r, &[what, p])| match what {
        NO_PEER_MEMORY => format!("rank {r}'s device offers no peer memory (CUDA IPC)"),
        NO_ACCESS => format!(
            "rank {r}'s device cannot access rank {p}'s (no peer access between the two devices)"
        ),
        _ => format!("rank {r} could not ask its driver whether it can access rank {p}'s device"),
    }))
}

fn disagree(me: usize, magics: impl Iterator<Item = u64>) -> Result<(), CommError> {
    for (p, m) in magics.enumerate() {
        if m != MAGIC {
            return Err(CommError::Invalid(format!(
                "rank {me}: peer memory: rank {p} is not running the GPU-to-GPU path (ranks \
                 disagree about where their data is)"
            )));
        }
    }
    Ok(())
}

/// Device addresses of every rank's send and receive range (ours as they are, the peers'
/// opened here).
struct Ranges {
    src: SmallVec<[u64; 16]>,
    dst: SmallVec<[u64; 16]>,
}

/// One call on peer memory (see the module documentation).
///
/// # Safety
/// `src` and `dst` are inside the device's mirrors for their lengths (checked by
/// `Data::ptrs`) and stay valid for the call.
unsafe fn run(
    comm: &mut Communicator,
    st: &mut Peers,
    d: &mut dyn Offload,
    c: &Call<'_>,
    (src, sb): (*const u8, usize),
    (dst, rb): (*mut u8, usize),
    in_place: bool,
) -> Result<(), CommError> {
    let (n, me) = (comm.size(), comm.rank());
    let es = c.dtype.size();
    let kb = c.count * es;
    let dev_err = |what: &str| {
        let during = format!("{}: {what}", c.name);
        move |cause: OffloadError| CommError::Device {
            rank: me,
            during: during.clone(),
            cause,
        }
    };
    // Buffers of the device's own first: asking for them may move its other buffers.
    let acc_bytes = match c.kind {
        Kind::AllReduce | Kind::Reduce => {
            let (lo, hi) = slice(c.count, es, n, me);
            (hi - lo) * es
        }
        Kind::ReduceScatter | Kind::SendRecv => kb,
        Kind::Alltoall => n * kb,
        Kind::Alltoallv => rb,
        _ => 0,
    };
    let acc_host = if acc_bytes > 0 {
        Some(d.scratch(acc_bytes).map_err(dev_err("scratch"))?)
    } else {
        None
    };
    let mut src = src;
    if c.op == ReduceOp::MulSum && c.kind.reduces() {
        src = d
            .premultiply(
                src,
                c.count * if c.kind == Kind::ReduceScatter { n } else { 1 },
                c.dtype,
                me,
            )
            .map_err(dev_err("mulsum premultiplication"))?;
    }
    let mirrors = d.mirrors();
    // An empty range (a non-root's send of Scatter, receive of Gather) is never exported.
    let at = |p: *const u8, len: usize| match len {
        0 => Ok(0),
        _ => device_of(mirrors, p, len),
    };
    let (src_dev, dst_dev, acc) = (|| {
        let acc = match acc_host {
            Some(p) => at(p, acc_bytes)?,
            None => 0,
        };
        Ok::<_, OffloadError>((at(src, sb)?, at(dst as *const u8, rb)?, acc))
    })()
    .map_err(dev_err("translating buffers"))?;
    let export = |d: &mut dyn Offload, a: u64, len: usize| {
        if len == 0 {
            Ok(PeerHandle::default())
        } else {
            d.export_peer(a, len)
        }
    };
    let hs = export(d, src_dev, sb).map_err(dev_err("exporting the send buffer"))?;
    let hd = export(d, dst_dev, rb).map_err(dev_err("exporting the receive buffer"))?;
    // Our input (and the premultiplied one) is on the device before any peer reads it.
    d.sync().map_err(dev_err("waiting for the device"))?;

    let mut mine = [0u64; WORDS];
    mine[..7].copy_from_slice(&[
        MAGIC,
        c.kind as u64,
        c.count as u64,
        c.root as u64,
        (c.dtype as u64) << 8 | c.op as u64,
        u64::from(in_place),
        0,
    ]);
    mine[7..7 + PeerHandle::WORDS].copy_from_slice(&hs.to_words());
    mine[7 + PeerHandle::WORDS..].copy_from_slice(&hd.to_words());
    st.descs.clear();
    st.descs.resize(n, [0; WORDS]);
    st.descs[me] = mine;
    all_to_all(comm, &mut st.descs, "peer memory: trading buffers")?;
    disagree(me, st.descs.iter().map(|x| x[0]))?;
    if let Some(p) = st.descs.iter().position(|x| x[1..5] != mine[1..5]) {
        return Err(CommError::Invalid(format!(
            "rank {me}: {}: rank {p} makes another call (collective, count, root, type or op \
             differ)",
            c.name
        )));
    }
    let any_in_place = st.descs.iter().any(|x| x[5] == 1);
    let handle = |x: &[u64; WORDS], i: usize| {
        let w = 7 + i * PeerHandle::WORDS;
        PeerHandle::from_words(&x[w..w + PeerHandle::WORDS])
    };

    // Mappings of allocations no longer in use go before new ones are made.
    let keys: Vec<[u64; 10]> = (0..n)
        .filter(|&p| p != me)
        .flat_map(|p| [handle(&st.descs[p], 0).key, handle(&st.descs[p], 1).key])
        .collect();
    if keys != st.keys {
        d.close_peers();
        st.keys = keys;
    }
    let mut r = Ranges {
        src: SmallVec::new(),
        dst: SmallVec::new(),
    };
    let mut failed: Option<String> = None;
    for p in 0..n {
        if p == me {
            r.src.push(src_dev);
            r.dst.push(dst_dev);
            continue;
        }
        let mut open = |h: PeerHandle| {
            if h.len == 0 {
                return 0;
            }
            d.open_peer(&h).unwrap_or_else(|e| {
                failed.get_or_insert(format!("opening rank {p}'s buffer: {e}"));
                0
            })
        };
        let (s, t) = (open(handle(&st.descs[p], 0)), open(handle(&st.descs[p], 1)));
        r.src.push(s);
        r.dst.push(t);
    }

    if c.kind == Kind::Alltoallv {
        st.rows.clear();
        st.rows.resize(n * n, 0);
        for (row, &s) in st.rows[me * n..(me + 1) * n].iter_mut().zip(c.sends) {
            *row = s as u64;
        }
        all_to_all_rows(comm, &mut st.rows, n, "alltoallv: trading sizes")?;
        if let Some(p) = (0..n).find(|&p| st.rows[p * n + me] != c.recvs[p] as u64) {
            failed.get_or_insert(format!(
                "rank {p} sends {} bytes to rank {me}, which expects {}",
                st.rows[p * n + me],
                c.recvs[p]
            ));
        }
    }
    let note = |res: Result<(), OffloadError>, failed: &mut Option<String>| {
        if let Err(e) = res {
            failed.get_or_insert(e.to_string());
        }
    };
    let ctx = Ctx {
        c,
        n,
        me,
        kb,
        acc,
        any_in_place,
        rows: &st.rows,
    };
    if failed.is_none() {
        note(pull(d, &ctx, &r), &mut failed);
    }
    if any_in_place && matches!(c.kind, Kind::Alltoall | Kind::Alltoallv | Kind::SendRecv) {
        // Our output is a peer's input: every rank has read what it needs first.
        note(d.sync(), &mut failed);
        if let Some(p) = fence(comm, st, failed.is_none(), "peer memory: read")? {
            // Still to the final exchange, which the others wait for.
            failed.get_or_insert(format!(
                "rank {p} failed on peer memory, so the result is incomplete (its own error \
                 says why)"
            ));
        }
        if failed.is_none() {
            note(d.copy_on_device(r.dst[me], acc, rb).map(drop), &mut failed);
        }
    }
    note(d.sync(), &mut failed);
    let peer = fence(comm, st, failed.is_none(), "peer memory: finishing")?;
    if let Some(cause) = failed {
        return Err(CommError::Invalid(format!(
            "rank {me}: {}: {cause}",
            c.name
        )));
    }
    if let Some(p) = peer {
        return Err(CommError::Invalid(format!(
            "rank {me}: {}: rank {p} failed on peer memory, so the result is incomplete (its \
             own error says why)",
            c.name
        )));
    }
    Ok(())
}

/// An exchange of flags that orders the call's phases: every rank has done its part (`ok`:
/// without failing). Returns the first rank that failed, if one did.
fn fence(
    comm: &mut Communicator,
    st: &mut Peers,
    ok: bool,
    what: &'static str,
) -> Result<Option<usize>, CommError> {
    let n = comm.size();
    st.flags.clear();
    st.flags.resize(n, 0);
    st.flags[comm.rank()] = u8::from(ok);
    // SAFETY: one entry per rank.
    unsafe { all_to_all(comm, &mut st.flags, what)? };
    Ok(st.flags.iter().position(|&f| f == 0))
}

/// What one rank's share of the work needs to know.
struct Ctx<'c> {
    c: &'c Call<'c>,
    n: usize,
    me: usize,
    kb: usize,
    /// Device scratch of this call (reductions' results, in-place AlltoAll and SendRecv).
    acc: u64,
    any_in_place: bool,
    /// AlltoAllv's sizes (`Peers::rows`).
    rows: &'c [u64],
}

/// Issues this rank's reads of its peers' memory: reductions of the slices it owns and
/// copies of what its output needs.
fn pull(d: &mut dyn Offload, x: &Ctx, r: &Ranges) -> Result<(), OffloadError> {
    let Ctx {
        c, n, me, kb, acc, ..
    } = *x;
    let es = c.dtype.size() as u64;
    let kb64 = kb as u64;
    let copy = |d: &mut dyn Offload, dst: u64, src: u64, len: usize| {
        if len == 0 || dst == src {
            return Ok(());
        }
        d.copy_on_device(dst, src, len).map(drop)
    };
    match c.kind {
        Kind::AllReduce | Kind::Reduce => {
            let (lo, hi) = slice(c.count, es as usize, n, me);
            if hi > lo {
                let off = lo as u64 * es;
                reduce_all(d, c, acc, hi - lo, |p| r.src[p] + off, n)?;
                let len = (hi - lo) * es as usize;
                if c.kind == Kind::AllReduce {
                    for q in 0..n {
                        copy(d, r.dst[q] + off, acc, len)?;
                    }
                } else {
                    copy(d, r.dst[c.root] + off, acc, len)?;
                }
            }
        }
        Kind::ReduceScatter => {
            let off = me as u64 * kb64;
            reduce_all(d, c, acc, c.count, |p| r.src[p] + off, n)?;
            copy(d, r.dst[me], acc, kb)?;
        }
        Kind::AllGather | Kind::HyperCube => {
            for p in 0..n {
                copy(d, r.dst[me] + p as u64 * kb64, r.src[p], kb)?;
            }
        }
        Kind::Gather if me == c.root => {
            for p in 0..n {
                copy(d, r.dst[me] + p as u64 * kb64, r.src[p], kb)?;
            }
        }
        Kind::Gather => {}
        Kind::Broadcast => copy(d, r.dst[me], r.src[c.root], kb)?,
        Kind::Scatter => copy(d, r.dst[me], r.src[c.root] + me as u64 * kb64, kb)?,
        Kind::Alltoall => {
            let to = if x.any_in_place { acc } else { r.dst[me] };
            for p in 0..n {
                copy(d, to + p as u64 * kb64, r.src[p] + me as u64 * kb64, kb)?;
            }
        }
        Kind::SendRecv => {
            let to = if x.any_in_place { acc } else { r.dst[me] };
            copy(d, to, r.src[(me + n - 1) % n], kb)?;
        }
        Kind::Alltoallv => {
            let to = if x.any_in_place { acc } else { r.dst[me] };
            let mut at = 0u64;
            for p in 0..n {
                // Our block in p's send buffer follows its blocks for the ranks before us.
                let row = &x.rows[p * n..(p + 1) * n];
                let from = r.src[p] + row[..me].iter().sum::<u64>();
                copy(d, to + at, from, c.recvs[p])?;
                at += c.recvs[p] as u64;
            }
        }
    }
    Ok(())
}

/// `out` = every rank's `input(p)` (`elems` elements) reduced in rank order by the device's
/// reduction kernel, `avg` divided on the last step; `mulsum`'s inputs are premultiplied.
fn reduce_all(
    d: &mut dyn Offload,
    c: &Call,
    out: u64,
    elems: usize,
    input: impl Fn(usize) -> u64,
    n: usize,
) -> Result<(), OffloadError> {
    for p in 1..n {
        let mine = if p == 1 { input(0) } else { out };
        let avg = (c.op == ReduceOp::Avg && p == n - 1).then_some(n);
        d.reduce_on_device(out, mine, input(p), elems, c.dtype, c.op, avg)?;
    }
    Ok(())
}
