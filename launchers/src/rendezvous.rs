//! The job's control plane on top of the store: who serves it, barriers, abort broadcast and
//! an orderly shutdown.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use busbw_transports::Abort;

use crate::store::{MemoryStore, Store, StoreError, TcpStoreClient, TcpStoreServer};
use crate::world::World;

/// Inherited listening socket for rank 0's store, set by the local launcher.
pub const STORE_FD_ENV: &str = "BUSBW_STORE_FD";
/// Key whose appearance tells every rank to stop; its value says why.
pub const ABORT_KEY: &str = "abort";
const FINISH_COUNT: &str = "finish/count";
const FINISH_DONE: &str = "finish/done";
/// How often the abort watcher re-issues its WAIT. It only bounds how late a watcher notices
/// `finish`, not how late it notices an abort (the server answers the WAIT at once).
const WATCH_POLL: Duration = Duration::from_secs(1);
/// After an abort, how long rank 0 keeps serving for the survivors to check out.
const ABORT_LINGER: Duration = Duration::from_secs(2);

/// A joined job: the store every rank shares and, on rank 0, the server behind it.
pub struct Rendezvous {
    pub store: Arc<dyn Store>,
    server: Mutex<Option<TcpStoreServer>>,
    rank: usize,
    size: usize,
    /// `host:port` of the TCP store, `None` for an in-process one.
    addr: Option<String>,
    /// Presented again by the abort watcher's own connection.
    token: Option<String>,
    timeout: Duration,
    /// Set before this rank checks out, so a watcher that then loses the store knows the loss
    /// is the normal end of the job and not rank 0 dying.
    finished: Arc<AtomicBool>,
    /// Ranks rank 0 does not wait for at check-out ([`Rendezvous::excuse`]).
    excused: std::sync::atomic::AtomicUsize,
    watchers: Mutex<Vec<Watcher>>,
    barrier_generation: Mutex<HashMap<String, u64>>,
}

struct Watcher {
    thread: JoinHandle<()>,
    client: Option<Arc<TcpStoreClient>>,
}

/// Join the job described by `world`, which has no job token. See [`rendezvous_with`].
pub fn rendezvous(world: &World, timeout: Duration) -> Result<Rendezvous, StoreError> {
    rendezvous_with(world, timeout, None)
}

/// Join the job described by `world`; with a `token`, only connections presenting the same
/// token reach the store (see [`crate::token`]), so a rank of another job that was given the
/// same port is turned away instead of being counted as one of ours.
///
/// Rank 0 serves the store (on the socket inherited through `BUSBW_STORE_FD` if the local
/// launcher passed one, else on `MASTER_PORT` on all interfaces) and then, like every other
/// rank, talks to it as a client through `MASTER_ADDR:MASTER_PORT`, so all ranks exercise the
/// same path. A single rank with no address gets an in-process store. `timeout` bounds the
/// wait for rank 0 to come up and is reused by [`Rendezvous::finish`].
///
/// Call at most once per process: rank 0 takes ownership of the inherited descriptor.
pub fn rendezvous_with(
    world: &World,
    timeout: Duration,
    token: Option<&str>,
) -> Result<Rendezvous, StoreError> {
    let listener = match world.store_addr() {
        Some(_) if world.rank == 0 => Some(match std::env::var(STORE_FD_ENV) {
            Ok(fd) => listener_from_fd(&fd, world.master_port)?,
            Err(_) => bind_any(world)?,
        }),
        _ => None,
    };
    join(world, timeout, listener, token)
}

