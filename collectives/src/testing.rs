//! Helpers for running many ranks as threads of one process (tests, examples).

use crate::error::CommError;
use crate::link::{CommConfig, Communicator};
use busbw_transports::inproc::InprocTransport;
use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::tcp::{TcpConfig, TcpTransport};
use busbw_transports::{Identity, Transport};

/// Which transport thread-ranks talk over.
#[derive(Clone, Copy, Debug)]
pub enum ThreadTransport {
    Inproc,
    /// In-process, each send reading its memory only when it completes, as RDMA may: an
    /// algorithm that writes what an in-flight send still reads gets wrong data.
    InprocLateReads,
    /// In-process, also moving (simulated) device memory itself, as GPUDirect RDMA does.
    InprocDevice,
    Tcp,
    /// Shared memory between the threads, as between processes of one host.
    Shm,
}

/// `n` connected-on-demand communicators, one per rank, ready to be moved into threads.
pub fn thread_world(
    n: usize,
    kind: ThreadTransport,
    config: CommConfig,
) -> Result<Vec<Communicator>, CommError> {
    let job = std::process::id() as u64 ^ 0x5eed;
    let mut parts = Vec::with_capacity(n);
    for rank in 0..n {
        let id = Identity::new(job, rank as u32);
        let t: Box<dyn Transport> = match kind {
            ThreadTransport::Inproc => Box::new(InprocTransport::new(id)),
            ThreadTransport::InprocLateReads => Box::new(InprocTransport::with_late_reads(id)),
            ThreadTransport::InprocDevice => Box::new(InprocTransport::with_device_memory(id)),
            ThreadTransport::Tcp => Box::new(TcpTransport::new(id, TcpConfig::default())),
            ThreadTransport::Shm => Box::new(ShmTransport::new(id, ShmConfig::default())),
        };
        let (h, l) = t.listen().map_err(|cause| CommError::Transport {
            rank,
            peer: None,
            during: "listening".into(),
            cause,
        })?;
        parts.push((t, l, h));
    }
    let handles: Vec<_> = parts.iter().map(|p| p.2.clone()).collect();
    parts
        .into_iter()
        .map(|(t, l, _)| Communicator::new(t, l, handles.clone(), config.clone()))
        .collect()
}

/// Run `f` on every rank of a thread world and collect the results in rank order.
pub fn run_threads<R: Send>(
    comms: Vec<Communicator>,
    f: impl Fn(&mut Communicator) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                let f = &f;
                s.spawn(move || f(&mut c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    })
}
