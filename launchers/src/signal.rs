//! SIGTERM and SIGINT: a pod eviction, `scancel`, `kubectl delete` or Ctrl-C.
//!
//! The default action kills the process on the spot: rank 0's export files would keep only
//! the rows already written, without a word of why, and every other rank would wait out `-T`
//! on a peer that vanished. Instead the handler only records the signal (the one thing a
//! handler may safely do); the rank turns it into a job-wide abort that names itself, its
//! host and the signal, writes its reports marked incomplete, and exits with
//! [`TERMINATED`] + the signal number; the local launcher forwards the signal to its ranks and
//! exits the same way.

use std::sync::atomic::{AtomicI32, Ordering};

/// Exit codes after a signal are 128 + its number, as shells and Kubernetes report them:
/// 143 after SIGTERM, 130 after SIGINT.
pub const TERMINATED: i32 = 128;

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    RECEIVED.store(sig, Ordering::Relaxed);
}

/// Catch SIGTERM and SIGINT from now on. Idempotent.
pub fn install() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a handler that only stores to an atomic; sigaction with a zeroed mask.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The signal received, if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}

/// The exit code after signal `sig`.
pub fn exit_code(sig: i32) -> i32 {
    TERMINATED + sig
}

/// `SIGTERM`, `SIGINT`, or the number.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        s => format!("signal {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_signal_is_recorded_not_fatal() {
        install();
        assert_eq!(exit_code(libc::SIGTERM), 143);
        assert_eq!(name(libc::SIGINT), "SIGINT");
        // SAFETY: raise delivers to this thread; the handler above is installed.
        unsafe { libc::raise(libc::SIGTERM) };
        assert_eq!(received(), Some(libc::SIGTERM));
        RECEIVED.store(0, Ordering::Relaxed);
    }
}
