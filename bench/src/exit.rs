//! Exit codes. 0 and 7 mean what they mean in nccl-tests, so CI gates written for nccl-tests
//! keep working; the others are ours and documented in the README. A failure's code is
//! decided by the error's type ([`classify`]), a process's from its ranks' ([`combine`]).

use busbw_collectives::CommError;
use busbw_launchers::StoreError;

/// Every check passed.
pub const OK: i32 = 0;
/// Something failed that is none of the below (an internal error, an I/O error on output).
pub const INTERNAL: i32 = 1;
/// Bad command line or environment: nothing was run.
pub const USAGE: i32 = 2;
/// A peer rank failed or went away (connection closed, abort raised by the launcher or by
/// another rank).
pub const PEER_FAILURE: i32 = 3;
/// A wait ran past `-T` without progress (nccl-tests uses 4 for its timeout too).
pub const TIMEOUT: i32 = 4;
/// Wrong data (`#wrong` > 0) or average bus bandwidth under the `--min-busbw` gate.
pub const WRONG_RESULTS: i32 = 7;
/// `busbw compare`: a row or tier got worse than the threshold allows.
pub const REGRESSION: i32 = 8;
// Stopped by SIGTERM (a pod eviction, `scancel`) or SIGINT: 128 + the signal, 143 or 130, as
// a shell reports a process the signal killed; but the reports were written, marked
// incomplete, and the others were told (`busbw_launchers::signal::exit_code`).

/// Exit code for a failure: a peer's death and a timeout are reported differently from our
/// own bugs, so that a nightly job can tell a bad node from a bad build.
pub fn classify(e: &anyhow::Error) -> i32 {
    e.chain().find_map(decides).unwrap_or(INTERNAL)
}

/// The exit code one error of a chain decides, if it decides one. The libraries' errors are
/// looked through to the error they carry, which their transparent variants keep out of the
/// chain.
fn decides(cause: &(dyn std::error::Error + 'static)) -> Option<i32> {
    use busbw_job::{BuildError, Error as Job};
    let build = |b: &BuildError| match b {
        BuildError::Store(s) => Some(store_code(s)),
        BuildError::Comm(c) => comm_code(c),
        _ => None,
    };
    if let Some(c) = cause.downcast_ref::<CommError>() {
        return comm_code(c);
    }
    if let Some(m) = cause.downcast_ref::<busbw_measure::Error>() {
        return m.comm().and_then(comm_code);
    }
    if let Some(j) = cause.downcast_ref::<Job>() {
        return match j.leaf() {
            Job::Comm(c) => comm_code(c),
            Job::Store(s) => Some(store_code(s)),
            // The fix is the command line.
            Job::Flags(_) => Some(USAGE),
            Job::Measure(m) => m.comm().and_then(comm_code),
            Job::Build(b) => build(b),
            Job::Nccl(n) => Some(nccl_join_code(n)),
            _ => None,
        };
    }
    if cause
        .downcast_ref::<busbw_collectives::nccl::NcclError>()
        .is_some()
    {
        // The library itself: absent, or not NCCL.
        return Some(USAGE);
    }
    if let Some(t) = cause.downcast_ref::<busbw_tiers::Error>() {
        return match t {
            busbw_tiers::Error::Build(b) => build(b),
            _ => None,
        };
    }
    if cause.downcast_ref::<busbw_job::FlagsDiffer>().is_some() {
        return Some(USAGE);
    }
    if cause
        .downcast_ref::<busbw_launchers::topology::SourceError>()
        .is_some()
    {
        return Some(USAGE); // a topology source as configured cannot be read
    }
    cause.downcast_ref::<StoreError>().map(store_code)
}

fn comm_code(c: &CommError) -> Option<i32> {
    match c {
        CommError::Timeout { .. } => Some(TIMEOUT),
        CommError::Aborted { .. } | CommError::Transport { .. } => Some(PEER_FAILURE),
        // What the lookup failed on (a peer that never registered, one no transport
        // reaches) decides.
        CommError::Lookup { .. } => None,
        _ => Some(INTERNAL),
    }
}

/// A rank that could not join NCCL: its library or the host's GPU is the fix (usage), unless
/// the unique id never came (rank 0 timed out or failed, as for any shared value).
fn nccl_join_code(e: &busbw_job::nccl::JoinError) -> i32 {
    use busbw_job::nccl::JoinError;
    use busbw_launchers::bootstrap::BootstrapError;
    match e {
        JoinError::Id {
            source: BootstrapError::NeverRegistered { .. },
            ..
        } => TIMEOUT,
        JoinError::Id { .. } => PEER_FAILURE,
        _ => USAGE,
    }
}

fn store_code(s: &StoreError) -> i32 {
    match s {
        StoreError::Timeout { .. } => TIMEOUT,
        // The fix is a setting (another --port, the right --job-token).
        StoreError::PortInUse { .. } | StoreError::WrongToken { .. } => USAGE,
        _ => PEER_FAILURE,
    }
}

/// The process's exit code from its ranks': the first that is a cause (the rank that failed,
/// timed out or was signalled, in rank order) rather than the echo of one (`PEER_FAILURE`,
/// which the other ranks of a failed job all return); else `PEER_FAILURE` if any rank saw one;
/// else 0. Wrong results are a verdict every rank reaches together, so they pass through.
pub fn combine(codes: &[i32]) -> i32 {
    codes
        .iter()
        .copied()
        .find(|&c| c != OK && c != PEER_FAILURE)
        .or_else(|| codes.iter().copied().find(|&c| c == PEER_FAILURE))
        .unwrap_or(OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_exits_with_the_cause_not_its_echoes() {
        assert_eq!(combine(&[OK, OK, OK]), OK);
        assert_eq!(combine(&[PEER_FAILURE, INTERNAL, PEER_FAILURE]), INTERNAL);
        assert_eq!(combine(&[PEER_FAILURE, PEER_FAILURE]), PEER_FAILURE);
        assert_eq!(combine(&[OK, PEER_FAILURE]), PEER_FAILURE);
        assert_eq!(combine(&[WRONG_RESULTS, WRONG_RESULTS]), WRONG_RESULTS);
        assert_eq!(combine(&[PEER_FAILURE, TIMEOUT, INTERNAL]), TIMEOUT);
        assert_eq!(combine(&[143, PEER_FAILURE]), 143);
    }
}
