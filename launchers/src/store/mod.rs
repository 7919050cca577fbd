//! The rendezvous key/value store.
//!
//! The shape is gloo's (the store PyTorch uses for the same job): `set`, a non-blocking `get`,
//! a blocking `wait` on a set of keys and an atomic `add`. That is enough to build every
//! control-plane step the job needs (peer-info exchange, barriers, abort broadcast) and nothing
//! more, so the in-process and TCP implementations stay interchangeable and the callers never
//! know which one they have.

mod client;
mod gather;
mod memory;
mod prefix;
mod proto;
mod server;

pub use client::TcpStoreClient;
pub use gather::{all_gather, Gathered};
pub use memory::MemoryStore;
pub use prefix::PrefixStore;
pub use server::TcpStoreServer;

/// Largest key the TCP store accepts. Keys are short names; the cap exists so a garbage length
/// from a confused peer is rejected before anything is allocated for it.
pub const MAX_KEY_LEN: usize = 64 * 1024;
/// Largest value the TCP store accepts. Values are peer descriptions and transport handles
/// (bytes to kilobytes); 64 MiB leaves ample room while keeping a garbage length from
/// exhausting rank 0's memory.
pub const MAX_VALUE_LEN: usize = 64 * 1024 * 1024;

use std::time::{Duration, Instant};

/// A job-wide key/value store used only for control-plane agreement, never for payload data.
///
/// All methods block the calling thread (the callers are plain threads, not async tasks).
pub trait Store: Send + Sync {
    /// Store `value` under `key`, replacing any earlier value and waking waiters on it.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;

    /// The current value of `key`, or `None` if nobody has set it yet. Never blocks on the key.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Block until every key in `keys` exists and return their values in the same order.
    /// On timeout the error lists the keys still missing, which usually names the ranks that
    /// never showed up.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>, StoreError>;

    /// Atomically add `delta` to the counter under `key` (absent counts as 0; stored as decimal
    /// ASCII so it is readable with `get`) and return the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;

    /// Give up on every request, now and later, that cannot finish by `deadline`. A rank
    /// whose job has failed still posts the abort, names the culprit and checks out through
    /// the store, but cut off from rank 0 (a pulled cable, a dead switch port) each of those
    /// would wait a full store timeout: several times `-T` before the rank could exit. A
    /// store that cannot block (in process) has nothing to cut short.
    fn give_up_by(&self, _deadline: Instant) {}
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The keys did not all appear in time.
    #[error("timed out after {secs:.1}s waiting for store key(s) {}", missing.join(", "))]
    Timeout { secs: f64, missing: Vec<String> },
    /// The store server is gone or unreachable; the message names where it was served from.
    #[error("{0}")]
    Disconnected(String),
    /// Rank 0's host name never resolved before the deadline. On Kubernetes a pod's name
    /// appears in DNS only once the headless service publishes it (by default only when the
    /// pod is Ready), so this is told apart from a refused or unreachable port.
    #[error(
        "host {host} never resolved in {} s: check the headless service / DNS (a pod's name is \
         published once it is Ready, unless the service sets publishNotReadyAddresses){}",
        fmt_secs(*secs),
        detail_suffix(detail)
    )]
    Unresolved {
        host: String,
        secs: f64,
        detail: String,
    },
    /// Rank 0's host answered, but nothing listened on the port for the whole wait.
    #[error(
        "connection refused by rank 0 at {addr} for {} s: is rank 0 running, is the port right?",
        fmt_secs(*secs)
    )]
    Refused { addr: String, secs: f64 },
    /// No route to rank 0's host, or connection attempts went unanswered (a firewall or
    /// NetworkPolicy dropping them) for the whole wait.
    #[error(
        "rank 0 at {addr} was unreachable for {} s ({detail}): check routing, firewalls and \
         NetworkPolicy between the pods",
        fmt_secs(*secs)
    )]
    Unreachable {
        addr: String,
        secs: f64,
        detail: String,
    },
    /// The store belongs to another job, or the ranks were given different job tokens.
    #[error(
        "the rendezvous store at {addr} refused this rank's job token: another job may be \
         using the same port, or the ranks were given different tokens"
    )]
    WrongToken { addr: String },
    /// Rank 0 could not bind the store port because something on this host already holds it.
    #[error(
        "port {port} is already in use on this host (hostNetwork pods share ports): pick \
         another with --port or MASTER_PORT"
    )]
    PortInUse { port: u16 },
    #[error("store I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer does not speak this store's protocol (or speaks another version of it).
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// `add` found a value that is not a decimal integer.
    #[error("store key {key:?} holds {value:?}, which is not a decimal integer counter")]
    BadValue { key: String, value: String },
}

/// Whole seconds for the usual multi-minute timeouts, tenths for the short ones of tests and
/// abort posting, where "0 s" would read as "did not try".
fn fmt_secs(secs: f64) -> String {
    if secs >= 10.0 {
        format!("{secs:.0}")
    } else {
        format!("{secs:.1}")
    }
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" (last error: {detail})")
    }
}

/// Decodes `body` as the server decodes a request frame's body. The fuzz targets' entry
/// point (`fuzz/`, and its stable twin in the store tests): whatever the bytes, this returns.
#[doc(hidden)]
pub fn fuzz_request(body: &[u8]) -> Result<(), String> {
    proto::decode_request(body).map(|_| ())
}

/// Shared by both store implementations so `add` behaves identically in and out of process.
pub(crate) fn apply_add(key: &str, old: Option<&[u8]>, delta: i64) -> Result<i64, StoreError> {
    let bad = |v: &[u8]| StoreError::BadValue {
        key: key.to_string(),
        value: String::from_utf8_lossy(v).into_owned(),
    };
    let current = match old {
        None => 0,
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| bad(v))?,
    };
    current
        .checked_add(delta)
        .ok_or_else(|| StoreError::BadValue {
            key: key.to_string(),
            value: format!("{current} + {delta} (overflows i64)"),
        })
}

#[cfg(test)]
mod tests;
