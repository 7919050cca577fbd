//! The binary's side of the RDMA verbs transport: settings from `--ib-hca` and `NCCL_IB_*`,
//! the fail-fast check of `--transport verbs`, and the transport member for a rank.

use crate::cli::PerfArgs;
use busbw_transports::multi::TransportKind;
use busbw_transports::verbs::{self, VerbsConfig};
use std::time::Duration;

/// `NCCL_IB_*` from the environment, `--ib-hca` (which clap also fills from `NCCL_IB_HCA`).
pub fn config(
    ib_hca: Option<&str>,
    local_rank: usize,
    timeout: Duration,
) -> Result<VerbsConfig, String> {
    let mut cfg = VerbsConfig::from_env(|k| {
        if k == "NCCL_IB_HCA" {
            ib_hca.map(str::to_string)
        } else {
            std::env::var(k).ok()
        }
    })?;
    cfg.local_rank = local_rank;
    cfg.stall_timeout = timeout;
    Ok(cfg)
}

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

/// The verbs member of a rank's transports for `--transport` `mode` (`auto`: when usable,
/// `verbs`: required; otherwise none), with its device-line description. `device_buffers`
/// (`-g`): the eager path is turned off, since its ring is host memory and a receive into
/// device memory cannot be served from it; every rank has the same flags, so all agree.
#[allow(clippy::too_many_arguments)]
pub fn for_rank(
    mode: TransportKind,
    device_buffers: bool,
    ib_hca: Option<&str>,
    local_rank: usize,
    timeout: Duration,
    identity: busbw_transports::Identity,
    bind: std::net::IpAddr,
    advertise: Option<std::net::IpAddr>,
) -> anyhow::Result<Option<(busbw_transports::multi::Member, String)>> {
    let required = mode == TransportKind::Verbs;
    // NCCL_IB_DISABLE=1 keeps NCCL off RDMA; it keeps `auto` off it too.
    let disabled = std::env::var("NCCL_IB_DISABLE").is_ok_and(|v| v.trim() == "1");
    if !(required || (mode == TransportKind::Auto && verbs::BUILT && !disabled)) {
        return Ok(None);
    }
    let mut cfg = config(ib_hca, local_rank, timeout).map_err(anyhow::Error::msg)?;
    if device_buffers {
        cfg.eager = 0;
    }
    match verbs::open(identity, cfg, bind, advertise) {
        Ok((transport, desc)) => Ok(Some((
            busbw_transports::multi::Member {
                transport,
                same_node_only: false,
            },
            desc,
        ))),
        Err(e) if required => {
            Err(anyhow::Error::new(e).context("--transport verbs: opening this rank's RDMA port"))
        }
        Err(e) => {
            // Silence on hosts without RDMA; a host that has devices but cannot use them
            // should say why its traffic goes over TCP.
            let has_devices = verbs::sysfs::Sysfs::default()
                .devices()
                .is_ok_and(|d| !d.is_empty());
            if has_devices {
                eprintln!(
                    "busbw: rank {}: RDMA devices present but not used ({e}); TCP carries the \
                     traffic between hosts (see `busbw doctor`)",
                    identity.rank
                );
            }
            Ok(None)
        }
    }
}
