use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A job-wide "stop now" flag with the reason. The control plane (store watcher, launcher)
/// raises it when any rank fails; every wait loop on the data path checks it, so a failure
/// anywhere ends every rank with a message naming the culprit instead of a hang.
#[derive(Clone, Default, Debug)]
pub struct Abort {
    inner: Arc<AbortInner>,
}

#[derive(Default, Debug)]
struct AbortInner {
    raised: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Abort {
    pub fn new() -> Self {
        Self::default()
    }

    /// Raise the flag. The first reason wins: it names the original failure, later ones are
    /// usually consequences of it.
    pub fn raise(&self, reason: impl Into<String>) {
        if let Ok(mut r) = self.inner.reason.lock() {
            if r.is_none() {
                *r = Some(reason.into());
            }
        }
        self.inner.raised.store(true, Ordering::Release);
    }

    /// Cheap enough for a spin loop.
    pub fn is_raised(&self) -> bool {
        self.inner.raised.load(Ordering::Acquire)
    }

    pub fn reason(&self) -> Option<String> {
        self.inner.reason.lock().ok().and_then(|r| r.clone())
    }
}
