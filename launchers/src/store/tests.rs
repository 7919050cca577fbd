use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

const T: Duration = Duration::from_secs(10);

fn server() -> (TcpStoreServer, String) {
    let s = TcpStoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = s.local_addr().to_string();
    (s, addr)
}

fn client(addr: &str) -> TcpStoreClient {
    TcpStoreClient::connect(addr, T).unwrap()
}

/// A raw connection that completes the greeting with `token`'s key, for tests that then
/// speak the frame protocol by hand. Returns the stream and the server's nonce.
fn raw_login(addr: &str, token: Option<&str>) -> (TcpStream, [u8; 16]) {
    let key = busbw_transports::auth::Key::from_token(token);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let cn = busbw_transports::auth::nonce();
    s.write_all(&proto::client_hello(&cn)).unwrap();
    let mut h = [0u8; proto::HELLO_LEN + proto::SERVER_CHALLENGE_LEN];
    s.read_exact(&mut h).unwrap();
    let sn: [u8; 16] = h[proto::HELLO_LEN..proto::HELLO_LEN + 16]
        .try_into()
        .unwrap();
    let proof = key.proof(auth_label::STORE_CLIENT, &[&sn, &cn]);
    s.write_all(&proof).unwrap();
    let mut status = [0u8; 1];
    s.read_exact(&mut status).unwrap();
    assert_eq!(status[0], proto::HELLO_OK);
    (s, sn)
}

use busbw_transports::auth::label as auth_label;

/// The behaviour every implementation must share.
fn basic_ops(store: Arc<dyn Store>) {
    assert_eq!(store.get("k").unwrap(), None);
    store.set("k", b"v1").unwrap();
    assert_eq!(store.get("k").unwrap().unwrap(), b"v1");
    store.set("k", b"").unwrap();
    assert_eq!(store.get("k").unwrap().unwrap(), b"");
    store.set("k2", &[0, 255, 7]).unwrap();
    assert_eq!(
        store.wait(&["k2", "k"], T).unwrap(),
        vec![vec![0, 255, 7], vec![]]
    );

    assert_eq!(store.add("c", 5).unwrap(), 5);
    assert_eq!(store.add("c", -7).unwrap(), -2);
    assert_eq!(store.get("c").unwrap().unwrap(), b"-2");
    assert!(matches!(
        store.add("k2", 1),
        Err(StoreError::BadValue { ref key, .. }) if key == "k2"
    ));

    let start = Instant::now();
    let e = store
        .wait(&["k", "nope", "c", "never"], Duration::from_millis(150))
        .unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(140));
    match &e {
        StoreError::Timeout { missing, .. } => assert_eq!(missing, &["nope", "never"]),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("nope, never"), "{e}");

    // wait blocks until another thread provides the key.
    let s2 = store.clone();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        s2.set("late", b"here").unwrap();
    });
    let start = Instant::now();
    assert_eq!(store.wait(&["late"], T).unwrap(), vec![b"here".to_vec()]);
    assert!(start.elapsed() >= Duration::from_millis(90));
    setter.join().unwrap();

    let p = PrefixStore::new(store.clone(), "tier1");
    p.set("x", b"1").unwrap();
    assert_eq!(store.get("tier1/x").unwrap().unwrap(), b"1");
    assert_eq!(store.get("x").unwrap(), None);
    assert_eq!(p.wait(&["x"], T).unwrap(), vec![b"1".to_vec()]);
    assert_eq!(p.add("n", 2).unwrap(), 2);
}

#[test]
fn memory_store_basics() {
    basic_ops(Arc::new(MemoryStore::new()));
}

#[test]
fn tcp_store_basics() {
    let (_s, addr) = server();
    basic_ops(Arc::new(client(&addr)));
}

#[test]
fn concurrent_adds_sum_and_wake_waiters() {
    let (_s, addr) = server();
    let threads = 4;
    let per = 200;
    let waiter = {
        let c = client(&addr);
        std::thread::spawn(move || c.wait(&["all-done"], T))
    };
    let shared = Arc::new(client(&addr)); // one client shared by threads: it must be Sync
    std::thread::scope(|s| {
        for t in 0..threads {
            let own = client(&addr);
            let shared = shared.clone();
            s.spawn(move || {
                for i in 0..per {
                    let c: &dyn Store = if (t + i) % 2 == 0 { &own } else { &*shared };
                    let n = c.add("counter", 1).unwrap();
                    if n == (threads * per) as i64 {
                        c.set("all-done", b"yes").unwrap();
                    }
                }
            });
        }
    });
    assert_eq!(shared.get("counter").unwrap().unwrap(), b"800");
    assert_eq!(waiter.join().unwrap().unwrap(), vec![b"yes".to_vec()]);

    let mem = Arc::new(MemoryStore::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            let mem = mem.clone();
            s.spawn(move || {
                for _ in 0..per {
                    mem.add("c", 1).unwrap();
                }
            });
        }
    });
    assert_eq!(mem.add("c", 0).unwrap(), 800);
}

