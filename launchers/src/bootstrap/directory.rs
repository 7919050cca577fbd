//! Peers' records, fetched from the store when first needed and kept.

use super::{named, BootstrapError, Record, INFO};
use crate::store::Store;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The records this rank has fetched. A map, not a list of every rank: a rank holds the few
/// it connects to, and a process simulating thousands of ranks holds thousands of these.
pub struct Directory {
    store: Arc<dyn Store>,
    size: usize,
    timeout: Duration,
    records: HashMap<usize, Record>,
}

impl Directory {
    pub(super) fn new(store: Arc<dyn Store>, size: usize, timeout: Duration) -> Directory {
        Directory {
            store,
            size,
            timeout,
            records: HashMap::new(),
        }
    }

    pub(super) fn insert(&mut self, rank: usize, record: Record) {
        self.records.insert(rank, record);
    }

    /// Ranks in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Rank `rank`'s record if this rank has it already.
    pub fn cached(&self, rank: usize) -> Option<&Record> {
        self.records.get(&rank)
    }

    /// Rank `rank`'s record, fetched on first use.
    pub fn record(&mut self, rank: usize) -> Result<&Record, BootstrapError> {
        if !self.records.contains_key(&rank) {
            self.prefetch(&[rank])?;
        }
        self.records.get(&rank).ok_or(BootstrapError::NoSuchRank {
            rank,
            size: self.size,
        })
    }

    /// Fetch the records of `ranks` this rank does not hold yet, in one wait. Records are
    /// published before rank 0 lays the job out, so after [`super::Bootstrap::layout`] the
    /// wait returns at once; a record that does not come names its rank.
    pub fn prefetch(&mut self, ranks: &[usize]) -> Result<(), BootstrapError> {
        let mut want: Vec<usize> = Vec::with_capacity(ranks.len());
        for &rank in ranks {
            if rank >= self.size {
                return Err(BootstrapError::NoSuchRank {
                    rank,
                    size: self.size,
                });
            }
            if !self.records.contains_key(&rank) {
                want.push(rank);
            }
        }
        want.sort_unstable();
        want.dedup();
        if want.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = want.iter().map(|r| format!("{INFO}/{r}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = self
            .store
            .wait(&refs, self.timeout)
            .map_err(|e| named(e, INFO))?;
        for (rank, raw) in want.into_iter().zip(values) {
            let record =
                Record::decode(&raw).map_err(|why| BootstrapError::Malformed { rank, why })?;
            self.records.insert(rank, record);
        }
        Ok(())
    }
}
