use super::*;
use crate::store::MemoryStore;
use busbw_collectives::link::nodes::NodeMap;
use busbw_collectives::neighbours;
use busbw_transports::multi::NodeId;
use std::sync::atomic::{AtomicU64, Ordering};

const T: Duration = Duration::from_secs(20);

/// A store that counts the bytes of the values it hands back: what a rank fetches.
struct Counting {
    inner: Arc<dyn Store>,
    fetched: AtomicU64,
}

impl Store for Counting {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.set(key, value)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let v = self.inner.get(key)?;
        let n = v.as_ref().map_or(0, Vec::len);
        self.fetched.fetch_add(n as u64, Ordering::Relaxed);
        Ok(v)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        let v = self.inner.wait(keys, timeout)?;
        let n: usize = v.iter().map(Vec::len).sum();
        self.fetched.fetch_add(n as u64, Ordering::Relaxed);
        Ok(v)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.inner.add(key, delta)
    }
}

fn record(r: usize, per_node: usize) -> Record {
    Record::simulated(r, per_node, 16)
}

/// What one rank does at start-up: agree, register, learn the layout, fetch its neighbours.
fn start(boot: &Bootstrap, fingerprint: &str, per_node: usize) -> Result<Joined, BootstrapError> {
    boot.agree(fingerprint)?;
    let mut joined = boot.join(&record(boot.rank(), per_node))?;
    let first = neighbours(&joined.layout.nodes, boot.rank());
    joined.directory.prefetch(&first)?;
    Ok(joined)
}

/// `n` ranks as threads over one store (`absent` never start), each running `f`.
fn job<R: Send>(
    n: usize,
    absent: &[usize],
    store: &dyn Fn(usize) -> Arc<dyn Store>,
    timeout: Duration,
    f: &(dyn Fn(Bootstrap) -> R + Sync),
) -> Vec<(usize, R)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .filter(|r| !absent.contains(r))
            .map(|r| {
                let boot = Bootstrap::new(store(r), r, n, timeout);
                (r, s.spawn(move || f(boot)))
            })
            .collect();
        hs.into_iter()
            .map(|(r, h)| (r, h.join().expect("rank thread")))
            .collect()
    })
}

#[test]
fn every_rank_gets_the_layout_and_its_neighbours() {
    let (n, per) = (24, 4);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(n, &[], &|_| store.clone(), T, &|boot| {
        let r = boot.rank();
        let mut joined = start(&boot, "same", per).unwrap();
        assert_eq!(joined.layout.nodes, NodeMap::uniform(n, per), "rank {r}");
        assert_eq!(joined.layout.local_ranks(r), per);
        for p in neighbours(&joined.layout.nodes, r) {
            assert_eq!(
                joined.directory.cached(p),
                Some(&record(p, per)),
                "rank {r}"
            );
        }
        // Any other peer on demand (alltoall, pairwise), from the store.
        let far = (r + n / 2) % n;
        assert_eq!(joined.directory.record(far).unwrap(), &record(far, per));
        let e = joined.directory.record(n).unwrap_err().to_string();
        assert_eq!(e, format!("there is no rank {n} in a job of {n}"));
        // What only rank 0 prints reaches rank 0 only.
        let lines = boot
            .gather_root("route", format!("r{r}").as_bytes())
            .unwrap();
        (lines, joined.directory.cached(far).is_some())
    });
    for (r, (lines, _)) in &out {
        match lines {
            Some(l) if *r == 0 => {
                let want: Vec<Vec<u8>> = (0..n).map(|q| format!("r{q}").into_bytes()).collect();
                assert_eq!(l, &want);
            }
            None if *r != 0 => {}
            other => panic!("rank {r} got {other:?}"),
        }
    }
    // Irregular layouts too: nodes of 3, 1 and 2 ranks, ranks of node 0 split in two.
    let hosts = ["a", "a", "b", "c", "c", "a"];
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(6, &[], &|_| store.clone(), T, &|boot| {
        let r = boot.rank();
        boot.agree("same").unwrap();
        let mut rec = record(r, 1);
        rec.info.node = NodeId::new(hosts[r], "boot");
        boot.join(&rec).unwrap().layout
    });
    for (_, layout) in out {
        assert_eq!(layout.nodes.to_vec(), vec![0, 0, 1, 2, 2, 0]);
        assert_eq!(layout.local_ranks(3), 6, "one machine");
    }
}

#[test]
fn different_fingerprints_name_the_ranks_on_every_rank() {
    let n = 8;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(n, &[], &|_| store.clone(), T, &|boot| {
        let fp = match boot.rank() {
            2 | 5 => format!("-n 50 on {}", boot.rank()),
            _ => "-n 20".to_string(),
        };
        boot.agree(&fp).unwrap_err()
    });
    for (r, e) in out {
        let BootstrapError::Disagree(d) = e else {
            panic!("rank {r}: {e}")
        };
        assert_eq!(d.rank, r);
        assert_eq!(d.reference, "-n 20");
        assert_eq!(d.ranks, vec![2, 5]);
        assert_eq!(
            d.examples,
            vec![(2, "-n 50 on 2".into()), (5, "-n 50 on 5".into())]
        );
        assert_eq!(
            d.to_string(),
            "ranks 2, 5 run with another configuration than rank 0"
        );
    }
}