#[test]
fn many_waiters_on_many_keys() {
    // Every "rank" publishes a key and waits for all: the peer-info exchange pattern.
    let (_s, addr) = server();
    let n = 16;
    let keys: Vec<String> = (0..n).map(|r| format!("peer/{r}")).collect();
    std::thread::scope(|s| {
        for r in 0..n {
            let keys = &keys;
            let addr = &addr;
            s.spawn(move || {
                let c = client(addr);
                c.set(&keys[r], r.to_string().as_bytes()).unwrap();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let vals = c.wait(&refs, T).unwrap();
                for (i, v) in vals.iter().enumerate() {
                    assert_eq!(v, i.to_string().as_bytes());
                }
            });
        }
    });
}

#[test]
fn stray_clients_are_dropped_and_server_keeps_serving() {
    let (_s, addr) = server();
    let good = client(&addr);
    good.set("before", b"1").unwrap();

    // An HTTP probe: wrong greeting, disconnected without a reply.
    let mut http = TcpStream::connect(&addr).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    http.set_read_timeout(Some(T)).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(
        http.read(&mut buf).unwrap_or(0),
        0,
        "server answered a stray"
    );

    // A client that greets correctly and then sends a 4 GiB frame length.
    let (mut liar, _) = raw_login(&addr, None);
    liar.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
    assert_eq!(liar.read(&mut buf).unwrap_or(0), 0);

    // A zero-length frame: framing is lost, the connection is closed.
    let (mut empty, _) = raw_login(&addr, None);
    empty.write_all(&[0, 0, 0, 0]).unwrap();
    assert_eq!(empty.read(&mut buf).unwrap_or(0), 0);

    // A truncated frame: 100 bytes announced, 10 sent, then the sender hangs up.
    let (mut short, _) = raw_login(&addr, None);
    short
        .write_all(&[0, 0, 0, 100, 1, 0, 0, 0, 1, b'k'])
        .unwrap();
    drop(short);

    // A well-framed request with garbage inside gets an error answer, not a crash.
    let (mut garbage, _) = raw_login(&addr, None);
    garbage.write_all(&[0, 0, 0, 5, 3, 9, 9, 9, 9]).unwrap();
    let mut len = [0u8; 4];
    garbage.read_exact(&mut len).unwrap();
    let mut status = [0u8; 1];
    garbage.read_exact(&mut status).unwrap();
    assert_eq!(status[0], proto::ST_ERROR);

    // Random bytes straight away.
    let mut noise = TcpStream::connect(&addr).unwrap();
    let _ = noise.write_all(&[0x5a; 4096]);
    drop(noise);

    good.set("after", b"2").unwrap();
    assert_eq!(good.get("before").unwrap().unwrap(), b"1");
    assert_eq!(client(&addr).get("after").unwrap().unwrap(), b"2");
}

#[test]
fn client_rejects_a_server_that_is_not_a_store() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; proto::CLIENT_HELLO_LEN];
        s.read_exact(&mut b).unwrap();
        s.write_all(b"HTTP/1.1 400").unwrap();
    });
    let e = TcpStoreClient::connect(&addr, T).err().unwrap();
    assert!(matches!(e, StoreError::Protocol(_)), "{e}");
    t.join().unwrap();
}

#[test]
fn client_retries_until_server_appears() {
    // Reserve a port, free it, and start the server there a little later.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sa: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        TcpStoreServer::bind(sa).unwrap()
    });
    let start = Instant::now();
    let c = TcpStoreClient::connect(&sa.to_string(), T).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(250));
    let _server = starter.join().unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k").unwrap().unwrap(), b"v");
}

#[test]
fn connect_gives_up_with_a_clear_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let e = TcpStoreClient::connect(&addr, Duration::from_millis(200))
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(matches!(e, StoreError::Refused { .. }), "{e:?}");
    assert!(
        msg.contains("connection refused by rank 0") && msg.contains(&addr),
        "{msg}"
    );
    assert!(msg.contains("is the port right?"), "{msg}");
}