fn join(
    world: &World,
    timeout: Duration,
    listener: Option<TcpListener>,
    token: Option<&str>,
) -> Result<Rendezvous, StoreError> {
    let server = listener
        .map(|l| TcpStoreServer::from_std_listener_with_token(l, token))
        .transpose()?;
    let addr = world.store_addr();
    let store: Arc<dyn Store> = match &addr {
        Some(a) => Arc::new(TcpStoreClient::connect_with_token(a, timeout, token)?),
        None if world.size == 1 => Arc::new(MemoryStore::new()),
        None => {
            return Err(StoreError::Protocol(format!(
                "a job of {} ranks needs MASTER_ADDR and MASTER_PORT to rendezvous",
                world.size
            )))
        }
    };
    Ok(Rendezvous {
        store,
        server: Mutex::new(server),
        rank: world.rank,
        size: world.size,
        addr,
        token: token.map(str::to_string),
        timeout,
        finished: Arc::new(AtomicBool::new(false)),
        excused: std::sync::atomic::AtomicUsize::new(0),
        watchers: Mutex::new(Vec::new()),
        barrier_generation: Mutex::new(HashMap::new()),
    })
}

/// The ranks whose keys `<prefix>/<rank>` are among `keys`, sorted and without duplicates,
/// so that a [`StoreError::Timeout`] on an exchange can say "rank 5 never registered" instead
/// of listing store keys. `prefix` may end in '/' or not; keys that are not of that form (and
/// anything after the rank, as in `barrier/x/3/done`) are ignored.
pub fn missing_ranks(keys: &[String], prefix: &str) -> Vec<usize> {
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    let mut ranks: Vec<usize> = keys
        .iter()
        .filter_map(|k| {
            let rest = k.strip_prefix(prefix)?.strip_prefix('/')?;
            let digits = rest.split(['/', ' ']).next()?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()
        })
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    ranks
}

/// "rank 5 never registered" / "ranks 0-3, 7 never registered" for the keys of a timed-out
/// wait, or `None` when no key is a `<prefix>/<rank>` key. Consecutive ranks are folded into
/// ranges because at scale a whole node (or rack) of ranks tends to be missing at once.
pub fn never_registered(keys: &[String], prefix: &str) -> Option<String> {
    let ranks = missing_ranks(keys, prefix);
    (!ranks.is_empty()).then(|| ranks_that(&ranks, "never registered", "never registered"))
}

/// "rank 3 runs" / "ranks 1-3, 5 run": `ranks` (sorted, distinct) folded into ranges, with
/// the verb that agrees (`one` for a single rank, `many` for several).
pub fn ranks_that(ranks: &[usize], one: &str, many: &str) -> String {
    match ranks {
        [r] => format!("rank {r} {one}"),
        _ => format!("ranks {} {many}", fold_ranges(ranks)),
    }
}

/// "0-3, 7, 9-10" for sorted, distinct ranks.
pub fn fold_ranges(ranks: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

fn bind_any(world: &World) -> Result<TcpListener, StoreError> {
    let ip = if world.master_addr.parse::<Ipv6Addr>().is_ok() {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let sa = SocketAddr::new(ip, world.master_port);
    TcpListener::bind(sa).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            return StoreError::PortInUse {
                port: world.master_port,
            };
        }
        StoreError::Io(std::io::Error::new(
            e.kind(),
            format!("rank 0 cannot listen on {sa} (MASTER_PORT) for the rendezvous store: {e}"),
        ))
    })
}

fn fd_error(value: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{STORE_FD_ENV}={value:?} {why}"),
    ))
}

