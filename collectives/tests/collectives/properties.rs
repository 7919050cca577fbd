//! Random cases: every collective, size, type, op, root, segment size and window, on host
//! memory, with sends that read late, and on a simulated device.

use crate::harness::{case_strategy, run_case, run_case_on, Dev};
use crate::reference::{device_kinds, KINDS};
use busbw_collectives::testing::ThreadTransport;
use proptest::prelude::*;
use std::time::Duration;

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn every_collective_matches_reference((case, seg, window) in case_strategy(&KINDS)) {
        let wrong = run_case(case, seg, window);
        prop_assert!(wrong.iter().all(|w| *w == 0), "{case:?} seg={seg} window={window}: wrong per rank {wrong:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// Sends that read their memory only when they complete, as an RDMA NIC may: no
    /// algorithm writes memory an in-flight send still reads (recursive doubling once
    /// combined into its result buffer while that buffer's send was still in flight, which
    /// only the SoftRoCE guests showed).
    #[test]
    fn every_collective_with_sends_read_late(
        (case, seg, window) in case_strategy(&device_kinds()),
    ) {
        let res = run_case_on(case, seg, window, ThreadTransport::InprocLateReads, None);
        let wrong: Vec<u64> = res.iter().map(|r| r.0).collect();
        prop_assert!(wrong.iter().all(|w| *w == 0), "{case:?} seg={seg} window={window}: wrong per rank {wrong:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// Device buffers behind host twins: the engines' downloads, device reductions and
    /// uploads (or the staging around the other algorithms) must give the host result, with
    /// device operations completing late and in their own time.
    #[test]
    fn every_collective_on_a_device(
        (case, seg, window) in case_strategy(&device_kinds()),
        direct in any::<bool>(),
        nic_takes_device_memory in any::<bool>(),
    ) {
        let transport = if nic_takes_device_memory {
            ThreadTransport::InprocDevice
        } else {
            ThreadTransport::Inproc
        };
        let d = Dev { jitter: Duration::from_micros(30), direct, ipc: None };
        let res = run_case_on(case, seg, window, transport, Some(d));
        let wrong: Vec<u64> = res.iter().map(|r| r.0).collect();
        prop_assert!(wrong.iter().all(|w| *w == 0), "{case:?} seg={seg} window={window} {d:?} {transport:?}: wrong per rank {wrong:?}");
        let reduces: u64 = res.iter().map(|r| r.1.reduces).sum();
        let copies: u64 = res.iter().map(|r| r.1.downloads + r.1.uploads).sum();
        let moves = case.n > 1 && case.count > 0;
        if case.kind.drives_device() && moves {
            if direct && nic_takes_device_memory {
                prop_assert_eq!(copies, 0, "{:?}: the direct path copies nothing", case);
            } else {
                prop_assert!(copies > 0, "{:?}: staged through the twins", case);
            }
            // A refused direct path is given up once per rank, then not tried again.
            let refusals: Vec<u64> = res.iter().map(|r| r.1.refusals).collect();
            if direct && !nic_takes_device_memory {
                prop_assert!(refusals.iter().all(|&k| k == 1), "{:?}: refusals {:?}", case, refusals);
            } else {
                prop_assert!(refusals.iter().all(|&k| k == 0), "{:?}: refusals {:?}", case, refusals);
            }
        }
        if case.kind.drives_device() && case.kind.reduces() && case.n > 1 && case.count > 0 {
            prop_assert!(reduces > 0, "{case:?}: no reduction ran on the device");
        }
        if !case.kind.drives_device() {
            prop_assert_eq!(reduces, 0, "{:?}: staged around, so reduced on the host", case);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 80, ..ProptestConfig::default() })]

    /// GPU to GPU (CUDA IPC modelled by the simulated device): random sizes, ranks, roots,
    /// types and ops give the reference's bits, and nothing crosses a host twin wherever
    /// there is something to move between two or more ranks.
    #[test]
    fn every_collective_gpu_to_gpu((case, seg, window) in case_strategy(&device_kinds())) {
        let d = Dev { jitter: Duration::from_micros(20), direct: false, ipc: Some(case.n) };
        let res = run_case_on(case, seg, window, ThreadTransport::Inproc, Some(d));
        let wrong: Vec<u64> = res.iter().map(|r| r.0).collect();
        prop_assert!(wrong.iter().all(|w| *w == 0), "{case:?}: wrong per rank {wrong:?}");
        if case.n > 1 && case.count > 0 {
            let staged: u64 = res.iter().map(|r| r.1.downloads + r.1.uploads).sum();
            prop_assert_eq!(staged, 0, "{:?}: staged", case);
        }
    }
}