#[test]
fn a_name_that_never_resolves_is_its_own_failure() {
    let start = Instant::now();
    let e = TcpStoreClient::connect("rank0.busbw-test.invalid:29500", Duration::from_millis(300))
        .err()
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    match &e {
        StoreError::Unresolved { host, .. } => assert_eq!(host, "rank0.busbw-test.invalid"),
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("host rank0.busbw-test.invalid never resolved in 0.3 s")
            && msg.contains("headless service / DNS"),
        "{msg}"
    );
}

#[test]
fn malformed_addresses_fail_at_once() {
    for bad in [
        "no-port",
        "host:",
        "host:0",
        "fd00::1:80",
        "[fd00::1:80",
        ":80",
    ] {
        let start = Instant::now();
        let e = TcpStoreClient::connect(bad, T).err().unwrap();
        assert!(start.elapsed() < Duration::from_secs(1), "{bad}");
        assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}: {e}");
    }
}

#[test]
fn ipv6_literals_connect() {
    let Ok(s) = TcpStoreServer::bind("[::1]:0".parse().unwrap()) else {
        return; // no IPv6 loopback in this sandbox
    };
    let c = client(&format!("[::1]:{}", s.local_addr().port()));
    c.set("k", b"v").unwrap();
}

#[test]
fn tokens_admit_the_job_and_refuse_strangers() {
    let s = TcpStoreServer::bind_with_token("127.0.0.1:0".parse().unwrap(), Some("job-a")).unwrap();
    let addr = s.local_addr().to_string();
    let good = TcpStoreClient::connect_with_token(&addr, T, Some("job-a")).unwrap();
    good.set("k", b"v").unwrap();

    for wrong in [Some("job-b"), None, Some("")] {
        let start = Instant::now();
        let e = TcpStoreClient::connect_with_token(&addr, T, wrong)
            .err()
            .unwrap();
        // Refused at once, not retried until the deadline.
        assert!(start.elapsed() < Duration::from_secs(2), "{wrong:?}");
        assert!(matches!(e, StoreError::WrongToken { .. }), "{wrong:?}: {e}");
        assert!(e.to_string().contains(&addr), "{e}");
    }
    // The refusals did not disturb the job's own connections, old or new.
    assert_eq!(good.get("k").unwrap().unwrap(), b"v");
    let again = TcpStoreClient::connect_with_token(&addr, T, Some("job-a")).unwrap();
    assert_eq!(again.get("k").unwrap().unwrap(), b"v");

    // A tokened client does not join a job that has none: that is another job too.
    let (_open, open_addr) = server();
    let e = TcpStoreClient::connect_with_token(&open_addr, T, Some("job-a"))
        .err()
        .unwrap();
    assert!(matches!(e, StoreError::WrongToken { .. }), "{e}");
}

#[test]
fn the_token_is_not_on_the_wire_and_a_replayed_proof_is_refused() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; proto::CLIENT_HELLO_LEN];
        s.read_exact(&mut b).unwrap();
        b
    });
    let _ = TcpStoreClient::connect_with_token(&addr, Duration::from_millis(300), Some("s3cret"));
    let hello = t.join().unwrap();
    assert_eq!(&hello[..proto::HELLO_LEN], &proto::hello());
    assert!(!hello.windows(6).any(|w| w == b"s3cret"));

    let s =
        TcpStoreServer::bind_with_token("127.0.0.1:0".parse().unwrap(), Some("s3cret")).unwrap();
    let addr = s.local_addr().to_string();
    // Record a genuine client's whole greeting (its nonce and its proof) ...
    let key = busbw_transports::auth::Key::from_token(Some("s3cret"));
    let cn = [9u8; 16];
    let mut first = TcpStream::connect(&addr).unwrap();
    first.set_read_timeout(Some(T)).unwrap();
    first.write_all(&proto::client_hello(&cn)).unwrap();
    let mut challenge = [0u8; proto::HELLO_LEN + proto::SERVER_CHALLENGE_LEN];
    first.read_exact(&mut challenge).unwrap();
    let sn = &challenge[proto::HELLO_LEN..proto::HELLO_LEN + 16];
    // (the server proved the token over our nonce: mutual authentication)
    assert!(key.verify(
        auth_label::STORE_SERVER,
        &[&cn, sn],
        &challenge[proto::HELLO_LEN + 16..]
    ));
    let proof = key.proof(auth_label::STORE_CLIENT, &[sn, &cn]);
    first.write_all(&proof).unwrap();
    let mut status = [0u8; 1];
    first.read_exact(&mut status).unwrap();
    assert_eq!(status[0], proto::HELLO_OK);

    // ... and replay it byte for byte on a new connection: the server's fresh nonce makes the
    // recorded proof worthless.
    let mut replay = TcpStream::connect(&addr).unwrap();
    replay.set_read_timeout(Some(T)).unwrap();
    replay.write_all(&proto::client_hello(&cn)).unwrap();
    let mut again = [0u8; proto::HELLO_LEN + proto::SERVER_CHALLENGE_LEN];
    replay.read_exact(&mut again).unwrap();
    assert_ne!(again[proto::HELLO_LEN..], challenge[proto::HELLO_LEN..]);
    replay.write_all(&proof).unwrap();
    let mut rest = Vec::new();
    replay.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, [proto::HELLO_WRONG_TOKEN]);

    // The recorded connection itself still works: the refusal disturbed nobody.
    let mut e = proto::Encoder::new();
    e.u8(proto::OP_SET).bytes(b"k").bytes(b"v");
    first.write_all(&e.frame()).unwrap();
    let mut answer = [0u8; 5];
    first.read_exact(&mut answer).unwrap();
    assert_eq!(answer, [0, 0, 0, 1, proto::ST_OK]);
}

