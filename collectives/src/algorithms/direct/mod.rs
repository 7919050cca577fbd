//! The direct AllReduce: ranks of one host read and write each other's buffers in place.
//!
//! A ring on shared memory copies every slice through the transport before reducing it: the
//! peer's partial sum lands in staging (a ring buffer, or a cross-memory read into our
//! memory), is read back and reduced, and the result travels again for the all-gather. When
//! every rank's buffers are shared memory ([`HostBuffer::shared`](crate::HostBuffer::shared)),
//! each rank can instead map its peers' buffers ([`window`]) and own one slice of the result
//! outright: it reads that slice of every rank's input once, reduces it a few cache lines at a
//! time, and writes each line of the result at once into every rank's output (NCCL's P2P
//! transport with direct pointers and MPI's XPMEM collectives work the same way). Each input
//! is read once and each output written once, with no staging and no second pass.
//!
//! Two small all-to-all exchanges over the communicator's connections order the call:
//! before it, every rank says where its buffers are (and so that it has entered the call,
//! and its input is written); after it, that it has finished writing into the others'
//! outputs and reading their inputs, so that each may return and reuse its buffers. The
//! first call also agrees that every rank could map every other's memory; if one could not,
//! the communicator stops trying and every call runs the ring, as it does whenever one
//! rank's buffers are not shared (heap memory, a device): the copy path stays for memory
//! that cannot be mapped. Every rank sees every description, so all take the same path.

mod mailbox;
pub(crate) mod window;

use crate::algorithms::grouped::{exchange, Xfer};
use crate::algorithms::ring;
use crate::dtype::{DataType, ReduceOp};
use crate::element::{self, Element, LINE};
use crate::engine::data::{bytes_of, Data};
use crate::error::CommError;
use crate::link::Communicator;
use crate::with_dtype;
use smallvec::SmallVec;
use window::{Key, Windows};

/// First word of a description: tells a rank that its peer runs this algorithm (and this
/// layout) rather than another that happens to send on the same channel.
const MAGIC: u64 = u64::from_le_bytes(*b"bbwdir01");
/// Words of one rank's description: magic, shareable, bytes, spare, then the send buffer's
/// and the receive buffer's [`Key`]s.
const WORDS: usize = 16;
/// The chunk reduced at a time where there is no fused kernel (the narrow floats): small
/// enough to stay in L1 with its scratch twin, large enough that a kernel call's fixed cost
/// is noise.
const CHUNK_BYTES: usize = 16 << 10;
/// Out-of-place calls from this size on write their outputs with streaming stores: measured
/// on 2 ranks (Zen 4, 1 MiB L2 per core) 1.1-1.3x at 128 KiB rotating, 1.4-2.3x from 256 KiB up,
/// and no slower without rotation from 256 KiB on (in BENCHMARKS.md's history). On an
/// Intel Xeon of 2026 (2 MiB L2) streaming is 1.05-1.09x slower from 256 KiB to 16 MiB, where
/// the loop's buffers stay in its last-level cache, and 1.6x faster from 64 MiB: the cost is
/// lopsided, so such calls stream unless their output is known to be cached (a call that
/// rewrites the last call's output inside the L2, [`reduce_slice`]). The fused kernel keeps
/// that trade: ordinary stores 1.04-1.09x faster at 4 and 16 MiB, 1.5-1.8x slower at 64 MiB
/// (2026-12-05). Choosing per size from the first calls' timings was tried and dropped: after
/// a switch of store kind the cache takes more calls to settle than a benchmark's warm-up
/// gives, and the trial picked the slow kind at 2 and 16 MiB.
const STREAM_MIN_BYTES: usize = 256 << 10;
/// A core's L2 where sysfs does not say: the smallest of current server cores'.
const L2_GUESS: usize = 1 << 20;
/// Channel of the exchanges: the ring's. Calls never overlap, so sharing it is safe.
const CHANNEL: u32 = 0;

/// Whether every rank could map every other's memory, agreed on the first direct call (and
/// by the GPU-to-GPU path, on its first call with device data).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Agreed {
    #[default]
    Unknown,
    Yes,
    No,
}

