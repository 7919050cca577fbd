//! The shared-memory transport must behave like TCP (same errors, same ordering), within one
//! process across threads and across two real processes.
//!
//! One test binary with a module per topic, so that CI links it once; the helpers every
//! module shares live here.

mod delivery;
mod errors;
mod processes;
mod throughput;
mod wakeups;

#[path = "../common/mod.rs"]
mod common;

use busbw_transports::platform::{Platform, PLATFORM_ENV};
use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::Identity;

pub(crate) use common::{host, pattern, wait_both, wait_recv_err, T};

pub(crate) fn shm(rank: u32, job: u64) -> ShmTransport {
    ShmTransport::new(Identity::new(job, rank), ShmConfig::default())
}

/// Every test of this binary once more, under the portable platform (POSIX shared memory,
/// socket files, no cross-memory reads), in a child process: the switch is read once per
/// process, and selecting it exactly as a user does tests what a Mac runs. The tests that
/// depend on the platform assert which path they took (`shm_single_copy_large_messages`,
/// `shm_follows_its_platform`).
#[test]
fn shm_suite_under_the_portable_platform() {
    if Platform::active() == Platform::Portable {
        return; // this is that run (or the only platform there is)
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--skip", "shm_suite_under_the_portable_platform"])
        .env(PLATFORM_ENV, "portable")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("test result: ok"),
        "under {PLATFORM_ENV}=portable:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The handle and the segment show which platform made them: an abstract socket and a
/// memfd on Linux, a socket file and an (unlinked) POSIX object otherwise.
#[test]
fn shm_follows_its_platform() {
    let p = Platform::active();
    let a = shm(0, 77);
    let b = shm(1, 77);
    let (handle, mut listener) = busbw_transports::Transport::listen(&b).unwrap();
    let text = String::from_utf8(handle.0.clone()).unwrap();
    let file_socket = text.contains(" sock=/");
    assert_eq!(file_socket, p == Platform::Portable, "{p}: {text}");
    assert_eq!(text.contains(" sock=@"), !file_socket, "{text}");
    let _send = busbw_transports::Transport::connect(&a, &handle, 0, T).unwrap();
    let _recv = listener.accept(T).unwrap();
    if cfg!(target_os = "linux") {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let memfd = maps.lines().any(|l| l.contains("/memfd:busbw-shm"));
        let object = maps.lines().any(|l| l.contains("/dev/shm/busbw-shm."));
        assert_eq!(
            (memfd, object),
            (p != Platform::Portable, p == Platform::Portable),
            "{p}"
        );
    }
}
