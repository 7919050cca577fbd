//! Hypercube works only on a power-of-two world, and must say so rather than hang.

use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::{hypercube, CommConfig, Data, DataType};

#[test]
fn hypercube_rejects_non_power_of_two() {
    let comms = thread_world(3, ThreadTransport::Inproc, CommConfig::default()).unwrap();
    let errs = run_threads(comms, |comm| {
        let mut b = vec![0u8; 12];
        hypercube(comm, Data::in_place(&mut b), 1, DataType::Int32)
            .unwrap_err()
            .to_string()
    });
    assert!(errs[0].contains("power-of-two"), "{}", errs[0]);
}
