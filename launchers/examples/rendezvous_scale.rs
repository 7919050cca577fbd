//! Rendezvous at scale: N simulated ranks against one TCP store, each rank with its own
//! connection, going through the bootstrap a job's session uses (`busbw_launchers::bootstrap`):
//! the configuration verdict, the records and node map, every rank's ring and tree
//! neighbours' records, and the device lines gathered to rank 0.
//!
//! `cargo run --release -p busbw-launchers --example rendezvous_scale -- [N] [--threads T]
//! [--per-node P] [--handle BYTES] [--connections C]` (defaults: 4096 ranks, 64 threads, 8
//! ranks per node, 192-byte handles, about a multi-transport handle; a connection per rank
//! as far as the open-file limit allows, at most C).
//!
//! Prints the time until every rank is connected, until every record is published, until
//! every rank is ready (holds the node map and its neighbours' records) and until rank 0
//! holds every rank's device line, and the bytes the store served, counted as they were
//! written (the server) and read (each rank's client).
//!
//! Why not a thread per rank: a process cannot hold 32768 threads here. Thread ids come from
//! the system-wide pid space (`kernel.pid_max`, 32768 by default), and each Rust thread maps
//! its stack and its signal stack, each with a guard page (4 mappings against
//! `vm.max_map_count`, 65530 by default: about 16000 threads). So rank 0 runs on its own
//! thread, as it would in a job, and a pool of threads drives the other ranks phase by
//! phase through the same calls a rank makes (propose, verdict, register, layout, fetch).
//! Only the client side is batched: the store sees every request a job's ranks would send.
//! A real job's clients also run on their own hosts, not on the store's cores as here.
//!
//! Each rank has its own connection as far as the open-file limit allows: a connection
//! costs this one process three descriptors (the client's socket, the duplicate it keeps to
//! interrupt a blocked request, the store's end), and the limit is raised to fit when the
//! hard limit allows or the process may raise it. Where it may not, ranks share
//! connections (each used by one pool thread only, so a rank's requests and bytes are still
//! its own), which leaves out the greeting of the connections not made; the first line says
//! how many connections the run used.

use busbw_collectives::neighbours;
use busbw_launchers::bootstrap::{Bootstrap, Record};
use busbw_launchers::store::{TcpStoreClient, TcpStoreServer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(120);
const TOKEN: &str = "rendezvous-scale";
/// Loopback addresses the ranks spread over: one address has about 28000 ephemeral ports
/// (`net.ipv4.ip_local_port_range`), fewer than the ranks.
const ADDRESSES: usize = 8;

struct Args {
    ranks: usize,
    /// At most this many connections (as if the open-file limit allowed no more).
    connections: usize,
    threads: usize,
    per_node: usize,
    handle: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        ranks: 4096,
        connections: usize::MAX,
        threads: 64,
        per_node: 8,
        handle: 192,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|&v| v > 0)
                .ok_or(format!("{name} takes a positive number"))
        };
        match arg.as_str() {
            "--threads" => a.threads = value("--threads")?,
            "--connections" => a.connections = value("--connections")?,
            "--per-node" => a.per_node = value("--per-node")?,
            "--handle" => a.handle = value("--handle")?,
            n => a.ranks = n.parse().map_err(|_| format!("unknown argument {n:?}"))?,
        }
    }
    if a.ranks < 2 {
        return Err("a job needs at least 2 ranks".into());
    }
    Ok(a)
}

/// Every connection is a client socket, the duplicate its client keeps to interrupt it, and
/// the store's end: raise the open-file limit to give every rank its own connection if the
/// hard limit allows (or this process may raise it), and say how many connections fit.
fn open_files_for(ranks: usize) -> Result<usize, String> {
    let need = (3 * ranks + 1024) as libc::rlim_t;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the one struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if lim.rlim_cur < need {
        let want = libc::rlimit {
            rlim_cur: need,
            rlim_max: lim.rlim_max.max(need),
        };
        let capped = libc::rlimit {
            rlim_cur: lim.rlim_max.min(need),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            lim = want;
        } else if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &capped) } == 0 {
            eprintln!(
                "rendezvous_scale: {ranks} ranks need about {need} open files (a socket and \
                 its duplicate per rank, and the store's end); the hard limit is {} and this \
                 process may not raise it ({}): ranks share connections",
                lim.rlim_max,
                std::io::Error::last_os_error()
            );
            lim = capped;
        } else {
            return Err(std::io::Error::last_os_error().to_string());
        }
    }
    Ok(((lim.rlim_cur as usize).saturating_sub(1024) / 3).min(ranks))
}

