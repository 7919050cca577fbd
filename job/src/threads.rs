//! Several ranks in one process (`-t`, `-g` > 1), as nccl-tests runs them: a process hosts
//! `threads × gpus` ranks, numbered `process × (t×g) + thread × g + gpu`. Each is a full rank
//! of the job on its own OS thread (the data path never shares a thread), with its own
//! rendezvous client, communicator, transport instance and, with `-g`, its own device, so
//! everything a rank does across processes it also does across threads; only the pid in the
//! `Using devices` block shows which ranks share a process.

use busbw_collectives::cuda::select::Slot;
use busbw_launchers::World;

/// The world of rank `i` of the `per_process` ranks of the process that `process` describes.
/// Launchers number processes; ranks multiply out process-major, so that a process's ranks
/// are consecutive (ring neighbours share a process and a host) and the local numbering, which
/// shared memory, the HCA rail, the device and the cores budget go by, counts every rank of
/// the host.
pub fn rank_world(process: &World, per_process: usize, i: usize) -> Result<World, String> {
    let (size, local_size) = match (
        process.size.checked_mul(per_process),
        process.local_size.checked_mul(per_process),
    ) {
        (Some(s), Some(l)) if u32::try_from(s).is_ok() => (s, l),
        _ => {
            return Err(format!(
                "{} processes × {per_process} ranks each is more ranks than a job can number; \
                 lower -t or -g",
                process.size
            ))
        }
    };
    Ok(World {
        rank: process.rank * per_process + i,
        size,
        local_rank: process.local_rank * per_process + i,
        local_size,
        ..process.clone()
    })
}

/// Where the rank with host-local number `local_rank` sits in nccl-tests' device numbering,
/// the inverse of [`rank_world`]'s: its process's local rank, its thread and its GPU.
pub fn slot(local_rank: usize, threads: usize, gpus: usize) -> Slot {
    let (threads, gpus) = (threads.max(1), gpus.max(1));
    let per_process = threads * gpus;
    let i = local_rank % per_process;
    Slot {
        local_rank: local_rank / per_process,
        threads,
        gpus,
        thread: i / gpus,
        gpu: i % gpus,
    }
}

/// Why a rank's thread gave no exit code.
#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    #[error("cannot start its thread: {0}")]
    Spawn(std::io::Error),
    #[error("its thread panicked")]
    Panicked,
}

/// What one rank's thread ended with: its world and its exit code, or why it has none.
pub type Ended = (World, Result<i32, ThreadError>);

/// Runs `rank` for each of the process's `per_process` ranks, each on its own thread, and
/// returns what each ended with, in rank order; an error when the ranks cannot be numbered.
/// Each rank reports its own failure (naming itself, its host and its peer) and aborts the
/// job through the store like a rank process would, so a failing thread stops its siblings
/// as it stops other processes.
pub fn run(
    process: &World,
    per_process: usize,
    rank: &(dyn Fn(World) -> i32 + Sync),
) -> Result<Vec<Ended>, String> {
    let worlds: Vec<World> = (0..per_process)
        .map(|i| rank_world(process, per_process, i))
        .collect::<Result<_, _>>()?;
    // As much stack as the main thread a one-rank process runs on.
    const STACK: usize = 8 << 20;
    Ok(std::thread::scope(|s| {
        let handles: Vec<_> = worlds
            .into_iter()
            .map(|w| {
                let h = std::thread::Builder::new()
                    .name(format!("busbw-rank-{}", w.rank))
                    .stack_size(STACK)
                    .spawn_scoped(s, {
                        let w = w.clone();
                        move || rank(w)
                    });
                (w, h)
            })
            .collect();
        handles
            .into_iter()
            .map(|(w, h)| {
                let code = match h {
                    Err(e) => Err(ThreadError::Spawn(e)),
                    Ok(h) => h.join().map_err(|_| ThreadError::Panicked),
                };
                (w, code)
            })
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_collectives::cuda::select::select_device;

    fn process(rank: usize, size: usize, local_rank: usize, local_size: usize) -> World {
        World {
            rank,
            size,
            local_rank,
            local_size,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            hostname: "node".into(),
        }
    }

    #[test]
    fn ranks_are_process_major_then_thread_then_gpu() {
        // 2 nodes × 2 processes each, -t 2 -g 3: process 3 (local 1 on node 1) hosts 18..24.
        let p = process(3, 4, 1, 2);
        let (t, g) = (2, 3);
        let w: Vec<World> = (0..t * g)
            .map(|i| rank_world(&p, t * g, i).unwrap())
            .collect();
        let ranks: Vec<usize> = w.iter().map(|w| w.rank).collect();
        assert_eq!(ranks, [18, 19, 20, 21, 22, 23]);
        assert!(w.iter().all(|w| w.size == 24 && w.local_size == 12));
        assert_eq!(w[4].local_rank, 10);
        assert_eq!(w[4].master_addr, "10.0.0.1");
        for (i, w) in w.iter().enumerate() {
            // rank = proc × (t×g) + thread × g + gpu
            let s = slot(w.local_rank, t, g);
            assert_eq!((s.local_rank, s.thread, s.gpu), (1, i / g, i % g));
            assert_eq!(w.rank, 3 * t * g + s.thread * g + s.gpu);
        }
        // A one-rank process is its launcher's rank, unchanged.
        assert_eq!(rank_world(&p, 1, 0).unwrap(), p);
        assert_eq!(slot(5, 1, 1), Slot::single(5));
        // Host memory (-g 0) counts one rank per thread.
        assert_eq!(slot(5, 2, 0), slot(5, 2, 1));
    }

    #[test]
    fn devices_follow_local_rank_times_threads_times_gpus() {
        // Local process 1 of -t 2 -g 2: devices 4..8, thread-major; NCCL_TESTS_DEVICE moves the
        // first, the others follow it.
        let devices = |env| -> Vec<usize> {
            (4..8)
                .map(|lr| select_device(slot(lr, 2, 2), 16, env, None).unwrap().index)
                .collect()
        };
        assert_eq!(devices(None), [4, 5, 6, 7]);
        assert_eq!(devices(Some("8")), [8, 9, 10, 11]);
        // Past the devices there are: nccl-tests' message, about the last one asked for.
        let e = select_device(slot(7, 2, 2), 6, None, Some("0,1,2,3,4,5")).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("Invalid number of GPUs: 8 requested but only 6"));
    }

    #[test]
    fn too_many_ranks_to_number_is_refused() {
        let p = process(0, usize::MAX / 2, 0, 1);
        assert!(rank_world(&p, 4, 0).unwrap_err().contains("lower -t or -g"));
        let p = process(0, 1 << 31, 0, 1);
        assert!(rank_world(&p, 2, 0).is_err());
    }
}
