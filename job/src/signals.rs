//! SIGTERM and SIGINT (a pod eviction, a cancelled job, Ctrl-C) as this job's abort.

use busbw_launchers::signal;
use busbw_transports::Abort;
use std::sync::{Arc, Mutex};

/// Turns a caught SIGTERM/SIGINT into this job's abort naming this rank, its host and the
/// signal; the data path notices the abort at its next wait, the sweep writes its reports
/// marked incomplete and the error path broadcasts the abort. A signal before the job is
/// joined (nothing measured, nothing to write) ends the process at once.
pub struct SignalWatch {
    armed: Arc<Mutex<Option<Abort>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl SignalWatch {
    const POLL: std::time::Duration = std::time::Duration::from_millis(20);

    pub fn start(rank: usize, host: String) -> SignalWatch {
        let armed: Arc<Mutex<Option<Abort>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, st) = (armed.clone(), stop.clone());
        let _ = std::thread::Builder::new()
            .name("busbw-signals".into())
            .spawn(move || {
                while !st.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(sig) = signal::received() {
                        let what = format!(
                            "rank {rank} on {host} received {} (pod eviction, job cancel or \
                             Ctrl-C): results so far are kept, marked incomplete",
                            signal::name(sig)
                        );
                        match a.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                            Some(abort) => abort.raise(what),
                            None => {
                                eprintln!(
                                    "busbw: rank {rank} on {host}: {} before the job was \
                                     joined: nothing measured, stopping",
                                    signal::name(sig)
                                );
                                std::process::exit(signal::exit_code(sig));
                            }
                        }
                        return;
                    }
                    std::thread::sleep(Self::POLL);
                }
            });
        SignalWatch { armed, stop }
    }

    pub fn arm(&self, abort: Abort) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some(abort);
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