fn connect(addr: &str) -> Result<Arc<TcpStoreClient>, String> {
    TcpStoreClient::connect_with_token(addr, TIMEOUT, Some(TOKEN))
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Everything one rank does, start to finish: what rank 0 runs on its own thread. Returns
/// the bytes the store answered its requests with.
fn whole_rank(a: &Args, addr: &str, r: usize, at: &Stamps) -> Result<u64, String> {
    let client = connect(addr)?;
    let greeted = client.bytes_received();
    let boot = Bootstrap::new(client.clone(), r, a.ranks, TIMEOUT);
    at.mark(Phase::Agreed, boot.agree("flags"))?;
    let record = Record::simulated(r, a.per_node, a.handle);
    at.mark(Phase::Registered, boot.register(&record))?;
    let mut joined = boot.layout().map_err(|e| e.to_string())?;
    let first = neighbours(&joined.layout.nodes, r);
    at.mark(Phase::Ready, joined.directory.prefetch(&first))?;
    let routes = boot.gather_root("route", b"tcp").map(|_| ());
    at.mark(Phase::Gathered, routes)?;
    Ok(client.bytes_received() - greeted)
}

#[derive(Clone, Copy)]
enum Phase {
    Connected,
    Agreed,
    Registered,
    Ready,
    Gathered,
}

/// When each phase ended (the latest of its ranks), and the first error.
struct Stamps {
    start: Instant,
    at: Mutex<([Option<Duration>; 5], Option<String>)>,
    /// The pool's decision to stop after a failure.
    stop: AtomicBool,
}

impl Stamps {
    fn failed(&self) -> bool {
        self.at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .is_some()
    }

    /// `phase` ended now for some ranks (or, `None`, a step that is no phase's end did),
    /// or failed; the result goes on, as text.
    fn mark<E: std::fmt::Display>(
        &self,
        phase: impl Into<Option<Phase>>,
        result: Result<(), E>,
    ) -> Result<(), String> {
        let now = self.start.elapsed();
        let mut g = self.at.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => {
                if let Some(p) = phase.into() {
                    let slot = &mut g.0[p as usize];
                    *slot = Some(slot.map_or(now, |t| t.max(now)));
                }
                Ok(())
            }
            Err(e) => Err(g.1.get_or_insert(e.to_string()).clone()),
        }
    }
}

/// One pool thread's ranks over its connections (rank `i` on connection `i % len`; only this
/// thread uses them, so a client never opens a second one), and the bytes the store answered
/// each rank's requests with.
struct Ranks {
    boots: Vec<Bootstrap>,
    clients: Vec<Arc<TcpStoreClient>>,
    bytes: Vec<u64>,
}

impl Ranks {
    fn each(&mut self, f: impl Fn(&Bootstrap) -> Result<(), String>) -> Result<(), String> {
        for (i, b) in self.boots.iter().enumerate() {
            let c = &self.clients[i % self.clients.len()];
            let before = c.bytes_received();
            f(b)?;
            self.bytes[i] += c.bytes_received() - before;
        }
        Ok(())
    }
}