#[test]
fn a_fake_store_without_the_token_is_refused_by_the_client() {
    // Something on the port that speaks the protocol but cannot prove the token: the client
    // must not talk to it as to its own job's store.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; proto::CLIENT_HELLO_LEN];
        s.read_exact(&mut b).unwrap();
        let mut answer = proto::hello().to_vec();
        answer.extend_from_slice(&[0u8; proto::SERVER_CHALLENGE_LEN]);
        s.write_all(&answer).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    });
    let e = TcpStoreClient::connect_with_token(&addr, T, Some("mine"))
        .err()
        .unwrap();
    assert!(matches!(e, StoreError::WrongToken { .. }), "{e}");
    // The client sent no proof to the impostor, only zeros that tell a real store of
    // another job to log the refusal.
    assert_eq!(t.join().unwrap(), vec![0u8; 32]);
}

#[test]
fn slow_and_silent_connections_are_dropped_without_blocking_others() {
    let (_s, addr) = server();
    // One connection that never speaks, one that trickles its hello a byte at a time.
    let mut silent = TcpStream::connect(&addr).unwrap();
    let mut slow = TcpStream::connect(&addr).unwrap();
    let trickle = std::thread::spawn(move || {
        let hello = proto::client_hello(&[1; 16]);
        let start = Instant::now();
        for b in hello.iter().cycle() {
            if slow.write_all(&[*b]).is_err() || start.elapsed() > Duration::from_secs(20) {
                break;
            }
            std::thread::sleep(Duration::from_millis(400));
        }
        start.elapsed()
    });
    // The job is served meanwhile, at once.
    let start = Instant::now();
    let c = client(&addr);
    c.set("k", b"v").unwrap();
    assert_eq!(c.wait(&["k"], T).unwrap(), vec![b"v".to_vec()]);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // Both strays are cut off by the greeting deadline, not left to linger.
    silent.set_read_timeout(Some(T)).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(silent.read(&mut buf).unwrap_or(0), 0);
    let trickled = trickle.join().unwrap();
    assert!(trickled < Duration::from_secs(12), "{trickled:?}");
    assert!(trickled >= server::HELLO_TIMEOUT - Duration::from_millis(500));
}

#[test]
fn random_frames_never_take_the_server_down() {
    // Deterministic noise (xorshift), so a failure is reproducible: frames of random length
    // and content, announced lengths that lie, cut-off frames.
    let (_s, addr) = server();
    let good = client(&addr);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..40 {
        let (mut s, _) = raw_login(&addr, None);
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let len = (next() % 64) as usize;
        let mut body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if let Some(op) = body.first_mut() {
            *op %= 6; // mostly real opcodes, so the field decoders are exercised
        }
        let announced = match round % 4 {
            0 => len as u32,
            1 => len as u32 + 1 + (next() % 100) as u32,
            2 => next() as u32,
            _ => len.saturating_sub(1) as u32,
        };
        let _ = s.write_all(&announced.to_be_bytes());
        let _ = s.write_all(&body);
        let mut sink = [0u8; 256];
        let _ = s.read(&mut sink);
    }
    good.set("still", b"here").unwrap();
    assert_eq!(good.get("still").unwrap().unwrap(), b"here");
}

#[test]
fn an_older_client_is_told_the_version() {
    let (_s, addr) = server();
    let mut raw = TcpStream::connect(&addr).unwrap();
    let mut v1 = proto::hello();
    v1[8..].copy_from_slice(&1u32.to_be_bytes());
    raw.write_all(&v1).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, proto::hello());
}