/// What the direct AllReduce keeps on a communicator between calls.
#[derive(Default)]
pub(crate) struct Direct {
    windows: Windows,
    agreed: Agreed,
    /// Every rank's description of the current call (ours at our rank).
    descs: Vec<[u64; WORDS]>,
    /// Every rank's status in the agreement and the final exchange.
    flags: Vec<u8>,
    /// The chunk being reduced, and a premultiplied input (`mulsum`). Words, so that every
    /// element type is aligned in them.
    acc: Vec<u64>,
    tmp: Vec<u64>,
    /// Calls that ran directly and calls that ran the ring instead, with the last reason.
    ran: u64,
    fell_back: u64,
    why: Option<Fallback>,
    /// The small-message path's mailboxes, set up on the first small call.
    mail: Mail,
    /// The last out-of-place call's output (address, bytes): written again at once, it is
    /// still in this core's cache if small enough.
    last_out: (usize, usize),
}

impl crate::link::Kept for Direct {
    const SLOT: usize = 2;
}

#[derive(Default)]
enum Mail {
    #[default]
    Unknown,
    Ready(mailbox::Mailboxes),
    /// Some rank could not map another's mailbox: small calls take the mapping path.
    No,
}

/// Why a direct AllReduce ran the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// The communicator is not one host's ranks talking through shared memory (one rank,
    /// ranks on several hosts, or a transport asked for by name).
    NotLocal,
    /// Some rank's buffers are not shared memory (heap or device memory, or empty).
    NotShared,
    /// Some rank could not map a peer's buffers (permissions, pid namespaces).
    Unmappable,
}

impl Fallback {
    pub fn describe(self) -> &'static str {
        match self {
            Fallback::NotLocal => {
                "the ranks are not all on one host talking through shared memory (--transport shm or auto)"
            }
            Fallback::NotShared => "a rank's buffers are not shared memory (device or heap memory)",
            Fallback::Unmappable => {
                "a rank could not map its peers' buffers (/proc/<pid>/fd access: ptrace policy or \
                 separate pid namespaces; under BUSBW_PLATFORM=portable, separate /dev/shm)"
            }
        }
    }
}

/// How a communicator's direct AllReduce calls ran: (direct, ring instead, why the last
/// one ran the ring).
pub fn tally(comm: &Communicator) -> (u64, u64, Option<Fallback>) {
    comm.peek::<Direct>()
        .map_or((0, 0, None), |d| (d.ran, d.fell_back, d.why))
}

/// Whether the direct AllReduce can run on `comm` at all: allowed by its configuration
/// (the job moves local data through shared memory), at least two ranks, all on one host.
/// Every rank computes the same answer.
pub fn applicable(comm: &Communicator) -> bool {
    comm.config().map_peers && comm.size() >= 2 && comm.node_map().node_count() == 1
}

