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
    let mut liar = TcpStream::connect(&addr).unwrap();
    liar.write_all(&proto::hello()).unwrap();
    liar.set_read_timeout(Some(T)).unwrap();
    let mut h = [0u8; proto::HELLO_LEN];
    liar.read_exact(&mut h).unwrap();
    liar.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
    assert_eq!(liar.read(&mut buf).unwrap_or(0), 0);

    // A well-framed request with garbage inside gets an error answer, not a crash.
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage.write_all(&proto::hello()).unwrap();
    garbage.set_read_timeout(Some(T)).unwrap();
    garbage.read_exact(&mut h).unwrap();
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
        let mut b = [0u8; proto::HELLO_LEN];
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
    assert!(matches!(e, StoreError::Disconnected(_)));
    assert!(msg.contains("rank 0") && msg.contains(&addr), "{msg}");
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

#[test]
fn oversized_values_are_refused_client_side() {
    let (_s, addr) = server();
    let c = client(&addr);
    let big = vec![0u8; MAX_VALUE_LEN + 1];
    assert!(matches!(c.set("big", &big), Err(StoreError::Protocol(_))));
    // The connection is still usable.
    c.set("small", b"ok").unwrap();
}
