//! `-M`: the memory each phase of a run took (see `resident.rs`).

use crate::device::DeviceMem;
use crate::error::{Context, Result};
use crate::plan::Plan;
use crate::resident;
use busbw_collectives::{all_reduce_values, barrier, Communicator, ReduceOp};
use busbw_reports::MemoryUsage;

/// `-M`: the memory figures at each phase boundary (see `memory.rs`).
pub(super) struct Meter {
    /// Host: resident bytes; device: free bytes, at the start of the phase being measured.
    joined: u64,
    initialization: i64,
    user_allocated: i64,
    ready: u64,
}

impl Meter {
    /// Before the buffers are allocated: the job is joined.
    pub(super) fn start(plan: &Plan, dev: Option<&mut DeviceMem>) -> Result<Option<Meter>> {
        if !plan.memory_report {
            return Ok(None);
        }
        let (joined, initialization) = match dev {
            Some(d) => {
                let free = d.free_memory()?;
                (free, d.opened_free() as i64 - free as i64)
            }
            None => {
                let now = resident::resident();
                (now, now as i64 - resident::start() as i64)
            }
        };
        Ok(Some(Meter {
            joined,
            initialization,
            user_allocated: 0,
            ready: 0,
        }))
    }

    /// After the buffers are allocated (`host` bytes of this rank's host buffers). With
    /// several ranks per process, the resident memory is theirs together: a barrier lets
    /// every rank allocate first, and the process's buffers are counted exactly.
    pub(super) fn allocated(
        &mut self,
        comm: &mut Communicator,
        plan: &Plan,
        host: u64,
        dev: Option<&mut DeviceMem>,
    ) -> Result<()> {
        match dev {
            Some(d) => {
                self.ready = d.free_memory()?;
                self.user_allocated = self.joined as i64 - self.ready as i64;
            }
            None => {
                barrier(comm).context("barrier after allocating the buffers")?;
                self.ready = resident::resident();
                let process = host as i64 * plan.ranks_per_process() as i64;
                self.user_allocated = process;
                // Whatever else arrived since the job was joined (other ranks' joins on this
                // process's threads) belongs to initialisation.
                self.initialization += self.ready as i64 - self.joined as i64 - process;
            }
        }
        Ok(())
    }

    /// After the sweep: what the collectives kept (staging, connections, registrations),
    /// then the largest figures over the job.
    pub(super) fn finish(
        self,
        comm: &mut Communicator,
        dev: Option<&mut DeviceMem>,
    ) -> Result<MemoryUsage> {
        let (kind, collective) = match dev {
            Some(d) => ("GPU", self.ready as i64 - d.free_memory()? as i64),
            None => {
                barrier(comm).context("barrier before measuring memory")?;
                ("Host", resident::resident() as i64 - self.ready as i64)
            }
        };
        let mut v = [self.initialization, self.user_allocated, collective];
        all_reduce_values(comm, &mut v, ReduceOp::Max).context("combining -M's figures")?;
        Ok(MemoryUsage {
            kind: kind.into(),
            initialization: v[0],
            user_allocated: v[1],
            collective: v[2],
        })
    }
}
