//! MPI launchers: Open MPI's `mpirun`/`prterun` (OMPI_COMM_WORLD_*) and PMI-based ones
//! (MPICH and Intel MPI hydra, `srun --mpi=pmi2`: PMI_RANK, PMI_SIZE).
//!
//! busbw uses MPI only to be started, never to communicate, so it needs no MPI library: the
//! launcher's variables give the position, and the ranks then rendezvous over TCP like under
//! any other launcher. MPI launchers say nothing about where rank 0 runs, hence the address
//! must be passed in (`-x MASTER_ADDR` or `--master-addr`).

use super::{check_rank, count, Ctx, Found, Rank0};
use crate::world::{Position, WorldError};

const HOW_TO_PASS: &str = "an MPI launcher does not say where rank 0 runs: export it to every \
     rank, e.g. `mpirun -x MASTER_ADDR=$(hostname) ...` (Open MPI) or `mpiexec -genv \
     MASTER_ADDR $(hostname) ...` (MPICH, Intel MPI), or pass --master-addr HOST";

/// `Ok(None)` when neither OMPI_COMM_WORLD_RANK nor PMI_RANK is set.
pub(crate) fn detect(cx: &mut Ctx) -> Result<Option<Found>, WorldError> {
    if let Some(rank) = count(cx, "OMPI_COMM_WORLD_RANK")? {
        let size = count(cx, "OMPI_COMM_WORLD_SIZE")?.ok_or_else(|| WorldError::Missing {
            var: "OMPI_COMM_WORLD_SIZE",
            why: "OMPI_COMM_WORLD_RANK is, so Open MPI described only half a job".into(),
        })?;
        check_rank("OMPI_COMM_WORLD_RANK", rank, "OMPI_COMM_WORLD_SIZE", size)?;
        let local_rank = count(cx, "OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0);
        let local_size = count(cx, "OMPI_COMM_WORLD_LOCAL_SIZE")?.unwrap_or(local_rank + 1);
        check_local("OMPI_COMM_WORLD_LOCAL_RANK", local_rank, local_size, size)?;
        cx.note(format!(
            "Open MPI: OMPI_COMM_WORLD_RANK={rank} OMPI_COMM_WORLD_SIZE={size} \
             (local {local_rank} of {local_size})"
        ));
        return Ok(Some(found(rank, size, local_rank, local_size)));
    }
    let Some(rank) = count(cx, "PMI_RANK")? else {
        return Ok(None);
    };
    let size = count(cx, "PMI_SIZE")?.ok_or_else(|| WorldError::Missing {
        var: "PMI_SIZE",
        why: "PMI_RANK is, so the PMI launcher described only half a job".into(),
    })?;
    check_rank("PMI_RANK", rank, "PMI_SIZE", size)?;
    // Hydra (MPICH, Intel MPI) names them MPI_LOCAL*, some PMI implementations PMI_LOCAL_*.
    let (rank_var, local_rank) = match count(cx, "MPI_LOCALRANKID")? {
        Some(n) => ("MPI_LOCALRANKID", n),
        None => ("PMI_LOCAL_RANK", count(cx, "PMI_LOCAL_RANK")?.unwrap_or(0)),
    };
    let local_size = match count(cx, "MPI_LOCALNRANKS")? {
        Some(n) => n,
        None => count(cx, "PMI_LOCAL_SIZE")?.unwrap_or(local_rank + 1),
    };
    check_local(rank_var, local_rank, local_size, size)?;
    cx.note(format!(
        "PMI: PMI_RANK={rank} PMI_SIZE={size} (local {local_rank} of {local_size})"
    ));
    Ok(Some(found(rank, size, local_rank, local_size)))
}

fn found(rank: usize, size: usize, local_rank: usize, local_size: usize) -> Found {
    Found {
        pos: Position {
            rank,
            size,
            local_rank,
            local_size,
        },
        rank0: Rank0::Unknown(HOW_TO_PASS.into()),
    }
}

fn check_local(
    var: &'static str,
    local_rank: usize,
    local_size: usize,
    size: usize,
) -> Result<(), WorldError> {
    if local_rank >= local_size || local_size > size {
        return Err(crate::world::invalid(
            var,
            &local_rank.to_string(),
            &format!("the local rank must be below the local size {local_size} (at most {size})"),
        ));
    }
    Ok(())
}
