//! How the ranks of a job learn about each other through the store, so that what a rank
//! fetches grows with what it needs, not with the job.
//!
//! Every rank fetching every rank's record from rank 0's store is n² bytes: 3.2 GB served
//! at 4096 ranks, about 200 GB at 32768. Here rank 0 alone reads every rank's values
//! (gather to the root, n values in one wait) and publishes what the others need in a form
//! that does not grow with the job; every other rank fetches only that and the records of
//! the peers it connects to:
//!
//! 1. [`Bootstrap::propose`]: each rank publishes its configuration's fingerprint
//!    (`plan/<rank>`); [`Bootstrap::verdict`]: rank 0 compares them all with its own and
//!    publishes the ranks that differ (`plan/verdict`), which every rank reads.
//! 2. [`Bootstrap::register`]: each rank publishes its [`Record`] (`info/<rank>`: its
//!    description and connection handle); [`Bootstrap::layout`]: rank 0 reads them all,
//!    works out the node map (segments: one for "8 ranks per node, nodes in order") and
//!    publishes it (`layout`), which every rank reads.
//! 3. [`Directory::prefetch`]: each rank fetches the records of its first peers (its ring and
//!    tree neighbours, which it computes from the node map), and any other peer's record
//!    when it first connects to it ([`Directory::record`]).
//! 4. [`Bootstrap::gather_root`]: what only rank 0 prints (device lines) goes to rank 0 only.
//! 5. [`Bootstrap::objections`]: checks each rank makes against its part of the job, gathered
//!    by rank 0 and published back, so that every rank stops (or goes on) together.
//!
//! Every wait is bounded and names who is missing: a rank that never published is
//! "rank 5 never registered" on rank 0 and, through the store, on every rank that waits for
//! rank 0's answer; rank 0's own failure is published in place of its answer, so every rank
//! fails with the same reason.

mod directory;
mod record;
#[cfg(test)]
mod tests;

pub use directory::Directory;
pub use record::{Disagreement, Layout, Record};

use crate::rendezvous::never_registered;
use crate::store::{Store, StoreError};
use record::Verdict;
use std::sync::Arc;
use std::time::Duration;

/// Store prefix of the fingerprints (`plan/<rank>`).
pub const PLAN: &str = "plan";
const VERDICT: &str = "plan/verdict";
/// Store prefix of the records (`info/<rank>`).
pub const INFO: &str = crate::rank_info::PREFIX;
const LAYOUT: &str = "layout";
/// What rank 0 publishes in place of an answer it could not give.
const FAILED: &str = "error ";
/// Differing ranks whose fingerprints the verdict carries.
const EXAMPLES: usize = 4;