/// Take ownership of the listening socket the launcher left open for us, after checking that
/// the number really is one: adopting some unrelated descriptor would corrupt it.
fn listener_from_fd(value: &str, expected_port: u16) -> Result<TcpListener, StoreError> {
    let fd: RawFd = value
        .trim()
        .parse()
        .ok()
        .filter(|fd| *fd >= 0)
        .ok_or_else(|| fd_error(value, "is not a file descriptor number"))?;
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `listening`, and only reads `fd`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut listening as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(fd_error(
            value,
            format_args!("is not a socket: {}", std::io::Error::last_os_error()),
        ));
    }
    if listening == 0 {
        return Err(fd_error(value, "is a socket that is not listening"));
    }
    // Keep the descriptor out of anything this rank execs later.
    // SAFETY: plain fcntl calls on a descriptor just shown to be open.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
    // SAFETY: the descriptor is an open listening socket that the launcher handed to this
    // process alone; `rendezvous` is documented to be called once, so nothing else owns it.
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    let port = listener.local_addr()?.port();
    if port != expected_port {
        return Err(fd_error(
            value,
            format_args!("listens on port {port} but MASTER_PORT is {expected_port}"),
        ));
    }
    Ok(listener)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Rendezvous {
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// `host:port` of the store, `None` when it is in-process.
    pub fn store_addr(&self) -> Option<&str> {
        self.addr.as_deref()
    }

    /// Block until all ranks have called `barrier` with this `name`.
    ///
    /// Calls with the same name are numbered per process, so a name can be reused (every rank
    /// calls its barriers in the same order). On timeout the error says how many ranks arrived.
    pub fn barrier(&self, name: &str, timeout: Duration) -> Result<(), StoreError> {
        let generation = {
            let mut g = lock(&self.barrier_generation);
            let e = g.entry(name.to_string()).or_insert(0);
            *e += 1;
            *e - 1
        };
        let base = format!("barrier/{name}/{generation}");
        let count_key = format!("{base}/count");
        let done_key = format!("{base}/done");
        let arrived = self.store.add(&count_key, 1)?;
        if arrived == self.size as i64 {
            self.store.set(&done_key, b"")?;
        }
        match self.store.wait(&[&done_key], timeout) {
            Ok(_) => Ok(()),
            Err(StoreError::Timeout { secs, .. }) => {
                Err(self.counted_timeout(secs, &count_key, &done_key, "arrived"))
            }
            Err(e) => Err(e),
        }
    }

    fn counted_timeout(
        &self,
        secs: f64,
        count_key: &str,
        done_key: &str,
        verb: &str,
    ) -> StoreError {
        let arrived = match self.store.get(count_key) {
            Ok(Some(v)) => String::from_utf8_lossy(&v).into_owned(),
            _ => "?".to_string(),
        };
        StoreError::Timeout {
            secs,
            missing: vec![format!(
                "{done_key} ({arrived} of {} ranks {verb})",
                self.size
            )],
        }
    }

    /// The job has failed and this rank is leaving: everything it still does through the store
    /// (posting the abort, naming the culprit, checking out) must be done within `budget`, or
    /// is given up. Without that a rank cut off from rank 0 waits out a full store timeout on
    /// each step, and exits several `-T` after the fault instead of one.
    pub fn hurry(&self, budget: Duration) {
        self.store.give_up_by(Instant::now() + budget);
    }

    /// Tell every rank to stop. The first message posted is kept: later ones are usually
    /// consequences of the first failure and would hide its cause.
    pub fn post_abort(&self, msg: &str) -> Result<(), StoreError> {
        if self.store.get(ABORT_KEY)?.is_none() {
            self.store.set(ABORT_KEY, msg.as_bytes())?;
        }
        Ok(())
    }

    /// Raise `abort` when any rank posts an abort, or when the store disappears before
    /// [`Self::finish`] (which means rank 0 died), so the data path stops waiting on peers
    /// that will never answer.
    ///
    /// The watcher has its own connection because it blocks in WAIT all the time, and a
    /// connection carries one request at a time.
    pub fn watch_abort(&self, abort: Abort) -> Result<(), StoreError> {
        let (store, client, poll): (Arc<dyn Store>, _, _) = match &self.addr {
            Some(a) => {
                let c = Arc::new(TcpStoreClient::connect_with_token(
                    a,
                    self.timeout,
                    self.token.as_deref(),
                )?);
                (c.clone(), Some(c), WATCH_POLL)
            }
            // In process nothing can interrupt the wait, so poll faster to notice `finish`.
            None => (self.store.clone(), None, Duration::from_millis(100)),
        };
        let finished = self.finished.clone();
        let addr = self.addr.clone().unwrap_or_else(|| "in-process".into());
        let thread = std::thread::Builder::new()
            .name("busbw-abort-watch".into())
            .spawn(move || watch_loop(&*store, &abort, &finished, poll, &addr))?;
        lock(&self.watchers).push(Watcher { thread, client });
        Ok(())
    }

    fn stop_watchers(&self) {
        let watchers = std::mem::take(&mut *lock(&self.watchers));
        for w in &watchers {
            if let Some(c) = &w.client {
                c.close();
            }
        }
        for w in watchers {
            let _ = w.thread.join();
        }
    }

    /// Check out of the job: stop the abort watchers and, on rank 0, keep serving the store
    /// until every rank has checked out (bounded by the rendezvous timeout, and by a short
    /// linger once an abort was posted, since failed ranks never check out), so the last ranks
    /// do not lose the store while they are still using it. Idempotent.
    pub fn finish(&self) -> Result<(), StoreError> {
        if self.finished.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop_watchers();
        let result = self.check_out();
        if let Some(mut server) = lock(&self.server).take() {
            server.shutdown();
        }
        result
    }

    /// Rank 0: `ranks` ranks will never check out (ranks a gate gave up on: hung, or cut
    /// off from the store), so check-out ends once the others have.
    pub fn excuse(&self, ranks: usize) {
        self.excused.fetch_add(ranks, Ordering::AcqRel);
    }

    fn check_out(&self) -> Result<(), StoreError> {
        let arrived = self.store.add(FINISH_COUNT, 1)?;
        if arrived == self.size as i64 {
            self.store.set(FINISH_DONE, b"")?;
        }
        if lock(&self.server).is_none() {
            return Ok(());
        }
        let expected = self
            .size
            .saturating_sub(self.excused.load(Ordering::Acquire)) as i64;
        let start = Instant::now();
        let mut linger_until = self.store.get(ABORT_KEY)?.map(|_| start + ABORT_LINGER);
        loop {
            let now = Instant::now();
            let end = match linger_until {
                Some(l) => l.min(start + self.timeout),
                None => start + self.timeout,
            };
            let remaining = end.saturating_duration_since(now);
            if remaining.is_zero() {
                if linger_until.is_some() {
                    return Ok(()); // aborted job: the missing ranks failed and said so
                }
                return Err(self.counted_timeout(
                    self.timeout.as_secs_f64(),
                    FINISH_COUNT,
                    FINISH_DONE,
                    "checked out",
                ));
            }
            match self.store.wait(&[FINISH_DONE], remaining.min(WATCH_POLL)) {
                Ok(_) => return Ok(()),
                Err(StoreError::Timeout { .. }) if self.store.add(FINISH_COUNT, 0)? >= expected => {
                    return Ok(());
                }
                Err(StoreError::Timeout { .. }) => {
                    if linger_until.is_none() && self.store.get(ABORT_KEY)?.is_some() {
                        linger_until = Some(Instant::now() + ABORT_LINGER);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Rendezvous {
    /// Dropping without `finish` (an error path) still stops the watchers quietly; rank 0's
    /// server then goes away at once, which the other ranks report as rank 0 being gone.
    fn drop(&mut self) {
        self.finished.store(true, Ordering::Release);
        self.stop_watchers();
    }
}

fn watch_loop(store: &dyn Store, abort: &Abort, finished: &AtomicBool, poll: Duration, addr: &str) {
    loop {
        if finished.load(Ordering::Acquire) {
            return;
        }
        match store.wait(&[ABORT_KEY], poll) {
            Ok(values) => {
                let msg = values
                    .first()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| "another rank aborted the job without a reason".into());
                abort.raise(msg);
                return;
            }
            Err(StoreError::Timeout { .. }) => {}
            Err(e) => {
                if !finished.load(Ordering::Acquire) {
                    abort.raise(match e {
                        StoreError::Disconnected(_) | StoreError::Io(_) => format!(
                            "lost the rendezvous store served by rank 0 at {addr}: rank 0 is gone"
                        ),
                        other => format!("the abort watcher failed: {other}"),
                    });
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    /// A job of `size` ranks on loopback, all in this process.
    fn job(size: usize) -> Vec<Rendezvous> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let world = |rank| World {
            rank,
            size,
            local_rank: rank,
            local_size: size,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            hostname: "test".into(),
        };
        let mut listener = Some(listener);
        let r0 = join(&world(0), T, listener.take(), None).unwrap();
        let mut all = vec![r0];
        for rank in 1..size {
            all.push(join(&world(rank), T, None, None).unwrap());
        }
        all
    }

    fn wait_raised(a: &Abort) -> String {
        let start = Instant::now();
        while !a.is_raised() {
            assert!(start.elapsed() < T, "abort never raised");
            std::thread::sleep(Duration::from_millis(5));
        }
        a.reason().unwrap()
    }

    #[test]
    fn barrier_waits_for_everyone_and_is_reusable() {
        let ranks = job(3);
        let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::scope(|s| {
            for (i, r) in ranks.iter().enumerate() {
                let arrived = arrived.clone();
                s.spawn(move || {
                    for round in 0..3 {
                        if i == 2 {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        arrived.fetch_add(1, Ordering::SeqCst);
                        r.barrier("step", T).unwrap();
                        // Nobody leaves round `round` before all three arrived in it.
                        assert!(arrived.load(Ordering::SeqCst) >= 3 * (round + 1));
                    }
                });
            }
        });
        for r in &ranks[1..] {
            r.finish().unwrap();
        }
        ranks[0].finish().unwrap();
    }

    #[test]
    fn barrier_timeout_counts_arrivals() {
        let ranks = job(2);
        let e = ranks[1]
            .barrier("lonely", Duration::from_millis(200))
            .unwrap_err();
        let StoreError::Timeout { missing, .. } = e else {
            panic!("{e}")
        };
        assert!(missing[0].contains("1 of 2 ranks arrived"), "{missing:?}");
    }

    #[test]
    fn abort_reaches_every_watcher() {
        let ranks = job(3);
        let aborts: Vec<Abort> = ranks.iter().map(|_| Abort::new()).collect();
        for (r, a) in ranks.iter().zip(&aborts) {
            r.watch_abort(a.clone()).unwrap();
        }
        ranks[2].post_abort("rank 2 failed: boom").unwrap();
        ranks[1].post_abort("rank 1 failed: consequence").unwrap();
        for a in &aborts {
            assert_eq!(wait_raised(a), "rank 2 failed: boom");
        }
        // Rank 0 does not wait out the full timeout for ranks that failed.
        let start = Instant::now();
        ranks[0].finish().unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn losing_rank_0_raises_abort_but_finish_does_not() {
        let mut ranks = job(3);
        let aborts: Vec<Abort> = ranks.iter().map(|_| Abort::new()).collect();
        for (r, a) in ranks.iter().zip(&aborts) {
            r.watch_abort(a.clone()).unwrap();
        }
        // Rank 2 checks out normally; then rank 0 dies without checking out.
        ranks[2].finish().unwrap();
        drop(ranks.remove(0));
        let reason = wait_raised(&aborts[1]);
        assert!(reason.contains("rank 0 is gone"), "{reason}");
        assert!(reason.contains("127.0.0.1:"), "{reason}");
        std::thread::sleep(Duration::from_millis(100));
        assert!(!aborts[2].is_raised(), "{:?}", aborts[2].reason());
    }

    #[test]
    fn orderly_finish_raises_nothing() {
        let ranks = job(2);
        let aborts: Vec<Abort> = ranks.iter().map(|_| Abort::new()).collect();
        for (r, a) in ranks.iter().zip(&aborts) {
            r.watch_abort(a.clone()).unwrap();
        }
        std::thread::scope(|s| {
            let r0 = &ranks[0];
            let h = s.spawn(move || r0.finish());
            std::thread::sleep(Duration::from_millis(100));
            ranks[1].finish().unwrap();
            h.join().unwrap().unwrap();
        });
        assert!(!aborts[0].is_raised() && !aborts[1].is_raised());
    }

    #[test]
    fn single_rank_uses_memory_store() {
        let r = rendezvous(&World::single(), T).unwrap();
        assert!(r.store_addr().is_none());
        let a = Abort::new();
        r.watch_abort(a.clone()).unwrap();
        r.barrier("b", T).unwrap();
        r.post_abort("self").unwrap();
        assert_eq!(wait_raised(&a), "self");
        r.finish().unwrap();
    }

    fn world_at(rank: usize, size: usize, port: u16) -> World {
        World {
            rank,
            size,
            local_rank: rank,
            local_size: size,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            hostname: "test".into(),
        }
    }

    #[test]
    fn a_job_token_keeps_other_jobs_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let r0 = join(&world_at(0, 2, port), T, Some(listener), Some("job-a")).unwrap();
        // A rank of another job that was given the same port is refused at once ...
        let start = Instant::now();
        let e = join(&world_at(1, 2, port), T, None, Some("job-b"))
            .err()
            .unwrap();
        assert!(matches!(e, StoreError::WrongToken { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
        // ... and the job's own rank still joins, watcher connection included.
        let r1 = join(&world_at(1, 2, port), T, None, Some("job-a")).unwrap();
        let aborts = [Abort::new(), Abort::new()];
        r0.watch_abort(aborts[0].clone()).unwrap();
        r1.watch_abort(aborts[1].clone()).unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(|| r0.barrier("b", T));
            r1.barrier("b", T).unwrap();
            h.join().unwrap().unwrap();
        });
        r1.finish().unwrap();
        r0.finish().unwrap();
        assert!(!aborts[0].is_raised() && !aborts[1].is_raised());
    }

    #[test]
    fn a_taken_port_says_which_and_how_to_change_it() {
        let taken = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let e = rendezvous(&world_at(0, 2, port), Duration::from_millis(200))
            .err()
            .unwrap();
        assert!(
            matches!(e, StoreError::PortInUse { port: p } if p == port),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "port {port} is already in use on this host (hostNetwork pods share ports): \
                 pick another with --port or MASTER_PORT"
            )
        );
    }

    #[test]
    fn missing_keys_name_ranks() {
        let keys: Vec<String> = ["handle/5", "handle/2", "handle/3", "handle/x", "plan/9"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(missing_ranks(&keys, "handle"), vec![2, 3, 5]);
        assert_eq!(missing_ranks(&keys, "handle/"), vec![2, 3, 5]);
        assert_eq!(missing_ranks(&keys, "hand"), Vec::<usize>::new());
        assert_eq!(missing_ranks(&keys, "plan"), vec![9]);
        let odd = vec![
            "handle/7/x".to_string(),
            "handle/7".to_string(),
            "handle/+1".to_string(),
            "handle/".to_string(),
            "handle/99999999999999999999999".to_string(),
        ];
        assert_eq!(missing_ranks(&odd, "handle"), vec![7]);
        assert_eq!(
            never_registered(&keys[..1], "handle").unwrap(),
            "rank 5 never registered"
        );
        assert_eq!(
            never_registered(&keys, "handle").unwrap(),
            "ranks 2-3, 5 never registered"
        );
        assert_eq!(never_registered(&keys, "nope"), None);
        assert_eq!(fold_ranges(&[0, 1, 2, 3, 7, 9, 10]), "0-3, 7, 9-10");
        assert_eq!(fold_ranges(&[]), "");
    }

    #[test]
    fn bad_store_fd_is_rejected() {
        let e = listener_from_fd("banana", 1).unwrap_err();
        assert!(e.to_string().contains("BUSBW_STORE_FD=\"banana\""), "{e}");
        // stdin of the test is not a listening socket.
        let e = listener_from_fd("0", 1).unwrap_err();
        assert!(e.to_string().contains("BUSBW_STORE_FD=\"0\""), "{e}");
    }
}
