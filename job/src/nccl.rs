//! Joining NCCL's communicator (`--engine nccl`) through busbw's own rendezvous: rank 0 makes
//! the `ncclUniqueId` and the store hands it to every rank, so no MPI is needed and the job
//! runs under whatever launcher started it. A rank that cannot join says NCCL's own reason and
//! what to install: on a host without a GPU or driver that is the first thing an operator
//! sees, and it is a setup problem (a usage-class exit), not a failure of the fabric.

use crate::session::Session;
use busbw_collectives::nccl::{Comm, Nccl, NcclError, UniqueId};
use busbw_launchers::bootstrap::{Bootstrap, BootstrapError};
use std::time::Duration;

/// Store key of the job's unique id.
pub const ID_KEY: &str = "nccl/id";

/// Why a rank could not join NCCL's communicator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The unique id did not reach this rank (rank 0 failed to make it, or never came).
    #[error("rank {rank}: receiving NCCL's unique id from rank 0 through the store")]
    Id {
        rank: usize,
        #[source]
        source: BootstrapError,
    },
    /// `ncclCommInitRank` failed: NCCL's reason, and what this host's CUDA probe found.
    #[error(
        "rank {rank}: NCCL {version} could not join the communicator of {size} ranks (unique \
         id {digest} from rank 0): {cause}{}; NCCL needs an NVIDIA GPU and its driver on every \
         rank: install the driver (and NCCL, e.g. `pip install nvidia-nccl-cu12`, with \
         NCCL_LIBRARY naming its libnccl.so.2), or drop --engine nccl to run busbw's own engine",
        host(.cuda)
    )]
    Init {
        rank: usize,
        size: usize,
        version: String,
        digest: String,
        cuda: Option<String>,
        /// Not a `source`: the message says it once, inside its own words.
        cause: NcclError,
    },
    /// The library itself (absent, not NCCL, or its version call failed).
    #[error(transparent)]
    Library(NcclError),
}

/// What the CUDA probe found, without its advice (which is about `-g` on busbw's engine;
/// the advice here is NCCL's).
fn host(cuda: &Option<String>) -> String {
    match cuda {
        Some(why) => {
            let found = why.split("; install").next().unwrap_or(why);
            format!("; on this host: {found}")
        }
        None => String::new(),
    }
}

/// This rank joined: the communicator and the id's fingerprint (the same on every rank).
pub struct Joined {
    pub comm: Comm<'static>,
    pub digest: String,
}

/// Joins this rank to the job's NCCL communicator on the calling thread's current device.
/// `cuda` is what the CUDA probe said when it found no usable device (the join is still
/// tried, so that the error is NCCL's own). Every rank of the session calls it.
pub fn join(
    session: &Session,
    timeout: Duration,
    cuda: Option<String>,
) -> Result<Joined, Box<JoinError>> {
    let library = |e| Box::new(JoinError::Library(e));
    let nccl = Nccl::global().map_err(library)?;
    let version = nccl.version().map_err(library)?.to_string();
    let (rank, size) = (session.comm.rank(), session.comm.size());
    let id = share_id(session, nccl, timeout)?;
    let digest = id.digest();
    match nccl.init_rank(size, id, rank) {
        Ok(comm) => Ok(Joined { comm, digest }),
        Err(cause) => Err(Box::new(JoinError::Init {
            rank,
            size,
            version,
            digest,
            cuda,
            cause,
        })),
    }
}

/// Rank 0's fresh id on every rank, byte for byte (hex through the store).
fn share_id(session: &Session, nccl: &Nccl, timeout: Duration) -> Result<UniqueId, Box<JoinError>> {
    let rank = session.comm.rank();
    let id_err = |source| Box::new(JoinError::Id { rank, source });
    let made = if rank == 0 {
        nccl.unique_id()
            .map(|id| id.to_hex())
            .map_err(|e| e.to_string())
    } else {
        Ok(String::new())
    };
    let Some(rdv) = &session.rdv else {
        // One rank, no store: its own id.
        let hex = made.map_err(|why| id_err(BootstrapError::Rank0(why)))?;
        return UniqueId::from_hex(&hex).ok_or_else(|| id_err(malformed()));
    };
    let boot = Bootstrap::new(rdv.store.clone(), rank, session.comm.size(), timeout);
    let hex = boot
        .share_root(
            ID_KEY,
            made.as_deref().map(str::as_bytes).map_err(Clone::clone),
        )
        .map_err(id_err)?;
    UniqueId::from_hex(&String::from_utf8_lossy(&hex)).ok_or_else(|| id_err(malformed()))
}

fn malformed() -> BootstrapError {
    BootstrapError::Malformed {
        rank: 0,
        why: format!("{ID_KEY} is not an NCCL unique id"),
    }
}