/// Why a rank could not join.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// Ranks never published what was waited for: `who` names them by rank.
    #[error("{who}")]
    NeverRegistered {
        who: String,
        #[source]
        source: StoreError,
    },
    /// The ranks were started with different configurations.
    #[error("{0}")]
    Disagree(Disagreement),
    #[error("rank {rank} published a malformed record: {why}")]
    Malformed { rank: usize, why: String },
    /// Rank 0 could not give its answer; every rank fails with its reason.
    #[error("rank 0 could not answer: {0}")]
    Rank0(String),
    #[error("there is no rank {rank} in a job of {size}")]
    NoSuchRank { rank: usize, size: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A rank's part in the bootstrap of a job of `size` ranks.
pub struct Bootstrap {
    store: Arc<dyn Store>,
    rank: usize,
    size: usize,
    timeout: Duration,
}

/// What a rank holds once the job is laid out.
pub struct Joined {
    pub layout: Layout,
    /// Peers' records: all of them on rank 0 (it read them), none yet elsewhere.
    pub directory: Directory,
}

impl Bootstrap {
    /// Every wait is bounded by `timeout`.
    pub fn new(store: Arc<dyn Store>, rank: usize, size: usize, timeout: Duration) -> Self {
        Bootstrap {
            store,
            rank,
            size,
            timeout,
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// [`Bootstrap::propose`], then [`Bootstrap::verdict`].
    pub fn agree(&self, fingerprint: &str) -> Result<(), BootstrapError> {
        self.propose(fingerprint)?;
        self.verdict(fingerprint)
    }

    /// Publish this rank's configuration fingerprint for rank 0 to judge.
    pub fn propose(&self, fingerprint: &str) -> Result<(), BootstrapError> {
        self.publish(PLAN, fingerprint.as_bytes())
    }

    /// Rank 0's verdict on every rank's fingerprint: `Err(Disagree)` on every rank when any
    /// differs from rank 0's. Rank 0 waits for all fingerprints; the others for the verdict.
    pub fn verdict(&self, fingerprint: &str) -> Result<(), BootstrapError> {
        let verdict = if self.rank == 0 {
            let all = self.root_wait(PLAN, VERDICT)?;
            let differ: Vec<(usize, &Vec<u8>)> = all
                .iter()
                .enumerate()
                .filter(|(_, p)| p.as_slice() != fingerprint.as_bytes())
                .collect();
            let verdict = Verdict {
                reference: fingerprint.to_string(),
                examples: differ
                    .iter()
                    .take(EXAMPLES)
                    .map(|(r, p)| (*r, String::from_utf8_lossy(p).into_owned()))
                    .collect(),
                ranks: differ.iter().map(|(r, _)| *r).collect(),
            };
            let text = serde_json::to_string(&verdict)
                .map_err(|e| BootstrapError::Rank0(format!("encoding the verdict: {e}")))?;
            self.store.set(VERDICT, text.as_bytes())?;
            verdict
        } else {
            let text = self.answer(VERDICT, PLAN)?;
            serde_json::from_slice(&text)
                .map_err(|e| BootstrapError::Rank0(format!("malformed verdict: {e}")))?
        };
        if verdict.ranks.is_empty() && verdict.reference == fingerprint {
            return Ok(());
        }
        Err(BootstrapError::Disagree(Disagreement {
            rank: self.rank,
            mine: fingerprint.to_string(),
            reference: verdict.reference,
            examples: verdict.examples,
            ranks: verdict.ranks,
        }))
    }

    /// [`Bootstrap::register`], then [`Bootstrap::layout`].
    pub fn join(&self, record: &Record) -> Result<Joined, BootstrapError> {
        self.register(record)?;
        self.layout()
    }

    /// Publish this rank's record.
    pub fn register(&self, record: &Record) -> Result<(), BootstrapError> {
        self.publish(INFO, &record.encode())
    }

    /// The job's layout: rank 0 reads every record, works it out and publishes it; the
    /// others read it.
    pub fn layout(&self) -> Result<Joined, BootstrapError> {
        let mut directory = self.directory();
        if self.rank != 0 {
            let text = self.answer(LAYOUT, INFO)?;
            let layout = Layout::decode(&String::from_utf8_lossy(&text), self.size)
                .map_err(|e| BootstrapError::Rank0(format!("malformed layout: {e}")))?;
            return Ok(Joined { layout, directory });
        }
        let all = self.root_wait(INFO, LAYOUT)?;
        let mut infos = Vec::with_capacity(all.len());
        for (rank, raw) in all.iter().enumerate() {
            match Record::decode(raw) {
                Ok(r) => {
                    infos.push(r.info.clone());
                    directory.insert(rank, r);
                }
                Err(why) => return Err(self.fail(LAYOUT, BootstrapError::Malformed { rank, why })),
            }
        }
        let layout = Layout::of(&infos);
        self.store.set(LAYOUT, layout.encode().as_bytes())?;
        Ok(Joined { layout, directory })
    }

    /// An empty directory of this job's records.
    pub fn directory(&self) -> Directory {
        Directory::new(self.store.clone(), self.size, self.timeout)
    }

    /// Publish `value` under `prefix/<rank>`; rank 0 gets every rank's, in rank order, and
    /// the others `None`: for what only rank 0 prints.
    pub fn gather_root(
        &self,
        prefix: &str,
        value: &[u8],
    ) -> Result<Option<Vec<Vec<u8>>>, BootstrapError> {
        self.publish(prefix, value)?;
        if self.rank != 0 {
            return Ok(None);
        }
        let keys = rank_keys(prefix, self.size);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let all = self
            .store
            .wait(&refs, self.timeout)
            .map_err(|e| named(e, prefix))?;
        Ok(Some(all))
    }

    /// Every rank's objection to going on, known to every rank: each publishes its own (or
    /// none) under `prefix/<rank>`, rank 0 reads them all and publishes the ranks that
    /// objected with what they said (`prefix/verdict`), which the others read. For checks a
    /// rank makes against its part of the job (its group's size, its environment): every rank
    /// learns the same answer, so they all stop together rather than some leaving while
    /// others wait for them, and rank 0 can say what the others found.
    pub fn objections(
        &self,
        prefix: &str,
        mine: Option<&str>,
    ) -> Result<Vec<(usize, String)>, BootstrapError> {
        // A leading byte tells "no objection" from an empty one.
        let value = match mine {
            Some(m) => format!("!{m}"),
            None => String::from("."),
        };
        self.publish(prefix, value.as_bytes())?;
        let answer = format!("{prefix}/verdict");
        if self.rank == 0 {
            let all = self.root_wait(prefix, &answer)?;
            let found: Vec<(usize, String)> = all
                .iter()
                .enumerate()
                .filter_map(|(r, v)| {
                    v.strip_prefix(b"!")
                        .map(|m| (r, String::from_utf8_lossy(m).into_owned()))
                })
                .collect();
            let text = serde_json::to_string(&found)
                .map_err(|e| BootstrapError::Rank0(format!("encoding the objections: {e}")))?;
            self.store.set(&answer, text.as_bytes())?;
            return Ok(found);
        }
        let text = self.answer(&answer, prefix)?;
        serde_json::from_slice(&text)
            .map_err(|e| BootstrapError::Rank0(format!("malformed objections: {e}")))
    }

    /// Rank 0's value under `key`, on every rank: what the whole job must use the same of
    /// (NCCL's unique id). Rank 0 passes what it made, or why it could not, and every rank
    /// returns the value or fails with rank 0's reason; the others' `made` is ignored. A rank
    /// 0 that never publishes is named when the wait runs out.
    pub fn share_root(
        &self,
        key: &str,
        made: Result<&[u8], String>,
    ) -> Result<Vec<u8>, BootstrapError> {
        if self.rank == 0 {
            let value = match made {
                Ok(v) => [b".".as_slice(), v].concat(),
                Err(why) => {
                    let _ = self.store.set(key, format!("{FAILED}{why}").as_bytes());
                    return Err(BootstrapError::Rank0(why));
                }
            };
            self.store.set(key, &value)?;
            return Ok(value[1..].to_vec());
        }
        let text = match self.store.wait(&[key], self.timeout) {
            Ok(mut v) => v.swap_remove(0),
            Err(e @ StoreError::Timeout { .. }) => {
                return Err(BootstrapError::NeverRegistered {
                    who: format!("rank 0 never published {key}"),
                    source: e,
                })
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(why) = text.strip_prefix(FAILED.as_bytes()) {
            return Err(BootstrapError::Rank0(
                String::from_utf8_lossy(why).into_owned(),
            ));
        }
        match text.strip_prefix(b".") {
            Some(v) => Ok(v.to_vec()),
            None => Err(BootstrapError::Malformed {
                rank: 0,
                why: format!("{key} is not a shared value"),
            }),
        }
    }

    fn publish(&self, prefix: &str, value: &[u8]) -> Result<(), BootstrapError> {
        Ok(self.store.set(&format!("{prefix}/{}", self.rank), value)?)
    }

    /// Rank 0 waits for every rank's `prefix/<rank>`; if that fails, it publishes the failure
    /// under `answer` so that the ranks waiting for its answer fail with the same reason.
    fn root_wait(&self, prefix: &str, answer: &str) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let keys = rank_keys(prefix, self.size);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.store
            .wait(&refs, self.timeout)
            .map_err(|e| self.fail(answer, named(e, prefix)))
    }

    fn fail(&self, answer: &str, e: BootstrapError) -> BootstrapError {
        let _ = self.store.set(answer, format!("{FAILED}{e}").as_bytes());
        e
    }

    /// Rank 0's answer under `key`. When it does not come, or comes as a failure, the ranks
    /// that never published under `prefix` are named (rank 0 waits for them), so every rank
    /// says what rank 0 says; else rank 0's own reason.
    fn answer(&self, key: &str, prefix: &str) -> Result<Vec<u8>, BootstrapError> {
        let secs = self.timeout.as_secs_f64();
        let why = match self.store.wait(&[key], self.timeout) {
            Ok(mut v) => {
                let text = v.swap_remove(0);
                match text.strip_prefix(FAILED.as_bytes()) {
                    Some(why) => Some(String::from_utf8_lossy(why).into_owned()),
                    None => return Ok(text),
                }
            }
            Err(StoreError::Timeout { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let keys = rank_keys(prefix, self.size);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        match self.store.wait(&refs, Duration::ZERO) {
            Err(StoreError::Timeout { missing, .. }) if !missing.is_empty() => {
                Err(named(StoreError::Timeout { secs, missing }, prefix))
            }
            _ => Err(match why {
                Some(why) => BootstrapError::Rank0(why),
                None => StoreError::Timeout {
                    secs,
                    missing: vec![key.to_string()],
                }
                .into(),
            }),
        }
    }
}

fn rank_keys(prefix: &str, size: usize) -> Vec<String> {
    (0..size).map(|r| format!("{prefix}/{r}")).collect()
}

/// A timeout on `prefix/<rank>` keys says which ranks never registered.
pub(crate) fn named(e: StoreError, prefix: &str) -> BootstrapError {
    let who = match &e {
        StoreError::Timeout { missing, .. } => never_registered(missing, prefix),
        _ => None,
    };
    match who {
        Some(who) => BootstrapError::NeverRegistered { who, source: e },
        None => e.into(),
    }
}