/// Run one pool thread's share of the job phase by phase, `sync` between phases; after a
/// failure (here or on rank 0) every pool thread stops at the same phase.
fn pool(
    a: &Args,
    ranks: &[usize],
    conns: usize,
    addrs: &[String],
    sync: &Barrier,
    at: &Stamps,
) -> Vec<u64> {
    let step = |phase: Option<Phase>, result: Result<(), String>| -> bool {
        let _ = at.mark(phase, result);
        // One thread decides for all, so that none goes on to a barrier the others left.
        if sync.wait().is_leader() {
            at.stop.store(at.failed(), Ordering::SeqCst);
        }
        sync.wait();
        !at.stop.load(Ordering::SeqCst)
    };
    let opened: Result<Vec<_>, String> = (0..conns)
        .map(|c| connect(&addrs[(ranks.first().unwrap_or(&0) + c) % addrs.len()]))
        .collect();
    let mut me = Ranks {
        boots: Vec::new(),
        clients: opened.as_ref().map_or(Vec::new(), Clone::clone),
        bytes: vec![0; ranks.len()],
    };
    for (i, &r) in ranks.iter().enumerate() {
        if let Some(c) = me.clients.get(i % conns) {
            me.boots
                .push(Bootstrap::new(c.clone(), r, a.ranks, TIMEOUT));
        }
    }
    if !step(Some(Phase::Connected), opened.map(|_| ())) {
        return me.bytes;
    }
    let err = |e: busbw_launchers::bootstrap::BootstrapError| e.to_string();
    let proposed = me.each(|b| b.propose("flags").map_err(err));
    if !step(None, proposed) {
        return me.bytes;
    }
    let agreed = me.each(|b| b.verdict("flags").map_err(err));
    if !step(Some(Phase::Agreed), agreed) {
        return me.bytes;
    }
    let registered = me.each(|b| {
        b.register(&Record::simulated(b.rank(), a.per_node, a.handle))
            .map_err(err)
    });
    if !step(Some(Phase::Registered), registered) {
        return me.bytes;
    }
    let ready = me.each(|b| {
        let mut joined = b.layout().map_err(err)?;
        let first = neighbours(&joined.layout.nodes, b.rank());
        joined.directory.prefetch(&first).map_err(err)?;
        let want = Record::simulated(first[0], a.per_node, a.handle);
        match joined.directory.cached(first[0]) {
            Some(got) if *got == want => Ok(()),
            _ => Err(format!(
                "rank {} got a wrong record of rank {}",
                b.rank(),
                first[0]
            )),
        }
    });
    if !step(Some(Phase::Ready), ready) {
        return me.bytes;
    }
    let gathered = me.each(|b| b.gather_root("route", b"tcp").map(|_| ()).map_err(err));
    step(Some(Phase::Gathered), gathered);
    me.bytes
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rendezvous_scale: {e}");
            std::process::exit(2);
        }
    };
    let conns = match open_files_for(a.ranks.min(a.connections)) {
        Ok(c) => c.saturating_sub(1),
        Err(e) => {
            eprintln!("rendezvous_scale: cannot read or set the open-file limit: {e}");
            std::process::exit(1);
        }
    };
    let server = match TcpStoreServer::bind_with_token(([0, 0, 0, 0], 0).into(), Some(TOKEN)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rendezvous_scale: {e}");
            std::process::exit(1);
        }
    };
    let port = server.local_addr().port();
    let addrs: Vec<String> = (1..=ADDRESSES)
        .map(|i| format!("127.0.0.{i}:{port}"))
        .collect();
    let threads = a.threads.min(a.ranks - 1);
    let share = |t: usize| (conns / threads + usize::from(t < conns % threads)).max(1);
    let connections = 1 + (0..threads).map(share).sum::<usize>();
    let stamps = Stamps {
        start: Instant::now(),
        at: Mutex::new(([None; 5], None)),
        stop: AtomicBool::new(false),
    };
    let sync = Barrier::new(threads);
    let (rank0, others) = std::thread::scope(|s| {
        let (a, at, addrs, sync) = (&a, &stamps, &addrs, &sync);
        let rank0 = s.spawn(move || whole_rank(a, &addrs[0], 0, at));
        let pool: Vec<_> = (0..threads)
            .map(|t| {
                let ranks: Vec<usize> = (1..a.ranks).filter(|r| r % threads == t).collect();
                let share = &share;
                s.spawn(move || pool(a, &ranks, share(t), addrs, sync, at))
            })
            .collect();
        let others: Vec<u64> = pool
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect();
        (
            rank0
                .join()
                .unwrap_or_else(|_| Err("rank 0 panicked".into())),
            others,
        )
    });
    let (at, error) = stamps.at.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = error.or(rank0.as_ref().err().cloned()) {
        eprintln!("rendezvous_scale: {e}");
        std::process::exit(1);
    }
    let secs = |p: Phase| at[p as usize].map_or(f64::NAN, |d| d.as_secs_f64());
    let rank0 = rank0.unwrap_or(0);
    let mean = others.iter().sum::<u64>() / others.len().max(1) as u64;
    let max = others.iter().copied().max().unwrap_or(0);
    println!(
        "rendezvous_scale: {} ranks ({} per node) on {} connections, {}-byte handles, {threads} client threads",
        a.ranks,
        a.per_node,
        connections,
        a.handle
    );
    println!(
        "  connected   {:7.3} s  every connection is open and greeted",
        secs(Phase::Connected)
    );
    println!(
        "  agreed      {:7.3} s  every rank has rank 0's verdict on the flags",
        secs(Phase::Agreed)
    );
    println!(
        "  registered  {:7.3} s  every record is published",
        secs(Phase::Registered)
    );
    println!(
        "  ready       {:7.3} s  every rank holds the node map and its ring and tree neighbours' records",
        secs(Phase::Ready)
    );
    println!(
        "  gathered    {:7.3} s  rank 0 holds every rank's device line",
        secs(Phase::Gathered)
    );
    println!(
        "  served      {:.2} MB in all (greetings included); per rank, answers to its requests: \
         rank 0 {:.2} MB, the others {mean} B mean, {max} B max",
        server.bytes_sent() as f64 / 1e6,
        rank0 as f64 / 1e6,
    );
}
