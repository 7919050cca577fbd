//! Exit codes. 0 and 7 mean what they mean in nccl-tests, so CI gates written for nccl-tests
//! keep working; the others are ours and documented in the README.

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
