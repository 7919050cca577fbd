//! The local launcher, driven end to end with shell scripts and with this test binary
//! re-executed as real ranks that rendezvous through the store.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use busbw_launchers::local::{run, run_pod, run_with_token, ExitCodes, LaunchError, LocalLaunch};
use busbw_launchers::{rendezvous, Store, TcpStoreClient, TcpStoreServer, World};
use busbw_transports::Abort;

fn sh(np: usize, script: &str, grace: Duration) -> LocalLaunch {
    LocalLaunch {
        np,
        exe: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), script.into()],
        grace,
        codes: ExitCodes::default(),
        ranks_per_process: 1,
    }
}

#[test]
fn the_culprits_exit_code_wins_over_the_echoes() {
    // Rank 1 fails with its own cause; the others stop later because of it (busbw's 3).
    let script = r#"[ "$RANK" = 1 ] && exit 2; sleep 0.5; exit 3"#;
    let mut l = sh(3, script, Duration::from_secs(5));
    l.codes.echo = vec![3];
    assert_eq!(run(&l).unwrap(), 2);
    // Echoes alone (the cause was elsewhere): the echo.
    let mut l = sh(2, "exit 3", Duration::from_secs(5));
    l.codes.echo = vec![3];
    assert_eq!(run(&l).unwrap(), 3);
    // A verdict every rank reached is not a failure, but it is the job's code.
    let mut l = sh(
        3,
        r#"[ "$RANK" = 0 ] && exit 0; exit 7"#,
        Duration::from_secs(5),
    );
    l.codes.outcome = vec![7];
    assert_eq!(run(&l).unwrap(), 7);
    assert_eq!(run(&sh(2, "exit 0", Duration::from_secs(5))).unwrap(), 0);
}

#[test]
fn ranks_get_their_environment_and_rank_0_the_socket() {
    let script = r#"
        [ "$WORLD_SIZE" = 3 ] && [ "$LOCAL_WORLD_SIZE" = 3 ] && [ "$LOCAL_RANK" = "$RANK" ] \
          && [ "$MASTER_ADDR" = 127.0.0.1 ] && [ "$MASTER_PORT" -gt 0 ] \
          && [ "$BUSBW_LAUNCHED" = 1 ] && [ -z "$BUSBW_JOB_TOKEN" ] || exit 10
        if [ "$RANK" = 0 ]; then
          [ -n "$BUSBW_STORE_FD" ] && [ -e "/proc/$$/fd/$BUSBW_STORE_FD" ] || exit 11
        else
          [ -z "$BUSBW_STORE_FD" ] || exit 12
        fi
    "#;
    assert_eq!(run(&sh(3, script, Duration::from_secs(5))).unwrap(), 0);
}

#[test]
fn the_token_reaches_the_ranks() {
    let l = sh(
        2,
        r#"[ "$BUSBW_JOB_TOKEN" = "tok-1" ] || exit 10"#,
        Duration::from_secs(5),
    );
    assert_eq!(run_with_token(&l, Some("tok-1")).unwrap(), 0);
}

fn pod(rank: usize, size: usize, addr: &str, port: u16) -> World {
    World {
        rank,
        size,
        local_rank: 0,
        local_size: 1,
        master_addr: addr.into(),
        master_port: port,
        hostname: "pod-host".into(),
    }
}

fn sh_args(script: &str) -> Vec<OsString> {
    vec!["-c".into(), script.into()]
}

#[test]
fn a_pods_children_get_the_expanded_world() {
    let dir = std::env::temp_dir().join(format!("busbw-run-pod-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Pod 1 of 2 with 3 processes each: global ranks 3, 4, 5 of 6.
    let script = format!(
        r#"
        [ "$RANK" -eq $((3 + LOCAL_RANK)) ] && [ "$WORLD_SIZE" = 6 ]           && [ "$LOCAL_WORLD_SIZE" = 3 ] && [ "$MASTER_ADDR" = pod-0.job ]           && [ "$MASTER_PORT" = 29555 ] && [ "$BUSBW_LAUNCHED" = 1 ]           && [ "$BUSBW_JOB_TOKEN" = tok ] && [ -z "$BUSBW_STORE_FD" ] || exit 10
        touch "{}/$RANK"
        "#,
        dir.display()
    );
    let code = run_pod(
        &pod(1, 2, "pod-0.job", 29555),
        3,
        &PathBuf::from("/bin/sh"),
        &sh_args(&script),
        Duration::from_secs(5),
        &ExitCodes::default(),
        Some("tok"),
        1,
    )
    .unwrap();
    assert_eq!(code, 0);
    let mut ranks: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    ranks.sort();
    assert_eq!(ranks, ["3", "4", "5"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pod_without_an_address_is_served_on_loopback() {
    let script = r#"
        [ "$WORLD_SIZE" = 2 ] && [ "$MASTER_ADDR" = 127.0.0.1 ] && [ "$MASTER_PORT" -gt 0 ] || exit 10
        if [ "$RANK" = 0 ]; then
          [ -e "/proc/$$/fd/$BUSBW_STORE_FD" ] || exit 11
        else
          [ -z "$BUSBW_STORE_FD" ] || exit 12
        fi
    "#;
    let mut one = World::single();
    one.hostname = "h".into();
    let code = run_pod(
        &one,
        2,
        &PathBuf::from("/bin/sh"),
        &sh_args(script),
        Duration::from_secs(5),
        &ExitCodes::default(),
        None,
        1,
    )
    .unwrap();
    assert_eq!(code, 0);

    let e = run_pod(
        &one,
        0,
        &PathBuf::from("/bin/sh"),
        &[],
        Duration::from_secs(1),
        &ExitCodes::default(),
        None,
        1,
    )
    .unwrap_err();
    assert!(matches!(e, LaunchError::NoLocalRanks), "{e}");
    let e = run_pod(
        &pod(1, 2, "", 0),
        2,
        &PathBuf::from("/bin/sh"),
        &[],
        Duration::from_secs(1),
        &ExitCodes::default(),
        None,
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("MASTER_ADDR"), "{e}");
}

#[test]
fn a_failing_child_is_posted_to_the_jobs_store_and_its_siblings_killed() {
    // The job's store runs elsewhere (here: in this process) and wants a token.
    let server =
        TcpStoreServer::bind_with_token("127.0.0.1:0".parse().unwrap(), Some("tok")).unwrap();
    let port = server.local_addr().port();
    let script = r#"
        case "$LOCAL_RANK" in
          1) exit 5 ;;
          *) exec sleep 30 ;;
        esac
    "#;
    let start = Instant::now();
    let code = run_pod(
        &pod(1, 2, "127.0.0.1", port),
        2,
        &PathBuf::from("/bin/sh"),
        &sh_args(script),
        Duration::from_millis(800),
        &ExitCodes::default(),
        Some("tok"),
        1,
    )
    .unwrap();
    assert_eq!(code, 5);
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    let c = TcpStoreClient::connect_with_token(
        &format!("127.0.0.1:{port}"),
        Duration::from_secs(5),
        Some("tok"),
    )
    .unwrap();
    let reason = c.wait(&["abort"], Duration::from_secs(5)).unwrap();
    let reason = String::from_utf8_lossy(&reason[0]).into_owned();
    assert!(
        reason.contains("rank 3") && reason.contains("exited with code 5"),
        "{reason}"
    );
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
        codes: ExitCodes::default(),
        ranks_per_process: 1,
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
        codes: ExitCodes::default(),
        ranks_per_process: 1,
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