/// AllReduce by reading and writing peers' buffers in place; same contract as
/// [`crate::all_reduce`]. Where the call cannot run that way (see the module's
/// documentation) it runs the ring instead and returns `false`; every rank returns the same.
pub fn direct_all_reduce(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<bool, CommError> {
    let why = if !applicable(comm) {
        Some(Fallback::NotLocal)
    } else if !data.on_host() || count == 0 {
        Some(Fallback::NotShared)
    } else {
        None
    };
    if let Some(why) = why {
        let d = comm.kept::<Direct>();
        d.fell_back += 1;
        d.why = Some(why);
        return ring::all_reduce(comm, data, count, dtype, op).map(|()| false);
    }
    let bytes = bytes_of(count, dtype)?;
    let b = data.bufs(
        comm.rank(),
        "direct_all_reduce",
        bytes,
        bytes,
        dtype,
        (0, 0),
    )?;
    let mut st = std::mem::take(comm.kept::<Direct>());
    // Small calls through the mailboxes where they could be set up, else the mapped buffers.
    let r = (|| {
        if bytes <= mailbox::MAX_BYTES && small(comm, &mut st, b.src, b.dst, count, dtype, op)? {
            return Ok(None);
        }
        with_dtype!(dtype, T => {
            // SAFETY: Data::bufs checked sizes and alignment; the borrows outlive the call.
            unsafe { run::<T>(comm, &mut st, b.src as *const T, b.dst as *mut T, count, op) }
        })
    })();
    let d = comm.kept::<Direct>();
    *d = st;
    match r? {
        None => {
            d.ran += 1;
            return Ok(true);
        }
        Some(why) => {
            d.fell_back += 1;
            d.why = Some(why);
        }
    }
    // SAFETY: the very buffers `data` lent for this call (Data::bufs checked them for
    // `bytes`); nothing else holds them until the call returns.
    let again = unsafe {
        if std::ptr::eq(b.src, b.dst) {
            Data::in_place(std::slice::from_raw_parts_mut(b.dst, bytes))
        } else {
            Data::out_of_place(
                std::slice::from_raw_parts(b.src, bytes),
                std::slice::from_raw_parts_mut(b.dst, bytes),
            )
        }
    };
    ring::all_reduce(comm, again, count, dtype, op).map(|()| false)
}

/// A small call through the mailboxes, setting them up on the first; `false` where some rank
/// could not map another's mailbox (every rank alike).
fn small(
    comm: &mut Communicator,
    st: &mut Direct,
    src: *const u8,
    dst: *mut u8,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<bool, CommError> {
    if matches!(st.mail, Mail::Unknown) {
        st.mail = open_mailboxes(comm)?;
    }
    let Mail::Ready(boxes) = &mut st.mail else {
        return Ok(false);
    };
    with_dtype!(dtype, T => {
        // SAFETY: Data::bufs checked sizes and alignment; every rank makes the same call.
        unsafe { boxes.all_reduce::<T>(comm, src as *const T, dst as *mut T, count, op)? }
    });
    Ok(true)
}

/// Creates this rank's mailbox, trades keys with every peer, maps theirs, and agrees that
/// every rank could.
fn open_mailboxes(comm: &mut Communicator) -> Result<Mail, CommError> {
    let (me, n) = (comm.rank(), comm.size());
    let created = mailbox::Mailboxes::create();
    let mut keys = vec![[0u64; 8]; n];
    keys[me][0] = MAGIC;
    if let Some((_, k)) = &created {
        keys[me][1] = 1;
        put(&mut keys[me][2..8], k);
    }
    // SAFETY: one entry per rank.
    unsafe { all_to_all(comm, &mut keys, "direct_all_reduce: trading mailboxes")? };
    if let Some(p) = keys.iter().position(|k| k[0] != MAGIC) {
        return Err(CommError::Invalid(format!(
            "rank {me}: direct_all_reduce: rank {p} is not running the direct AllReduce \
             (ranks disagree about the algorithm)"
        )));
    }
    let opened = match created {
        Some((own, _)) if keys.iter().all(|k| k[1] == 1) => {
            let all: Vec<Key> = keys.iter().map(|k| key(&k[2..8])).collect();
            mailbox::Mailboxes::open(own, &all, me).ok()
        }
        _ => None,
    };
    let mut ok = vec![0u8; n];
    ok[me] = u8::from(opened.is_some());
    // SAFETY: as above.
    unsafe { all_to_all(comm, &mut ok, "direct_all_reduce: agreeing on mailboxes")? };
    Ok(match opened {
        Some(b) if !ok.contains(&0) => Mail::Ready(b),
        _ => Mail::No,
    })
}

fn put(words: &mut [u64], k: &Key) {
    words.copy_from_slice(&k.to_words());
}

fn key(words: &[u64]) -> Key {
    Key::from_words(words)
}

/// Sends `items[me]` to every peer and receives `items[p]` from each.
///
/// # Safety
/// `items` has one entry per rank.
pub(crate) unsafe fn all_to_all<E: Copy>(
    comm: &mut Communicator,
    items: &mut [E],
    name: &'static str,
) -> Result<(), CommError> {
    all_to_all_rows(comm, items, 1, name)
}

/// [`all_to_all`] with a row of `per` entries per rank: rows `me` goes to every peer and
/// row `p` comes from each.
///
/// # Safety
/// `items` has `per` entries per rank.
pub(crate) unsafe fn all_to_all_rows<E: Copy>(
    comm: &mut Communicator,
    items: &mut [E],
    per: usize,
    name: &'static str,
) -> Result<(), CommError> {
    let (me, n) = (comm.rank(), comm.size());
    let size = std::mem::size_of::<E>() * per;
    let base = items.as_mut_ptr() as *mut u8;
    let mut xfers: SmallVec<[Xfer; 16]> = SmallVec::new();
    for p in (0..n).filter(|&p| p != me) {
        xfers.push(Xfer::Send {
            peer: p,
            ptr: base.add(me * size),
            len: size,
        });
        xfers.push(Xfer::Recv {
            peer: p,
            ptr: base.add(p * size),
            len: size,
        });
    }
    // The send reads entry `me`, each receive writes its own entry: nothing overlaps.
    exchange(
        comm,
        &xfers,
        &[(base as *const u8, n * size)],
        CHANNEL,
        name,
    )
}

/// This rank's slice `[lo, hi)` of `count` elements of `esize` bytes among `n` ranks. Slices
/// start on cache lines, so that no two ranks write one line.
pub(crate) fn slice(count: usize, esize: usize, n: usize, rank: usize) -> (usize, usize) {
    let align = (LINE / esize).max(1);
    let per = count.div_ceil(n).div_ceil(align) * align;
    let lo = (rank * per).min(count);
    (lo, (lo + per).min(count))
}

/// # Safety
/// `src` and `dst` are valid for `count` elements (they may be the same buffer).
unsafe fn run<T: Element>(
    comm: &mut Communicator,
    st: &mut Direct,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
) -> Result<Option<Fallback>, CommError> {
    let (me, n) = (comm.rank(), comm.size());
    let esize = std::mem::size_of::<T>();
    let bytes = count * esize;
    st.windows.begin();
    let mut mine = [0u64; WORDS];
    mine[0] = MAGIC;
    mine[2] = bytes as u64;
    let keys = (
        window::key_of(src as *const u8, bytes),
        window::key_of(dst as *const u8, bytes),
    );
    if let (Some(ks), Some(kd), false) = (keys.0, keys.1, st.agreed == Agreed::No) {
        mine[1] = 1;
        put(&mut mine[4..10], &ks);
        put(&mut mine[10..16], &kd);
    }
    st.descs.clear();
    st.descs.resize(n, [0; WORDS]);
    st.descs[me] = mine;
    all_to_all(comm, &mut st.descs, "direct_all_reduce: describing buffers")?;
    for (p, d) in st.descs.iter().enumerate() {
        if d[0] != MAGIC {
            return Err(CommError::Invalid(format!(
                "rank {me}: direct_all_reduce: rank {p} is not running the direct AllReduce \
                 (ranks disagree about the algorithm)"
            )));
        }
        if d[2] != bytes as u64 {
            return Err(CommError::short_message(
                me,
                "direct_all_reduce",
                p,
                d[2] as usize,
                bytes,
            ));
        }
    }
    if st.descs.iter().any(|d| d[1] == 0) {
        return Ok(Some(if st.agreed == Agreed::No {
            Fallback::Unmappable
        } else {
            Fallback::NotShared
        }));
    }
    // Every peer's input and output, mapped here; our own as they are.
    let mut inputs: SmallVec<[*const T; 16]> = SmallVec::new();
    let mut outputs: SmallVec<[*mut T; 16]> = SmallVec::new();
    let mut failed = None;
    for (p, d) in st.descs.iter().enumerate() {
        if p == me {
            inputs.push(src);
            outputs.push(dst);
            continue;
        }
        let w = &mut st.windows;
        let mapped = w
            .map(p, &key(&d[4..10]), bytes as u64)
            .and_then(|i| Ok((i, w.map(p, &key(&d[10..16]), bytes as u64)?)));
        match mapped {
            Ok((i, o)) => {
                inputs.push(i as *const T);
                outputs.push(o as *mut T);
            }
            Err(e) => {
                failed.get_or_insert(format!("mapping rank {p}'s buffers: {e}"));
                inputs.push(std::ptr::null());
                outputs.push(std::ptr::null_mut());
            }
        }
    }
    if st.agreed == Agreed::Unknown {
        st.flags.clear();
        st.flags.resize(n, 0);
        st.flags[me] = u8::from(failed.is_none());
        all_to_all(comm, &mut st.flags, "direct_all_reduce: agreeing to map")?;
        if st.flags.contains(&0) {
            // Nothing has been written: every rank runs another algorithm, now and later.
            st.agreed = Agreed::No;
            return Ok(Some(Fallback::Unmappable));
        }
        st.agreed = Agreed::Yes;
    }
    if failed.is_none() {
        reduce_slice(st, &inputs, &outputs, count, op, me);
    }
    st.flags.clear();
    st.flags.resize(n, 0);
    st.flags[me] = u8::from(failed.is_none());
    all_to_all(comm, &mut st.flags, "direct_all_reduce: finishing")?;
    if let Some(cause) = failed {
        return Err(CommError::Invalid(format!(
            "rank {me}: direct_all_reduce: {cause}"
        )));
    }
    if let Some(p) = st.flags.iter().position(|&f| f == 0) {
        return Err(CommError::Invalid(format!(
            "rank {me}: direct_all_reduce: rank {p} could not map its peers' buffers, so its \
             slice of the result is missing (its own error says why)"
        )));
    }
    Ok(None)
}

/// Reduces this rank's slice of every input and writes it into every output: in one pass
/// ([`element::reduce_to_all`]) or chunk by chunk.
///
/// # Safety
/// Every pointer is valid for `count` elements; no two outputs overlap another rank's slice
/// of an input this rank reads after writing it (each output chunk is written after the
/// chunk's inputs are read).
unsafe fn reduce_slice<T: Element>(
    st: &mut Direct,
    inputs: &[*const T],
    outputs: &[*mut T],
    count: usize,
    op: ReduceOp,
    me: usize,
) {
    let n = inputs.len();
    let esize = std::mem::size_of::<T>();
    let (lo, hi) = slice(count, esize, n, me);
    // Out of place, the outputs are not read again by this call or (in a benchmark's loop)
    // the next: stream them past the cache from STREAM_MIN_BYTES on. In place, the output
    // is the next call's input, which streaming would evict (measured slower at every size).
    // Nor where this call writes the very output the last one wrote and all this rank reads
    // and writes fits its L2: those lines are still there, and streaming would only send them
    // to memory (the 2026 Xeon: 2x slower at 256 KiB so).
    let bytes = count * esize;
    let out = (outputs[me] as usize, bytes);
    let oop = !std::ptr::eq(inputs[me], outputs[me]);
    let resident = st.last_out == out && 2 * bytes <= l2_bytes();
    let stream = oop && bytes >= STREAM_MIN_BYTES && !resident;
    if oop {
        st.last_out = out;
    }
    // Reads and writes interleaved a few lines at a time, where the type has such a kernel;
    // otherwise (the narrow floats) chunk by chunk through L1.
    let pass = element::Pass {
        inputs,
        outputs,
        lo,
        hi,
        stream,
    };
    if element::reduce_to_all(op, &pass) {
        if stream {
            store_fence();
        }
        return;
    }
    let chunk = CHUNK_BYTES / esize;
    let words = CHUNK_BYTES / 8;
    st.acc.resize(words, 0);
    st.tmp.resize(words, 0);
    let acc = std::slice::from_raw_parts_mut(st.acc.as_mut_ptr() as *mut T, chunk);
    let tmp = std::slice::from_raw_parts_mut(st.tmp.as_mut_ptr() as *mut T, chunk);
    let mut at = lo;
    while at < hi {
        let len = chunk.min(hi - at);
        let input = |p: usize| std::slice::from_raw_parts(inputs[p].add(at), len);
        let acc = &mut acc[..len];
        reduce_all(op, n, acc, &mut tmp[..len], input);
        for &out in outputs {
            if stream {
                copy_streaming(
                    out.add(at) as *mut u8,
                    acc.as_ptr() as *const u8,
                    len * esize,
                );
            } else {
                std::ptr::copy_nonoverlapping(acc.as_ptr(), out.add(at), len);
            }
        }
        at += len;
    }
    if stream {
        store_fence();
    }
}

/// This core's L2, read once from sysfs (virtual machines report it as it is; the
/// last-level cache they report can be their host's, or made up).
fn l2_bytes() -> usize {
    static L2: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L2.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index2/size")
            .ok()
            .and_then(|t| parse_cache_size(&t))
            .unwrap_or(L2_GUESS)
    })
}

