//! Connection setup, once for every transport: deadlines, poll, the retrying TCP connect,
//! text handles, the common head of a hello, and the authenticated accept.
//!
//! Each transport keeps only what is truly its own: tcp its lanes, shm the memfd that travels
//! with its hello, verbs the queue-pair exchange. Everything a stranger could probe (what a
//! listener does with a connection before it is proven to come from a rank of this job) goes
//! through [`accept`] and [`crate::auth::DataGate`], so the three transports refuse strangers
//! the same way and say so in the same words.

use crate::{Handle, Result, TransportError};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// How long an accepted connection may take to send its hello. Independent of the accept
/// deadline: a caller polling accept in short slices (the multi-transport) must not refuse a
/// peer whose hello is a few milliseconds late on a loaded host. A stranger that never speaks
/// costs at most this long.
pub(crate) const HELLO_WAIT: Duration = Duration::from_secs(5);

/// The end of one blocking call, and what to say when it passes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    at: Instant,
    total: Duration,
}

impl Deadline {
    pub(crate) fn after(total: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + total,
            total,
        }
    }

    /// Time left, `None` once it has passed.
    pub(crate) fn left(&self) -> Option<Duration> {
        self.at
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }

    /// Time left, or the timeout error that says what was being waited for.
    pub(crate) fn left_or(&self, what: impl FnOnce() -> String) -> Result<Duration> {
        self.left().ok_or_else(|| TransportError::Timeout {
            secs: self.total.as_secs_f64(),
            what: what(),
        })
    }
}

/// poll(2) on one descriptor: the events that came, 0 on timeout or a signal. A non-zero
/// timeout shorter than a millisecond waits one, so a caller looping to a deadline sleeps
/// instead of spinning through its last microseconds.
pub(crate) fn poll_fd(
    fd: RawFd,
    events: libc::c_short,
    timeout: Duration,
) -> io::Result<libc::c_short> {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = if timeout.is_zero() {
        0
    } else {
        timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int
    };
    // SAFETY: pfd is a valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(if rc > 0 { pfd.revents } else { 0 })
}

/// Whether `fd` became readable within `timeout`.
pub(crate) fn poll_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    Ok(poll_fd(fd, libc::POLLIN, timeout)? != 0)
}

/// Connects to `addr` (rank `peer`) before `deadline`. A peer's listener exists before its
/// handle is published, but a connect can still be refused transiently (SYN backlog full
/// with many ranks, a route not up yet), so those errors are retried, as NCCL does; `what`
/// describes the attempt in the timeout error.
pub(crate) fn connect_tcp(
    addr: SocketAddr,
    peer: u32,
    deadline: &Deadline,
    what: impl Fn() -> String,
) -> Result<TcpStream> {
    loop {
        let left = deadline.left_or(&what)?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                        | io::ErrorKind::AddrNotAvailable
                ) =>
            {
                std::thread::sleep(Duration::from_millis(50).min(left));
            }
            Err(e) => return Err(TransportError::PeerIo { peer, error: e }),
        }
    }
}

/// A text handle, `<prefix> rank=<r> <key>=<value> ... auth=<challenge>`: text, so that a
/// store dump is readable.
pub(crate) struct TextHandle<'a> {
    text: &'a str,
    pub(crate) rank: u32,
}

impl<'a> TextHandle<'a> {
    /// The fields of a handle that must start with `prefix`; `kind` names the transport in
    /// the error for anything else.
    pub(crate) fn parse(handle: &'a Handle, prefix: &str, kind: &str) -> Result<TextHandle<'a>> {
        let text = std::str::from_utf8(&handle.0)
            .map_err(|_| TransportError::BadHandle(format!("not UTF-8 (not {kind} handle?)")))?;
        if text.split_whitespace().next() != Some(prefix) {
            return Err(TransportError::BadHandle(format!(
                "{text:?} is not a {prefix} handle"
            )));
        }
        let h = TextHandle { text, rank: 0 };
        let rank = h.field("rank=").and_then(|v| v.parse::<u32>().ok());
        let rank = rank.ok_or_else(|| h.lacks("rank="))?;
        Ok(TextHandle { rank, ..h })
    }

    /// The value of the first `key` field (`key` with its `=`, or `=@`).
    pub(crate) fn field(&self, key: &str) -> Option<&'a str> {
        self.text
            .split_whitespace()
            .skip(1)
            .find_map(|w| w.strip_prefix(key))
    }

    /// The error for a missing or malformed field.
    pub(crate) fn lacks(&self, key: &str) -> TransportError {
        TransportError::BadHandle(format!("{:?} lacks a valid rank= or {key}", self.text))
    }
}

