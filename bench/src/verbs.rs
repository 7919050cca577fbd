//! The fail-fast check of `--transport verbs`, before any rank starts (a rank's verbs
//! member is `busbw_job::transport`'s).

use crate::cli::PerfArgs;
use busbw_job::transport::config;
use busbw_transports::multi::TransportKind;
use busbw_transports::verbs;
use std::time::Duration;

/// Checked before any rank starts: `--transport verbs` on a host that cannot do it fails at
/// once with the reason, and bad `NCCL_IB_*` values are usage errors wherever verbs may be
/// used.
pub fn preflight(args: &PerfArgs, timeout: Duration) -> Result<(), String> {
    let wanted = args.transport == TransportKind::Verbs;
    if !(wanted || (args.transport == TransportKind::Auto && verbs::BUILT)) {
        return Ok(());
    }
    let cfg = config(args.ib_hca.as_deref(), 0, timeout)?;
    if !wanted {
        return Ok(());
    }
    if !verbs::BUILT {
        return Err(
            "--transport verbs: this busbw was built without the `verbs` feature; rebuild with \
                    `cargo build --release -p busbw --features verbs` (see docs/rdma.md) or use \
                    --transport tcp"
                .into(),
        );
    }
    library_check()?;
    verbs::pick_port(&cfg)
        .map(|_| ())
        .map_err(|e| format!("--transport verbs: {e}"))
}

fn library_check() -> Result<(), String> {
    match verbs::library_status() {
        Some(Err(e)) => Err(format!(
            "--transport verbs: {e}; run `busbw doctor` for details, or use --transport tcp"
        )),
        _ => Ok(()),
    }
}