#[test]
fn shutdown_disconnects_clients_even_mid_wait() {
    let (mut s, addr) = server();
    let idle = client(&addr);
    let waiting = client(&addr);
    idle.set("k", b"v").unwrap();
    let w = std::thread::spawn(move || waiting.wait(&["never"], T));
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    s.shutdown();
    let e = w.join().unwrap().unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(matches!(e, StoreError::Disconnected(_)), "{e}");
    let e = idle.get("k").unwrap_err();
    match &e {
        StoreError::Disconnected(m) => assert!(m.contains("rank 0") && m.contains(&addr), "{m}"),
        other => panic!("{other}"),
    }
    // The connection stays failed rather than pretending to recover.
    assert!(matches!(idle.get("k"), Err(StoreError::Disconnected(_))));
}

#[test]
fn close_interrupts_a_blocked_wait() {
    let (_s, addr) = server();
    let c = Arc::new(client(&addr));
    let c2 = c.clone();
    let w = std::thread::spawn(move || c2.wait(&["never"], T));
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    c.close();
    assert!(matches!(
        w.join().unwrap(),
        Err(StoreError::Disconnected(_))
    ));
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// A failed rank's requests end by the cutoff, however long each would have been allowed,
/// and once it has passed they fail without waiting at all; the server is not at fault.
#[test]
fn give_up_by_cuts_every_request_short() {
    let (_s, addr) = server();
    let c = client(&addr);
    c.set("k", b"v").unwrap();
    c.give_up_by(Instant::now() + Duration::from_millis(300));
    // Answered in time: the cutoff only shortens what would outlive it.
    assert_eq!(c.get("k").unwrap().unwrap(), b"v");
    let start = Instant::now();
    let err = c.wait(&["never"], T).unwrap_err();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "the wait took {took:?}");
    assert!(
        matches!(&err, StoreError::Disconnected(m) if m.contains("once the job has failed")),
        "{err}"
    );
    let start = Instant::now();
    assert!(matches!(c.set("k", b"w"), Err(StoreError::Disconnected(_))));
    assert!(start.elapsed() < Duration::from_millis(100));
    // A later cutoff does not lift the earlier one.
    c.give_up_by(Instant::now() + T);
    assert!(c.get("k").is_err());
    // Another client of the same store is untouched.
    assert_eq!(client(&addr).get("k").unwrap().unwrap(), b"v");
}

#[test]
fn oversized_values_are_refused_client_side() {
    let (_s, addr) = server();
    let c = client(&addr);
    let big = vec![0u8; MAX_VALUE_LEN + 1];
    assert!(matches!(c.set("big", &big), Err(StoreError::Protocol(_))));
    // The connection is still usable.
    c.set("small", b"ok").unwrap();
}

#[test]
fn names_resolve_and_every_address_is_tried() {
    // `localhost` may resolve to ::1 first, where nothing listens: the next address is tried.
    let (_s, addr) = server();
    let port = addr.rsplit_once(':').unwrap().1;
    let c = client(&format!("localhost:{port}"));
    c.set("k", b"v").unwrap();
}

/// The stable twin of `fuzz/fuzz_targets/store_request.rs`: valid request bodies, mutated
/// (bytes flipped, cut short, lengths inflated), and pure noise. Decoding must return, not
/// panic or allocate what a length claims.
#[test]
fn random_and_mutated_request_bodies_decode_or_fail_cleanly() {
    let mut corpus = Vec::new();
    let mut e = proto::Encoder::new();
    e.u8(proto::OP_SET).bytes(b"key").bytes(b"value");
    corpus.push(e.frame()[4..].to_vec());
    let mut e = proto::Encoder::new();
    e.u8(proto::OP_WAIT)
        .u64(1000)
        .u32(2)
        .bytes(b"a")
        .bytes(b"bb");
    corpus.push(e.frame()[4..].to_vec());
    let mut e = proto::Encoder::new();
    e.u8(proto::OP_ADD).bytes(b"n").i64(-3);
    corpus.push(e.frame()[4..].to_vec());
    for c in &corpus {
        assert!(fuzz_request(c).is_ok());
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..30_000usize {
        let mut d = corpus[i % corpus.len()].clone();
        match i % 4 {
            0 => d.truncate((next() as usize) % (d.len() + 1)),
            1 => {
                let at = (next() as usize) % d.len();
                d[at] = next() as u8;
            }
            2 => {
                // A length field claiming far more than the body holds.
                let at = 1 + (next() as usize) % (d.len() - 1);
                let end = (at + 4).min(d.len());
                d[at..end].fill(0xff);
            }
            _ => d = (0..next() % 64).map(|_| next() as u8).collect(),
        }
        let _ = fuzz_request(&d);
    }
}
