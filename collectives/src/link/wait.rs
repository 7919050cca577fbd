//! How a rank waits for its peers: spin, yield, then sleep in poll(2), with the no-progress
//! timeout and the job's abort checked throughout.

use crate::error::CommError;
use crate::link::Communicator;
use busbw_transports::Sleep;
use std::time::{Duration, Instant};

/// Waiting without burning the core a peer needs: spin for `CommConfig::spin` (the data is
/// usually microseconds away), then yield for `CommConfig::yield_for`, then sleep in poll(2)
/// on what the blocked comms name ([`Sleep`]). It also enforces the no-progress timeout and
/// notices the abort flag.
///
/// Callers run their progress pass, then, when it did nothing, call [`Waiter::idle`]; when
/// that says the budget is spent, they ask each blocked comm for `sleep_on()`, hand the
/// answers to [`Waiter::sleep`] and call `woke()` on the same comms.
pub(crate) struct Waiter {
    /// Set at a wait's first clock reading (a call that never waits reads no clock).
    last_progress: Option<Instant>,
    idle: u32,
    spin: Duration,
    yield_for: Duration,
}

/// Longest single sleep: progress checks (abort, -T) happen at least this often.
const POLL_MS: i32 = 5;
/// Idle passes between clock reads while spinning (a pass is a few transport tests).
const CLOCK_EVERY: u32 = 8;

impl Waiter {
    pub(crate) fn new(comm: &Communicator) -> Self {
        Waiter {
            last_progress: None,
            idle: 0,
            spin: comm.config().spin,
            yield_for: comm.config().yield_for,
        }
    }

    pub(crate) fn progressed(&mut self) {
        // The clock restarts at the next wait's first reading, not here: a short wait (the
        // usual case at 8 bytes) then costs no clock read at all.
        self.idle = 0;
    }

    /// Called when a pass made no progress. Returns `Ok(true)` when the caller should sleep
    /// (see the type's documentation), `Ok(false)` to just run another pass. `waiting_for`
    /// names the peer and what is awaited, for the timeout message.
    pub(crate) fn idle(
        &mut self,
        comm: &Communicator,
        waiting_for: impl FnOnce() -> (usize, String),
    ) -> Result<bool, CommError> {
        self.idle = self.idle.saturating_add(1);
        // (A saturated count reads the clock on every pass, so -T still fires.)
        if !self.idle.is_multiple_of(CLOCK_EVERY) && self.idle != u32::MAX {
            std::hint::spin_loop();
            return Ok(false);
        }
        // The wait is timed from its first clock reading, CLOCK_EVERY passes in: the spin
        // budget starts those few passes late, which is noise beside any budget.
        let waited = match self.last_progress {
            Some(t) if self.idle != CLOCK_EVERY => t.elapsed(),
            _ => {
                self.last_progress = Some(Instant::now());
                Duration::ZERO
            }
        };
        if waited < self.spin {
            std::hint::spin_loop();
            return Ok(false);
        }
        if comm.config().abort.is_raised() {
            return Err(comm.aborted());
        }
        if waited > comm.config().timeout {
            let (peer, what) = waiting_for();
            return Err(CommError::Timeout {
                rank: comm.rank(),
                peer: Some(peer),
                secs: comm.config().timeout.as_secs_f64(),
                what,
            });
        }
        if waited < self.spin + self.yield_for {
            std::thread::yield_now();
            return Ok(false);
        }
        Ok(true)
    }

    /// Sleep until one of `on` may allow progress, or briefly when none names a descriptor.
    pub(crate) fn sleep(&mut self, on: &[Sleep]) {
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 16];
        let mut nfds = 0;
        let mut nap = false;
        for s in on {
            let (fd, events) = match *s {
                Sleep::Ready => return,
                Sleep::Nap => {
                    nap = true;
                    continue;
                }
                Sleep::Readable(fd) => (fd, libc::POLLIN),
                Sleep::Writable(fd) => (fd, libc::POLLOUT),
            };
            if nfds < fds.len() {
                fds[nfds] = libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                };
                nfds += 1;
            }
        }
        if nap || nfds == 0 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            // SAFETY: fds[..nfds] are initialised pollfd structs. Errors (EINTR) just end
            // the sleep early; the caller's next test() reports real socket errors.
            unsafe { libc::poll(fds.as_mut_ptr(), nfds as libc::nfds_t, POLL_MS) };
        }
    }
}