/// sysfs's cache size: `2048K`, `1M`, or bytes.
fn parse_cache_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.as_bytes().last()? {
        b'K' => (&t[..t.len() - 1], 1 << 10),
        b'M' => (&t[..t.len() - 1], 1 << 20),
        b'G' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

/// `out` = every rank's input (`input(p)`) reduced in rank order, so that the bits do not
/// depend on which rank computes them; `mulsum` premultiplies each through `tmp`, `avg`
/// divides at the end. `out` must not overlap an input.
pub(crate) fn reduce_all<'i, T: Element + 'i>(
    op: ReduceOp,
    n: usize,
    out: &mut [T],
    tmp: &mut [T],
    input: impl Fn(usize) -> &'i [T],
) {
    if op == ReduceOp::MulSum {
        element::scale_into(out, input(0), 0);
        for p in 1..n {
            element::scale_into(tmp, input(p), p);
            element::reduce_inplace(op, out, tmp);
        }
    } else {
        element::reduce_into(op, out, input(0), input(1));
        for p in 2..n {
            element::reduce_inplace(op, out, input(p));
        }
    }
    if op == ReduceOp::Avg {
        element::finish_avg(out, n);
    }
}

/// Copies with non-temporal stores: the result goes to memory without first reading every
/// destination line into this core's cache (a write of a line not cached costs a read for
/// ownership, which doubles the traffic of an output far larger than the cache).
///
/// # Safety
/// Both ranges are valid for `len` bytes and do not overlap. Followed by [`store_fence`]
/// before anyone else is told that the data is there.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; the caller's contract is this function's.
        return copy_streaming_avx512(dst, src, len);
    }
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = (dst.align_offset(16)).min(len);
    std::ptr::copy_nonoverlapping(src, dst, head);
    let mut i = head;
    while i + 64 <= len {
        // SAFETY: SSE2 is part of x86_64; `dst + i` is 16-byte aligned.
        for k in (0..64).step_by(16) {
            let v = _mm_loadu_si128(src.add(i + k) as *const __m128i);
            _mm_stream_si128(dst.add(i + k) as *mut __m128i, v);
        }
        i += 64;
    }
    std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
}

