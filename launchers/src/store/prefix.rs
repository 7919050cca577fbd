use std::sync::Arc;
use std::time::Duration;

use super::{Store, StoreError};

/// A view of a store with every key namespaced under `prefix/`, so independent users of one
/// job-wide store (tiers, sub-communicators, repeated runs) cannot collide on key names.
pub struct PrefixStore<S: Store + ?Sized = dyn Store> {
    inner: Arc<S>,
    prefix: String,
}

impl<S: Store + ?Sized> PrefixStore<S> {
    pub fn new(inner: Arc<S>, prefix: impl Into<String>) -> Self {
        Self {
            inner,
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn full(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }
}

impl<S: Store + ?Sized> Store for PrefixStore<S> {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.set(&self.full(key), value)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(&self.full(key))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        let full: Vec<String> = keys.iter().map(|k| self.full(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.wait(&refs, timeout)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.inner.add(&self.full(key), delta)
    }
}
