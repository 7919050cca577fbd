//! Which CUDA device a rank drives, as nccl-tests chooses it: the first device of a process
//! is `NCCL_TESTS_DEVICE` when set, else `local_rank × threads × gpus`; thread `t`'s GPU `g`
//! is that plus `t × gpus + g`. Indexes count the devices the driver shows, which
//! `CUDA_VISIBLE_DEVICES` already filters and reorders; this module only reads that variable
//! to say why a device is missing.

/// The device index of one rank, and how it was chosen (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceChoice {
    pub index: usize,
    pub from_env: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("NCCL_TESTS_DEVICE='{0}' is not a device index (a non-negative integer)")]
    BadEnv(String),
    /// nccl-tests' own wording, plus what to change.
    #[error("Invalid number of GPUs: {requested} requested but only {found} were found{why}; lower -g or --nproc-per-node, or set NCCL_TESTS_DEVICE")]
    TooFew {
        requested: usize,
        found: usize,
        why: String,
    },
}

/// Where a GPU sits in nccl-tests' numbering: the process's local rank, its threads (`-t`)
/// and GPUs per thread (`-g`), and which thread and GPU this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub local_rank: usize,
    pub threads: usize,
    pub gpus: usize,
    pub thread: usize,
    pub gpu: usize,
}

impl Slot {
    /// The one GPU of a one-thread, one-GPU process.
    pub fn single(local_rank: usize) -> Slot {
        Slot {
            local_rank,
            threads: 1,
            gpus: 1,
            thread: 0,
            gpu: 0,
        }
    }
}

/// The device of `slot`. `visible` is the driver's device count, `env` NCCL_TESTS_DEVICE and
/// `cvd` CUDA_VISIBLE_DEVICES (only used in the error).
pub fn select_device(
    slot: Slot,
    visible: usize,
    env: Option<&str>,
    cvd: Option<&str>,
) -> Result<DeviceChoice, SelectError> {
    let Slot {
        local_rank,
        threads,
        gpus,
        thread,
        gpu,
    } = slot;
    let (first, from_env) = match env.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => (
            s.parse::<usize>()
                .map_err(|_| SelectError::BadEnv(s.to_string()))?,
            true,
        ),
        None => (local_rank * threads * gpus, false),
    };
    let index = first + thread * gpus + gpu;
    if index >= visible {
        let why = match cvd {
            Some(v) => format!(" (CUDA_VISIBLE_DEVICES='{v}' shows {})", visible_count(v)),
            None => String::new(),
        };
        return Err(SelectError::TooFew {
            requested: index + 1,
            found: visible,
            why,
        });
    }
    Ok(DeviceChoice { index, from_env })
}

/// How many devices a `CUDA_VISIBLE_DEVICES` value can show at most: the driver takes entries
/// (indexes, `GPU-`/`MIG-` UUIDs) up to the first it cannot parse, so `0,1,x,3` shows two.
pub fn visible_count(v: &str) -> usize {
    if v.trim().is_empty() {
        return 0;
    }
    v.split(',')
        .map(str::trim)
        .take_while(|e| e.parse::<u32>().is_ok() || e.starts_with("GPU-") || e.starts_with("MIG-"))
        .count()
}

/// nccl-tests' `[dddd:bb:dd]` form of a PCI location.
pub fn pci_bus_id(domain: u32, bus: u32, device: u32) -> String {
    format!("{domain:04x}:{bus:02x}:{device:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_rank_times_threads_times_gpus_unless_the_env_says_otherwise() {
        let pick = |local_rank, threads, gpus, thread, gpu, env| {
            let slot = Slot {
                local_rank,
                threads,
                gpus,
                thread,
                gpu,
            };
            select_device(slot, 8, env, None)
        };
        assert_eq!(pick(0, 1, 1, 0, 0, None).unwrap().index, 0);
        assert_eq!(pick(3, 1, 1, 0, 0, None).unwrap().index, 3);
        assert_eq!(pick(1, 1, 2, 0, 1, None).unwrap().index, 3);
        assert_eq!(pick(1, 2, 2, 1, 0, None).unwrap().index, 6);
        let e = pick(0, 1, 1, 0, 0, Some("5")).unwrap();
        assert_eq!(
            e,
            DeviceChoice {
                index: 5,
                from_env: true
            }
        );
        // NCCL_TESTS_DEVICE replaces the local-rank term, it is not added to it.
        assert_eq!(pick(2, 1, 1, 0, 0, Some("1")).unwrap().index, 1);
        assert_eq!(pick(2, 1, 1, 0, 0, Some("")).unwrap().index, 2);
        assert!(matches!(
            pick(0, 1, 1, 0, 0, Some("gpu1")),
            Err(SelectError::BadEnv(_))
        ));
    }

    #[test]
    fn too_few_devices_is_nccl_tests_message_with_the_visible_devices_reason() {
        let e = select_device(Slot::single(4), 2, None, Some("0,1")).unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("Invalid number of GPUs: 5 requested but only 2 were found"),
            "{m}"
        );
        assert!(m.contains("CUDA_VISIBLE_DEVICES='0,1' shows 2"), "{m}");
        assert!(select_device(Slot::single(1), 2, None, None).is_ok());
    }

    #[test]
    fn visible_devices_stop_at_the_first_bad_entry() {
        assert_eq!(visible_count(""), 0);
        assert_eq!(visible_count("0"), 1);
        assert_eq!(visible_count("2,0,1"), 3);
        assert_eq!(visible_count("0,1,x,3"), 2);
        assert_eq!(visible_count("GPU-8f5e, MIG-1234"), 2);
        assert_eq!(visible_count("-1"), 0);
    }

    #[test]
    fn pci_bus_ids_print_as_nccl_tests_prints_them() {
        assert_eq!(pci_bus_id(0, 7, 0), "0000:07:00");
        assert_eq!(pci_bus_id(1, 0xb3, 0x1f), "0001:b3:1f");
    }
}
