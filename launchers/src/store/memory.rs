use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{apply_add, Store, StoreError};

/// In-process store: the whole job is one process (`--np 1`) or a unit test, so a mutex and a
/// condition variable give exactly the TCP store's semantics without a socket.
#[derive(Default)]
pub struct MemoryStore {
    data: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A panic in another thread while holding the lock cannot leave the map half-updated
    /// (every mutation is a single insert), so poisoning is ignored rather than propagated.
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.lock().insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().get(key).cloned())
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        let start = Instant::now();
        let mut data = self.lock();
        loop {
            let missing: Vec<String> = keys
                .iter()
                .filter(|k| !data.contains_key(**k))
                .map(|k| k.to_string())
                .collect();
            if missing.is_empty() {
                return Ok(keys
                    .iter()
                    .map(|k| data.get(*k).cloned().unwrap_or_default())
                    .collect());
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(StoreError::Timeout {
                    secs: timeout.as_secs_f64(),
                    missing,
                });
            }
            data = self
                .changed
                .wait_timeout(data, timeout - elapsed)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let mut data = self.lock();
        let new = apply_add(key, data.get(key).map(Vec::as_slice), delta)?;
        data.insert(key.to_string(), new.to_string().into_bytes());
        drop(data);
        self.changed.notify_all();
        Ok(new)
    }
}