/// [`copy_streaming`] a full cache line per store: one write-combining buffer filled by one
/// instruction instead of four.
///
/// # Safety
/// As [`copy_streaming`]; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy_streaming_avx512(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_stream_si512};
    let head = (dst.align_offset(64)).min(len);
    std::ptr::copy_nonoverlapping(src, dst, head);
    let mut i = head;
    while i + 64 <= len {
        // SAFETY: `dst + i` is 64-byte aligned; both ranges hold 64 bytes from `i`.
        let v = _mm512_loadu_si512(src.add(i) as *const __m512i);
        _mm512_stream_si512(dst.add(i) as *mut __m512i, v);
        i += 64;
    }
    std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    std::ptr::copy_nonoverlapping(src, dst, len);
}

/// Orders the streaming stores before the stores that follow (the exchange that tells peers
/// the result is there).
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("2048K\n"), Some(2 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("524288"), Some(512 << 10));
        assert_eq!(parse_cache_size("lots"), None);
        assert_eq!(parse_cache_size(""), None);
        assert!(l2_bytes() >= 64 << 10, "an L2 of {} bytes", l2_bytes());
    }

    #[test]
    fn slices_cover_the_buffer_on_cache_lines() {
        for (count, esize, n) in [
            (1, 4, 2),
            (17, 4, 2),
            (1000, 2, 3),
            (1 << 20, 8, 8),
            (5, 1, 8),
        ] {
            let mut next = 0;
            for r in 0..n {
                let (lo, hi) = slice(count, esize, n, r);
                assert_eq!(lo, next, "{count} {esize} {n} {r}");
                assert!(hi >= lo);
                if lo < count {
                    assert_eq!(lo * esize % LINE, 0);
                }
                next = hi;
            }
            assert_eq!(next, count);
        }
    }
}
