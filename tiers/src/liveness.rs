//! Who still answers. A gate must end with a verdict even when a node hangs (a stopped
//! process, a kernel stuck in I/O) or drops off the network, so a phase's failures are kept
//! where they happen instead of ending the job, and after the phase rank 0 calls the roll: a
//! rank that has not answered within `-T` of rank 0's call is marked failed with its node,
//! and the phases after run without that node. A node that answers but with which no partner
//! can exchange data is found by the pairwise rounds instead ([`crate::pairwise`]).
//!
//! Rank 0 serves the job's store: if it is the one that hangs, the others lose the store and
//! end with that error; nothing here can help then.

use crate::run::wait_some;
use crate::{Error, Job};
use std::collections::BTreeMap;
use std::time::Duration;

/// The nodes given up on, each with why, and the phases that failed (in words): the same on
/// every rank after each roll call.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Lost {
    pub nodes: BTreeMap<usize, String>,
    pub failures: Vec<String>,
}

impl Lost {
    pub fn contains(&self, node: usize) -> bool {
        self.nodes.contains_key(&node)
    }
}

/// What a rank says at a roll call: nothing went wrong, or its phase's error.
fn answer(failure: Option<&str>) -> Vec<u8> {
    match failure {
        None => b"ok".to_vec(),
        Some(f) => format!("failed {f}").into_bytes(),
    }
}

/// Every rank not lost, after `phase` (`what`: the phase in words, for the reasons):
/// publishes whether its part failed, and learns from rank 0 which nodes are lost so far.
/// `of_rank` maps ranks to nodes, `names` nodes to names. A rank whose own node rank 0
/// marked failed gets [`Error::MarkedFailed`]: the rest of the gate runs without it.
pub(crate) fn roll_call(
    job: &Job,
    (phase, what): (&str, &str),
    rank: usize,
    (of_rank, names): (&[usize], &[String]),
    failure: Option<&str>,
    lost: &mut Lost,
) -> Result<(), Error> {
    let store = &*job.store;
    store.set(&format!("tiers/alive/{phase}/{rank}"), &answer(failure))?;
    let verdict = format!("tiers/lost/{phase}");
    if rank == 0 {
        let expected: Vec<usize> = (0..of_rank.len())
            .filter(|&r| !lost.contains(of_rank[r]))
            .collect();
        let keys: Vec<(String, String)> = expected
            .iter()
            .map(|r| (format!("tiers/alive/{phase}/{r}"), String::new()))
            .collect();
        let answers = wait_some(store, &keys, &job.abort, job.timeout)?;
        judge(
            lost,
            what,
            &expected,
            &answers,
            (of_rank, names),
            job.timeout,
        );
        store.set(&verdict, &serde_json::to_vec(&*lost)?)?;
    } else {
        // Rank 0 may reach the call a -T after this rank (its own wait on a hung peer ran
        // longer) and then waits a -T for the slowest: three leave room for both.
        let v = store.wait(&[&verdict], job.timeout * 3 + Duration::from_secs(10))?;
        *lost = serde_json::from_slice(&v[0])?;
    }
    let me = of_rank[rank];
    match lost.nodes.get(&me) {
        Some(reason) => Err(Error::MarkedFailed {
            node: names[me].clone(),
            reason: reason.clone(),
        }),
        None => Ok(()),
    }
}

/// Rank 0: the nodes of ranks that did not answer are lost; the first failure a rank
/// reported names the phase's failure (the others are usually its echoes).
fn judge(
    lost: &mut Lost,
    what: &str,
    expected: &[usize],
    answers: &[Option<Vec<u8>>],
    (of_rank, names): (&[usize], &[String]),
    timeout: Duration,
) {
    let mut failure = None;
    for (&r, a) in expected.iter().zip(answers) {
        match a {
            None => {
                lost.nodes.entry(of_rank[r]).or_insert_with(|| {
                    format!(
                        "rank {r} did not answer within {} s (-T) after {what}: hung, killed, or cut off from the job's store",
                        timeout.as_secs()
                    )
                });
            }
            Some(v) => {
                let text = String::from_utf8_lossy(v);
                if let (None, Some(f)) = (&failure, text.strip_prefix("failed ")) {
                    failure = Some(format!(
                        "{what} failed: rank {r} on {}: {f}",
                        names[of_rank[r]]
                    ));
                }
            }
        }
    }
    lost.failures.extend(failure);
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_launchers::{MemoryStore, Store};
    use busbw_transports::Abort;
    use std::sync::Arc;
    use std::time::Instant;

    fn job(store: Arc<MemoryStore>) -> Job {
        Job {
            store,
            abort: Abort::new(),
            hostname: "n0".into(),
            timeout: Duration::from_millis(200),
            collective: "all_reduce_perf".into(),
        }
    }

    #[test]
    fn a_rank_that_does_not_answer_loses_its_node_and_the_first_failure_is_kept() {
        let store = Arc::new(MemoryStore::new());
        let j = job(store.clone());
        // Ranks 0-3 on nodes 0, 0, 1, 2; rank 3 never answers, rank 2 failed waiting on it.
        let of_rank = [0, 0, 1, 2];
        let names: Vec<String> = ["n0", "n1", "n2"].map(String::from).to_vec();
        store.set("tiers/alive/world/1", b"ok").unwrap();
        store
            .set(
                "tiers/alive/world/2",
                &answer(Some("timed out waiting for rank 3")),
            )
            .unwrap();
        let mut lost = Lost::default();
        let started = Instant::now();
        roll_call(
            &j,
            ("world", "the whole job's sweep"),
            0,
            (&of_rank, &names),
            None,
            &mut lost,
        )
        .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(lost.nodes.keys().copied().collect::<Vec<_>>(), [2]);
        assert!(lost.nodes[&2]
            .starts_with("rank 3 did not answer within 0 s (-T) after the whole job's sweep"));
        assert_eq!(
            lost.failures,
            ["the whole job's sweep failed: rank 2 on n1: timed out waiting for rank 3"]
        );
        // Every other rank reads the same list; the lost node's rank, had it woken up,
        // learns it was marked failed.
        let mut seen = Lost::default();
        roll_call(&j, ("world", "x"), 1, (&of_rank, &names), None, &mut seen).unwrap();
        assert_eq!(seen, lost);
        let e = roll_call(&j, ("world", "x"), 3, (&of_rank, &names), None, &mut seen).unwrap_err();
        assert!(
            matches!(e, Error::MarkedFailed { ref node, .. } if node == "n2"),
            "{e}"
        );
        // The next call expects no answer from the lost node.
        for r in 1..3 {
            store.set(&format!("tiers/alive/t1/{r}"), b"ok").unwrap();
        }
        let started = Instant::now();
        roll_call(&j, ("t1", "tier 1"), 0, (&of_rank, &names), None, &mut lost).unwrap();
        assert!(started.elapsed() < Duration::from_millis(200));
        assert_eq!(lost.nodes.len(), 1);
        assert_eq!(lost.failures.len(), 1);
    }
}
