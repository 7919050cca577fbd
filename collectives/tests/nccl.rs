//! NCCL's own library, the real one, where it is installed (`.ci/run` unpacks the PyPI wheel
//! `nvidia-nccl-cu12` into `target/nccl`; elsewhere `NCCL_LIBRARY` names it). Without a GPU
//! it loads, reports its version and makes unique ids, and joining a communicator fails with
//! NCCL's own account of why; the tests check exactly that, or skip saying what is missing.

use busbw_collectives::nccl::{Nccl, NcclError, UniqueId, LIBRARY_ENV};
use std::path::PathBuf;

/// The library to test: `NCCL_LIBRARY`, else the wheel `.ci/run` unpacks.
fn library() -> Option<String> {
    if let Ok(p) = std::env::var(LIBRARY_ENV) {
        return Some(p);
    }
    let wheel = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/nccl/nvidia/nccl/lib/libnccl.so.2");
    wheel.exists().then(|| wheel.to_string_lossy().into_owned())
}

fn open() -> Option<Nccl> {
    let Some(path) = library() else {
        eprintln!(
            "skip: no NCCL library ({LIBRARY_ENV} unset and no target/nccl from the \
             nvidia-nccl-cu12 wheel; .ci/run unpacks it)"
        );
        return None;
    };
    Some(Nccl::open_path(&path).expect("the NCCL library given opens"))
}

#[test]
fn the_real_library_reports_its_version_and_makes_distinct_ids() {
    let Some(nccl) = open() else { return };
    let v = nccl.version().expect("ncclGetVersion");
    assert_eq!(v.major, 2, "{v}");
    eprintln!("NCCL {v} from {}", nccl.path());
    let (a, b) = (
        nccl.unique_id().expect("ncclGetUniqueId"),
        nccl.unique_id().expect("ncclGetUniqueId"),
    );
    assert_ne!(a, UniqueId([0; 128]), "an id says where rank 0 listens");
    assert_ne!(a, b, "each communicator gets its own id");
    assert_eq!(UniqueId::from_hex(&a.to_hex()), Some(a));
}

#[test]
fn joining_without_a_gpu_fails_with_nccls_own_reason() {
    let Some(nccl) = open() else { return };
    if busbw_collectives::cuda::probe().is_ok() {
        eprintln!("skip: this host has a CUDA driver; the failure checked here needs none");
        return;
    }
    let id = nccl.unique_id().expect("ncclGetUniqueId");
    match nccl.init_rank(1, id, 0) {
        Ok(_) => panic!("ncclCommInitRank succeeded on a host without a CUDA driver"),
        Err(e @ NcclError::Call { .. }) => {
            let m = e.to_string();
            eprintln!("as expected without a GPU: {m}");
            assert!(m.starts_with("ncclCommInitRank failed: "), "{m}");
            let NcclError::Call { code, last, .. } = &e else {
                unreachable!()
            };
            assert_ne!(*code, 0);
            assert!(!last.is_empty(), "NCCL's last error says why: {m}");
            assert!(m.contains(last.as_str()), "{m}");
        }
        Err(e) => panic!("expected NCCL's call error, got {e}"),
    }
    assert!(
        nccl.init_rank(1, id, 1).is_err(),
        "a rank outside the communicator is refused before NCCL is called"
    );
}
