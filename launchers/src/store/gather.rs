//! All-gather through the store: every rank contributes one value, every rank gets all.
//!
//! The direct way, each rank waiting for all `n` keys, makes the store look up and send
//! `n²` values one by one: at 4096 ranks that is 16 million values and as many allocations on
//! the clients, about 15 s on two cores. Here rank 0 alone waits for the `n` keys, packs them
//! into one blob under `<prefix>/all`, and every other rank fetches that single value: the
//! same bytes travel (they must), but as `n` large transfers instead of `n²` small ones.
//!
//! A rank that never registers is still named: rank 0's wait lists the missing keys, and a
//! rank whose wait for the blob times out asks the store which contributions are missing.

use super::{Store, StoreError};
use std::time::Duration;

const MAGIC: &[u8; 4] = b"BBAG";

/// Every rank's value, in rank order, as views into the one blob they arrived in (no
/// allocation per value: at 4096 ranks that is 16 million of them across the job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gathered {
    blob: Vec<u8>,
    spans: Vec<(usize, usize)>,
}

impl Gathered {
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Rank `i`'s value.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.spans.get(i).map(|&(a, b)| &self.blob[a..b])
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.spans.iter().map(|&(a, b)| &self.blob[a..b])
    }
}

/// Publish `value` as this rank's part of `prefix` and return every rank's part, in rank
/// order. Every rank of the job must call it with the same `prefix` and `size`.
pub fn all_gather(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    value: &[u8],
    timeout: Duration,
) -> Result<Gathered, StoreError> {
    store.set(&format!("{prefix}/{rank}"), value)?;
    let all_key = format!("{prefix}/all");
    if rank == 0 {
        let keys: Vec<String> = (0..size).map(|r| format!("{prefix}/{r}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let blob = pack(&store.wait(&refs, timeout)?);
        store.set(&all_key, &blob)?;
        return unpack(blob);
    }
    match store.wait(&[&all_key], timeout) {
        Ok(mut blob) => {
            let values = unpack(blob.swap_remove(0))?;
            if values.len() != size {
                return Err(StoreError::Protocol(format!(
                    "{all_key} holds {} values for a job of {size} ranks (ranks disagree about the job size?)",
                    values.len()
                )));
            }
            Ok(values)
        }
        Err(StoreError::Timeout { secs, .. }) => {
            // Name the ranks that never contributed (rank 0 waits for them), if any.
            let keys: Vec<String> = (0..size).map(|r| format!("{prefix}/{r}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            match store.wait(&refs, Duration::ZERO) {
                Err(StoreError::Timeout { missing, .. }) => {
                    Err(StoreError::Timeout { secs, missing })
                }
                _ => Err(StoreError::Timeout {
                    secs,
                    missing: vec![all_key],
                }),
            }
        }
        Err(e) => Err(e),
    }
}

/// `MAGIC`, count (u32 LE), then per value its length (u32 LE) and bytes.
fn pack(values: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = values.iter().map(|v| v.len() + 4).sum();
    let mut out = Vec::with_capacity(8 + total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(values.len() as u32).to_le_bytes());
    for v in values {
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn unpack(blob: Vec<u8>) -> Result<Gathered, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("all-gather blob: {why}"));
    if !blob.starts_with(MAGIC) {
        return Err(bad("bad magic"));
    }
    let word = |at: usize| -> Result<usize, StoreError> {
        let w: [u8; 4] = blob
            .get(at..at + 4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("truncated"))?;
        Ok(u32::from_le_bytes(w) as usize)
    };
    let n = word(MAGIC.len())?;
    let mut at = MAGIC.len() + 4;
    // Each value takes at least its 4-byte length: a garbage count cannot allocate more.
    if n > (blob.len() - at) / 4 {
        return Err(bad("count larger than the blob"));
    }
    let mut spans = Vec::with_capacity(n);
    for _ in 0..n {
        let len = word(at)?;
        at += 4;
        let end = at
            .checked_add(len)
            .filter(|e| *e <= blob.len())
            .ok_or_else(|| bad("value past the end"))?;
        spans.push((at, end));
        at = end;
    }
    if at != blob.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(Gathered { blob, spans })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use std::sync::Arc;

    #[test]
    fn pack_round_trip_and_garbage() {
        let v = vec![b"a".to_vec(), vec![], vec![7; 300]];
        let g = unpack(pack(&v)).unwrap();
        assert_eq!(g.iter().map(<[u8]>::to_vec).collect::<Vec<_>>(), v);
        assert_eq!(g.get(2), Some(&[7u8; 300][..]));
        assert_eq!(g.get(3), None);
        assert!(unpack(pack(&[])).unwrap().is_empty());
        let good = pack(&v);
        for cut in 0..good.len() {
            assert!(unpack(good[..cut].to_vec()).is_err(), "truncated at {cut}");
        }
        let mut huge = good.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(huge).is_err());
        let mut long = good.clone();
        long[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(long).is_err());
        let mut trailing = good;
        trailing.push(0);
        assert!(unpack(trailing).is_err());
    }

    #[test]
    fn every_rank_gets_every_value() {
        let store = Arc::new(MemoryStore::new());
        let n = 7;
        let out: Vec<_> = (0..n)
            .map(|r| {
                let s = store.clone();
                std::thread::spawn(move || {
                    all_gather(&*s, "x", r, n, &[r as u8; 3], Duration::from_secs(10)).unwrap()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let want: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8; 3]).collect();
        for o in out {
            assert_eq!(o.iter().map(<[u8]>::to_vec).collect::<Vec<_>>(), want);
        }
    }

    #[test]
    fn missing_rank_is_named_on_every_rank() {
        let store = Arc::new(MemoryStore::new());
        let t = Duration::from_millis(300);
        let hs: Vec<_> = [0usize, 1, 3]
            .into_iter()
            .map(|r| {
                let s = store.clone();
                std::thread::spawn(move || all_gather(&*s, "x", r, 4, b"v", t).unwrap_err())
            })
            .collect();
        for h in hs {
            match h.join().unwrap() {
                StoreError::Timeout { missing, .. } => assert_eq!(missing, vec!["x/2"]),
                e => panic!("{e}"),
            }
        }
    }
}
