//! The bootstrap TCP socket of a connection: its frames, its non-blocking reads, the ready
//! byte that ends the handshake, and the watch it keeps on the peer afterwards.

use crate::verbs::handshake;
use crate::{Result, TransportError};
use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

pub(super) const READY: u8 = 0x5a;

pub(super) fn read_frame(s: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > handshake::MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{n}-byte frame"),
        ));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Reads what is there without blocking; `Ok(false)` on end of stream.
pub(super) fn read_some(stream: &mut TcpStream, into: &mut Vec<u8>, peer: u32) -> Result<bool> {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(false),
            Ok(n) => into.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(TransportError::PeerIo { peer, error }),
        }
    }
}

/// The bootstrap socket, kept open for the connection's life as a watch on the peer: when its
/// process dies (or its host closes the socket), the kernel closes the socket at once, while
/// a message the peer was to send simply never comes (no completion at all on our side for a
/// receive, and a retry timeout of up to a minute for a send). Checked only while a request
/// is outstanding, at most every 50 ms.
pub(super) struct Liveness {
    stream: TcpStream,
    last: Instant,
}

impl Liveness {
    const EVERY: Duration = Duration::from_millis(50);

    pub(super) fn new(stream: TcpStream) -> Liveness {
        // A peer whose link went down sends no FIN: TCP keepalive probes an idle socket (5 s
        // idle, then 6 probes 2 s apart) and fails it with ETIMEDOUT, so a receiver that has
        // nothing in flight toward the peer (hence no RETRY_EXC to come) still learns it within
        // about 17 s. Not sooner: a host that stops answering for a few seconds is not dead (a
        // loaded hypervisor deschedules a guest for 5 s and more; 3 probes 1 s apart once
        // declared a live peer gone in a test bed of emulated guests).
        let fd = stream.as_raw_fd();
        for (level, name, value) in [
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 5),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 2),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 6),
        ] {
            let v: libc::c_int = value;
            // SAFETY: setsockopt on a socket we own with an int option; a failure only leaves
            // the watch to the FIN of a dead process.
            unsafe {
                libc::setsockopt(
                    fd,
                    level,
                    name,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        Liveness {
            stream,
            last: Instant::now(),
        }
    }

    /// Whether the peer's end of the socket is closed (end of stream or reset).
    pub(super) fn gone(&mut self) -> bool {
        if self.last.elapsed() < Self::EVERY {
            return false;
        }
        self.last = Instant::now();
        let mut b = [0u8; 1];
        // SAFETY: a one-byte peek into a local buffer on a socket we own.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => true,
            n if n > 0 => false,
            _ => matches!(
                io::Error::last_os_error().raw_os_error(),
                Some(libc::ECONNRESET)
                    | Some(libc::EPIPE)
                    | Some(libc::ENOTCONN)
                    | Some(libc::ETIMEDOUT)
                    | Some(libc::EHOSTUNREACH)
            ),
        }
    }

    pub(super) fn error(peer: u32) -> TransportError {
        TransportError::Rdma {
            peer,
            msg: "its process ended, its host closed the connection or its link went down (the \
                  verbs bootstrap socket closed or stopped answering keepalives) while a message \
                  to or from it was outstanding"
                .into(),
        }
    }
}