/// What tcp and shm hellos both start with: magic, protocol version, the connector's rank, the
/// job id and the channel, 28 bytes little-endian. The transport's own fields follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HelloHead {
    pub(crate) rank: u32,
    pub(crate) job: u64,
    pub(crate) channel: u32,
}

/// Bytes of [`HelloHead`].
pub(crate) const HEAD_LEN: usize = 28;
/// Magic and version come first and are checked before the rest is awaited, so a peer of
/// another version is named as such instead of timing out on a shorter hello.
pub(crate) const PREFIX_LEN: usize = 12;

/// A transport's hello dialect: its magic, its protocol version, and its name in refusals.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dialect {
    pub(crate) magic: u64,
    pub(crate) version: u32,
    /// `busbw` or `busbw shm`, as in "not a {name} connection".
    pub(crate) name: &'static str,
}

impl Dialect {
    pub(crate) fn encode(&self, head: &HelloHead, into: &mut [u8]) {
        into[0..8].copy_from_slice(&self.magic.to_le_bytes());
        into[8..12].copy_from_slice(&self.version.to_le_bytes());
        into[12..16].copy_from_slice(&head.rank.to_le_bytes());
        into[16..24].copy_from_slice(&head.job.to_le_bytes());
        into[24..28].copy_from_slice(&head.channel.to_le_bytes());
    }

    /// Magic and version, the part of a hello every version shares.
    pub(crate) fn check_prefix(&self, b: &[u8]) -> std::result::Result<(), String> {
        if b.len() < PREFIX_LEN || u64_at(b, 0) != self.magic {
            return Err(format!("not a {} connection (bad magic)", self.name));
        }
        let version = u32_at(b, 8);
        if version != self.version {
            return Err(format!(
                "{} protocol {version} where {} is spoken (mixed versions?)",
                self.name, self.version
            ));
        }
        Ok(())
    }

    /// The head of a hello sent to a listener of job id `job`, or why it is not one of ours.
    pub(crate) fn decode(&self, b: &[u8], job: u64) -> std::result::Result<HelloHead, String> {
        self.check_prefix(b)?;
        if b.len() < HEAD_LEN {
            return Err(format!("a hello of {} bytes", b.len()));
        }
        let head = HelloHead {
            rank: u32_at(b, 12),
            job: u64_at(b, 16),
            channel: u32_at(b, 24),
        };
        same_job(head.rank, head.job, job)?;
        Ok(head)
    }
}

/// The job-id check of every hello: a connection of another job (or of another group of this
/// one) is refused before its proof is even read.
pub(crate) fn same_job(rank: u32, theirs: u64, ours: u64) -> std::result::Result<(), String> {
    if theirs != ours {
        return Err(format!(
            "rank {rank} belongs to another job or has another job token"
        ));
    }
    Ok(())
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A listening socket [`accept`] can wait on: TCP for tcp and the verbs bootstrap, unix-domain
/// for shm.
pub(crate) trait Accepting: AsRawFd {
    type Stream;
    /// The next connection and where it came from, for the refusal line.
    fn accept_next(&self) -> io::Result<(Self::Stream, String)>;
    /// Makes `stream` blocking with [`HELLO_WAIT`] as its read timeout, for the hello.
    fn await_hello(stream: &Self::Stream) -> io::Result<()>;
}

impl Accepting for TcpListener {
    type Stream = TcpStream;
    fn accept_next(&self) -> io::Result<(TcpStream, String)> {
        self.accept().map(|(s, from)| (s, format!(" from {from}")))
    }
    fn await_hello(stream: &TcpStream) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(HELLO_WAIT))
    }
}

impl Accepting for UnixListener {
    type Stream = UnixStream;
    fn accept_next(&self) -> io::Result<(UnixStream, String)> {
        // Abstract sockets' peers have no address worth printing.
        self.accept().map(|(s, _)| (s, String::new()))
    }
    fn await_hello(stream: &UnixStream) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(HELLO_WAIT))
    }
}