#[test]
fn a_rank_that_never_registers_is_named_everywhere() {
    let t = Duration::from_millis(300);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(4, &[2], &|_| store.clone(), t, &|boot| {
        boot.agree("same").unwrap_err().to_string()
    });
    for (r, e) in out {
        assert_eq!(e, "rank 2 never registered", "rank {r}");
    }
    // Past the agreement, a neighbour's record that never comes names the neighbour.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let b = Bootstrap::new(store.clone(), 1, 4, t);
    let mut dir = b.directory();
    let e = dir.prefetch(&[0, 2, 3]).unwrap_err();
    assert_eq!(e.to_string(), "ranks 0, 2-3 never registered");
    assert!(matches!(
        e,
        BootstrapError::NeverRegistered {
            source: StoreError::Timeout { .. },
            ..
        }
    ));
    store.set("info/3", &record(3, 1).encode()).unwrap();
    assert_eq!(dir.record(3).unwrap(), &record(3, 1));
    store.set("info/0", b"garbage").unwrap();
    let e = dir.record(0).unwrap_err().to_string();
    assert!(e.starts_with("rank 0 published a malformed record"), "{e}");
}

#[test]
fn rank_0_failing_to_lay_out_the_job_fails_every_rank_with_its_reason() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store.set("info/1", b"no newline, so no handle").unwrap();
    let out = job(3, &[1], &|_| store.clone(), T, &|boot| {
        boot.join(&record(boot.rank(), 1))
            .err()
            .map(|e| e.to_string())
    });
    for (r, e) in out {
        let e = e.unwrap_or_else(|| panic!("rank {r} joined"));
        assert!(
            e.contains("rank 1 published a malformed record"),
            "rank {r}: {e}"
        );
    }
}

#[test]
fn every_rank_learns_every_objection() {
    let n = 6;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(n, &[], &|_| store.clone(), T, &|boot| {
        let mine = match boot.rank() {
            1 => Some(String::new()),
            4 => Some("the matrix is 3x3".to_string()),
            _ => None,
        };
        let none = boot.objections("fine", None).unwrap();
        (none, boot.objections("usage", mine.as_deref()).unwrap())
    });
    assert_eq!(out.len(), n);
    for (r, (none, found)) in out {
        assert!(none.is_empty(), "rank {r}: {none:?}");
        assert_eq!(
            found,
            vec![(1, String::new()), (4, "the matrix is 3x3".to_string())],
            "rank {r}"
        );
    }
    // A rank that never says is named on every rank that waited for the verdict.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(
        3,
        &[2],
        &|_| store.clone(),
        Duration::from_millis(300),
        &|boot| boot.objections("usage", None).unwrap_err().to_string(),
    );
    for (r, e) in out {
        assert!(e.contains("rank 2"), "rank {r}: {e}");
    }
}

#[test]
fn rank_0s_value_reaches_every_rank_byte_for_byte_or_its_failure_does() {
    let n = 5;
    let id: Vec<u8> = (0..128u32).map(|i| (i * 37 % 256) as u8).collect();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(n, &[], &|_| store.clone(), T, &|boot| {
        let made = if boot.rank() == 0 {
            id.as_slice()
        } else {
            b"not mine".as_slice()
        };
        boot.share_root("nccl/id", Ok(made)).unwrap()
    });
    assert_eq!(out.len(), n);
    for (r, got) in out {
        assert_eq!(got, id, "rank {r}");
    }
    // Rank 0 could not make one: every rank says why.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(3, &[], &|_| store.clone(), T, &|boot| {
        let made = if boot.rank() == 0 {
            Err("ncclGetUniqueId failed: no network".to_string())
        } else {
            Ok(b"x".as_slice())
        };
        boot.share_root("nccl/id", made).unwrap_err().to_string()
    });
    for (r, e) in out {
        assert!(
            e.contains("ncclGetUniqueId failed: no network"),
            "rank {r}: {e}"
        );
    }
    // Rank 0 never comes: it is named.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = job(
        3,
        &[0],
        &|_| store.clone(),
        Duration::from_millis(200),
        &|boot| {
            boot.share_root("nccl/id", Ok(b"x"))
                .unwrap_err()
                .to_string()
        },
    );
    for (r, e) in out {
        assert!(
            e.contains("rank 0 never published nccl/id"),
            "rank {r}: {e}"
        );
    }
}

/// The bytes a rank (other than rank 0) fetches to start: the verdict, the layout and its
/// neighbours' records. They depend on the job's shape, not its size.
fn fetched_per_rank(n: usize) -> (u64, u64) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let counters: Vec<Arc<Counting>> = (0..n)
        .map(|_| {
            Arc::new(Counting {
                inner: store.clone(),
                fetched: AtomicU64::new(0),
            })
        })
        .collect();
    let out = job(n, &[], &|r| counters[r].clone(), T, &|boot| {
        start(&boot, "the same flags everywhere", 8).map(|_| ())
    });
    assert!(out.iter().all(|(_, r)| r.is_ok()));
    let others = counters[1..]
        .iter()
        .map(|c| c.fetched.load(Ordering::Relaxed));
    (
        others.clone().max().unwrap_or(0),
        others.sum::<u64>() / (n as u64 - 1),
    )
}

#[test]
fn what_a_rank_fetches_does_not_grow_with_the_job() {
    let (max64, mean64) = fetched_per_rank(64);
    let (max512, mean512) = fetched_per_rank(512);
    // The layout's text grows by a digit per map ("0:8x8" to "0:8x64"); nothing else may.
    assert!(
        max512 <= max64 + 4,
        "max {max64} B at 64 ranks, {max512} B at 512"
    );
    // The share of ranks with tree links beyond their node moves with the node count, but
    // it is a share: bounded, not growing.
    assert!(
        mean512 <= mean64 * 11 / 10,
        "mean {mean64} B at 64 ranks, {mean512} B at 512"
    );
    // Against the all-gather this replaced: every record to every rank.
    assert!(max512 < 512 * record(0, 8).encode().len() as u64 / 8);
}
