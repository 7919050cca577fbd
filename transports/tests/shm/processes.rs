//! Across real processes, which threads cannot show: the segment handed over with
//! SCM_RIGHTS, a process's exit or death, and descriptors or mappings left behind. The
//! children are this test binary again, running one test alone.

use super::{host, pattern, shm, wait_recv_err, T};
use busbw_transports::{Handle, Transport, TransportError};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in a child process started by the two-process tests: the parent's handle.
const CHILD_ENV: &str = "BUSBW_SHM_TEST_CHILD";

/// `test` is a function of this module; `--exact` wants its path in the test binary, which is
/// this module's path without the crate's name.
fn child_command(test: &str, handle: &Handle) -> Command {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        &format!("{module}::{test}"),
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, String::from_utf8(handle.0.clone()).unwrap())
    .stdin(Stdio::null());
    cmd
}

/// Child side of [`shm_two_processes`]: connects to the parent's handle and sends.
#[test]
fn shm_child_sender() {
    let Ok(text) = std::env::var(CHILD_ENV) else {
        return; // only meaningful when started by the parent test
    };
    let a = shm(1, 1234);
    let mut send = a.connect(&Handle(text.into_bytes()), 2, T).unwrap();
    let n = 24 << 20;
    let src = pattern(n, 5);
    let reg = a.register(host(src.as_ptr(), n)).unwrap();
    for (tag, len) in [(1u32, n), (2, 0), (3, 12345)] {
        let r = unsafe { send.isend(&reg, src.as_ptr(), len, tag) }.unwrap();
        let deadline = Instant::now() + T;
        while send.test(r).unwrap().is_none() {
            assert!(Instant::now() < deadline, "child timed out");
        }
    }
    if std::env::var("BUSBW_SHM_TEST_HANG").is_ok() {
        // Wait to be killed: the parent checks that a dead process is noticed.
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Two real processes: the segment crosses the process boundary through SCM_RIGHTS, data
/// arrives intact, a normal exit after the last send loses nothing, and a killed process is
/// reported as a closed peer rather than waited for forever.
#[test]
fn shm_two_processes() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let b = shm(0, 1234);
    let n = 24 << 20;
    let expect = pattern(n, 5);
    let mut dst = vec![0u8; n];
    let reg = b.register(host(dst.as_ptr(), n)).unwrap();
    for kill in [false, true] {
        let (handle, mut listener) = b.listen().unwrap();
        let mut cmd = child_command("shm_child_sender", &handle);
        if kill {
            cmd.env("BUSBW_SHM_TEST_HANG", "1");
        }
        let mut child = cmd.stdout(Stdio::null()).spawn().unwrap();
        let mut recv = listener.accept(T).unwrap();
        assert_eq!((recv.peer(), recv.channel()), (1, 2));
        for (tag, len) in [(1u32, n), (2, 0), (3, 12345)] {
            dst.iter_mut().for_each(|b| *b = 0);
            let r = unsafe { recv.irecv(&reg, dst.as_mut_ptr(), n, tag) }.unwrap();
            let deadline = Instant::now() + T;
            let got = loop {
                assert!(
                    Instant::now() < deadline,
                    "timed out receiving from the child"
                );
                if let Some(g) = recv.test(r).unwrap() {
                    break g;
                }
            };
            assert_eq!(got, len);
            assert!(dst[..len] == expect[..len], "message {tag} corrupt");
        }
        if kill {
            // The child never drops its comm: only the dead socket can tell.
            child.kill().unwrap();
        }
        let status = child.wait().unwrap();
        assert_eq!(status.success(), !kill, "{status}");
        let r = unsafe { recv.irecv(&reg, dst.as_mut_ptr(), 8, 9) }.unwrap();
        let err = wait_recv_err(recv.as_mut(), r, || {});
        assert!(
            matches!(err, TransportError::PeerClosed { peer: 1 }),
            "{err}"
        );
    }
}

/// Child side of [`shm_leaves_nothing_behind`], alone in its process so that descriptor and
/// mapping counts are not disturbed by other tests.
#[test]
fn shm_child_leak_check() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let count = |what: &str| -> usize {
        match what {
            "fds" => std::fs::read_dir("/proc/self/fd").unwrap().count(),
            _ => std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .filter(|l| l.contains("busbw-shm"))
                .count(),
        }
    };
    let (fds, maps) = (count("fds"), count("maps"));
    {
        let a = shm(0, 3);
        let b = shm(1, 3);
        let (handle, mut listener) = b.listen().unwrap();
        let _s1 = a.connect(&handle, 0, T).unwrap();
        let _s2 = a.connect(&handle, 1, T).unwrap();
        let _r1 = listener.accept(T).unwrap();
        let _r2 = listener.accept(T).unwrap();
        assert_eq!(count("maps"), maps + 4, "two segments mapped on both sides");
    }
    assert_eq!(count("fds"), fds, "descriptors leaked");
    assert_eq!(count("maps"), maps, "segments still mapped");
    println!("LEAK-CHECK-OK");
}

#[test]
fn shm_leaves_nothing_behind() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let out = child_command("shm_child_leak_check", &Handle(b"x".to_vec()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("LEAK-CHECK-OK"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