/// The authenticated accept every listener runs: waits until `deadline` for a connection whose
/// `handshake` succeeds, and returns it with what the handshake learned. `handshake` reads and
/// checks the hello, and must pass it through the listener's [`crate::auth::DataGate`] before
/// it trusts anything the hello claims; a connection it refuses is named on stderr (a
/// misconfigured job should be visible), dropped, and waiting goes on for the peer expected.
/// `kind` names the connection in those lines (`data connection`, `shared-memory connection`,
/// `verbs bootstrap connection`), `over` the medium in the timeout error (` over shared
/// memory`, or nothing).
pub(crate) fn accept<L: Accepting, T>(
    listener: &L,
    deadline: &Deadline,
    (kind, over): (&str, &str),
    mut handshake: impl FnMut(&mut L::Stream) -> std::result::Result<T, String>,
) -> Result<(L::Stream, T)> {
    loop {
        let left = deadline.left_or(|| format!("waiting for a peer to connect{over}"))?;
        if !poll_readable(listener.as_raw_fd(), left)? {
            continue;
        }
        let (mut stream, from) = match listener.accept_next() {
            Ok(pair) => pair,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue
            }
            Err(e) => return Err(e.into()),
        };
        let checked = L::await_hello(&stream)
            .map_err(|e| e.to_string())
            .and_then(|()| handshake(&mut stream));
        match checked {
            Ok(t) => return Ok((stream, t)),
            Err(why) => eprintln!("busbw: refused a {kind}{from}: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_handles_parse_and_name_what_is_wrong() {
        let h = Handle(b"busbw-x/1 rank=3 addr=1.2.3.4:5 auth=ab".to_vec());
        let t = TextHandle::parse(&h, "busbw-x/1", "an x").unwrap();
        assert_eq!(t.rank, 3);
        assert_eq!(t.field("addr="), Some("1.2.3.4:5"));
        assert_eq!(t.field("sock=@"), None);
        let e = |b: &[u8]| {
            TextHandle::parse(&Handle(b.to_vec()), "busbw-x/1", "an x")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(e(b"busbw-y/1 rank=1").contains("is not a busbw-x/1 handle"));
        assert!(e(b"busbw-x/1 rank=z").contains("lacks a valid rank="));
        assert!(e(&[0xff, 0xfe]).contains("not UTF-8 (not an x handle?)"));
        // The prefix is the first word only: a field that equals it does not count.
        assert!(e(b"x busbw-x/1 rank=1").contains("is not a"));
    }

    #[test]
    fn hello_heads_round_trip_and_refuse_other_dialects_and_jobs() {
        let d = Dialect {
            magic: 0x1122_3344_5566_7788,
            version: 4,
            name: "busbw test",
        };
        let head = HelloHead {
            rank: 7,
            job: 99,
            channel: 2,
        };
        let mut b = [0u8; HEAD_LEN];
        d.encode(&head, &mut b);
        assert_eq!(d.decode(&b, 99), Ok(head));
        assert!(d
            .decode(&b, 98)
            .unwrap_err()
            .contains("rank 7 belongs to another job"));
        assert!(d
            .decode(&b[..20], 99)
            .unwrap_err()
            .contains("hello of 20 bytes"));
        let old = Dialect { version: 3, ..d };
        let why = old.decode(&b, 99).unwrap_err();
        assert!(why.contains("protocol 4 where 3 is spoken"), "{why}");
        let other = Dialect { magic: 1, ..d };
        assert!(other.decode(&b, 99).unwrap_err().contains("bad magic"));
        assert!(d.check_prefix(&b[..5]).unwrap_err().contains("bad magic"));
    }

    #[test]
    fn deadlines_say_what_timed_out() {
        let d = Deadline::after(Duration::ZERO);
        assert_eq!(d.left(), None);
        let e = d.left_or(|| "waiting for godot".into()).unwrap_err();
        assert!(
            e.to_string()
                .contains("timed out after 0.0s waiting for godot"),
            "{e}"
        );
        assert!(Deadline::after(Duration::from_secs(60)).left().is_some());
    }

    #[test]
    fn accept_drops_strangers_and_returns_the_peer_that_passes() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let talker = std::thread::spawn(move || {
            use std::io::Write;
            let mut bad = TcpStream::connect(addr).unwrap();
            bad.write_all(b"no").unwrap();
            let mut good = TcpStream::connect(addr).unwrap();
            good.write_all(b"ok").unwrap();
            // Held open until the listener has read both.
            std::thread::sleep(Duration::from_millis(500));
        });
        let mut seen = Vec::new();
        let (_, got) = accept(
            &l,
            &Deadline::after(Duration::from_secs(30)),
            ("test connection", ""),
            |s| {
                use std::io::Read;
                let mut b = [0u8; 2];
                s.read_exact(&mut b).map_err(|e| e.to_string())?;
                seen.push(b);
                (&b == b"ok")
                    .then_some(b)
                    .ok_or_else(|| "says no".to_string())
            },
        )
        .unwrap();
        assert_eq!(&got, b"ok");
        assert_eq!(seen, vec![*b"no", *b"ok"]);
        talker.join().unwrap();
        let e = accept(
            &l,
            &Deadline::after(Duration::from_millis(50)),
            ("test", " over x"),
            |_| Ok(()),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("waiting for a peer to connect over x"),
            "{e}"
        );
    }
}
