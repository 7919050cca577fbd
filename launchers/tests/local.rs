//! The local launcher, driven end to end with shell scripts and with this test binary
//! re-executed as real ranks that rendezvous through the store.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use busbw_launchers::local::{run, LaunchError, LocalLaunch};
use busbw_launchers::{rendezvous, World};
use busbw_transports::Abort;

fn sh(np: usize, script: &str, grace: Duration) -> LocalLaunch {
    LocalLaunch {
        np,
        exe: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), script.into()],
        grace,
        outcome_codes: vec![],
    }
}

#[test]
fn worst_exit_code_wins() {
    assert_eq!(
        run(&sh(3, "exit $RANK", Duration::from_secs(5))).unwrap(),
        2
    );
    assert_eq!(run(&sh(2, "exit 0", Duration::from_secs(5))).unwrap(), 0);
}

#[test]
fn ranks_get_their_environment_and_rank_0_the_socket() {
    let script = r#"
        [ "$WORLD_SIZE" = 3 ] && [ "$LOCAL_WORLD_SIZE" = 3 ] && [ "$LOCAL_RANK" = "$RANK" ] \
          && [ "$MASTER_ADDR" = 127.0.0.1 ] && [ "$MASTER_PORT" -gt 0 ] || exit 10
        if [ "$RANK" = 0 ]; then
          [ -n "$BUSBW_STORE_FD" ] && [ -e "/proc/$$/fd/$BUSBW_STORE_FD" ] || exit 11
        else
          [ -z "$BUSBW_STORE_FD" ] || exit 12
        fi
    "#;
    assert_eq!(run(&sh(3, script, Duration::from_secs(5))).unwrap(), 0);
}

#[test]
fn a_killed_rank_brings_the_job_down_after_the_grace_period() {
    // Rank 1 dies by SIGKILL; nothing tells the shell ranks to stop, so the launcher must kill
    // them once the grace period is over. Rank 2's `sleep` is a grandchild that keeps the
    // output pipe open after its shell is killed: the launcher must not wait for it.
    let script = r#"
        case "$RANK" in
          1) sleep 0.2; kill -9 $$ ;;
          2) sleep 8 ;;
          *) exec sleep 30 ;;
        esac
    "#;
    let start = Instant::now();
    let code = run(&sh(3, script, Duration::from_secs(1))).unwrap();
    let took = start.elapsed();
    assert_eq!(code, 137);
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(took >= Duration::from_millis(1100), "took {took:?}");
}

#[test]
fn bad_requests_are_clear_errors() {
    let e = run(&sh(0, "true", Duration::from_secs(1))).unwrap_err();
    assert!(matches!(e, LaunchError::NoRanks));
    let l = LocalLaunch {
        np: 2,
        exe: PathBuf::from("/nonexistent/busbw-xyz"),
        args: vec![],
        grace: Duration::from_secs(1),
        outcome_codes: vec![],
    };
    let e = run(&l).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/busbw-xyz"), "{e}");
}

const CHILD_ENV: &str = "BUSBW_LAUNCHERS_TEST_CHILD";

/// Entry point of the re-executed ranks; a no-op in the normal test run.
///
/// Every rank joins through the store and passes a barrier; rank 2 then exits with code 3.
/// The launcher must post that failure to the store, and ranks 0 and 1 must learn it through
/// their abort watchers, check out and exit 0 on their own, well within the grace period.
#[test]
fn child_rank() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let code = (|| -> Result<i32, String> {
        let world = World::from_env()
            .map_err(|e| e.to_string())?
            .ok_or("no world")?;
        let rdv = rendezvous(&world, Duration::from_secs(10)).map_err(|e| e.to_string())?;
        let abort = Abort::new();
        rdv.watch_abort(abort.clone()).map_err(|e| e.to_string())?;
        rdv.barrier("up", Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        if world.rank == 2 {
            return Ok(3);
        }
        let start = Instant::now();
        while !abort.is_raised() {
            if start.elapsed() > Duration::from_secs(10) {
                return Err("abort never arrived".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let reason = abort.reason().unwrap_or_default();
        eprintln!("rank {} stopping: {reason}", world.rank);
        let _ = rdv.finish();
        if reason.contains("rank 2") && reason.contains("exited with code 3") {
            Ok(0)
        } else {
            Err(format!("unexpected abort reason: {reason}"))
        }
    })();
    match code {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("child failed: {e}");
            std::process::exit(50);
        }
    }
}

#[test]
fn a_failed_rank_is_broadcast_through_the_store() {
    // The ranks are this test binary, running only `child_rank`. The marker variable goes
    // through env(1): setting it here would turn this process's own `child_rank` into a rank.
    let mut args = vec![
        OsString::from(format!("{CHILD_ENV}=1")),
        std::env::current_exe().unwrap().into_os_string(),
    ];
    args.extend(
        [
            "child_rank",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ]
        .iter()
        .map(OsString::from),
    );
    let l = LocalLaunch {
        np: 3,
        exe: PathBuf::from("/usr/bin/env"),
        args,
        grace: Duration::from_secs(15),
        outcome_codes: vec![],
    };
    let start = Instant::now();
    let code = run(&l).unwrap();
    // 3 is rank 2's own code: the survivors exited 0 and nobody needed killing.
    assert_eq!(code, 3);
    assert!(
        start.elapsed() < Duration::from_secs(12),
        "{:?}",
        start.elapsed()
    );
}
