//! NCCL itself, opened at run time: the library a training job uses, so that a row measured
//! through it can stand beside nccl-tests' (issue 38's `--engine nccl`; this module is its
//! loader and the calls that work without a GPU).
//!
//! `libnccl.so.2` is opened with `dlopen` from `NCCL_LIBRARY` when set, else by its soname,
//! and never closed: NCCL keeps threads of its own alive for the process. Nothing is linked
//! at build time, so every build runs where NCCL is absent and says so when asked for it. On
//! a host without a GPU the library still loads, reports its version and makes unique ids;
//! `ncclCommInitRank` then fails with NCCL's own account of why (its last error), which
//! [`NcclError::Call`] carries.

mod comm;

pub use comm::{Comm, Wait};

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// The environment variable that names the library's path.
pub const LIBRARY_ENV: &str = "NCCL_LIBRARY";
/// The soname looked up when [`LIBRARY_ENV`] is unset.
pub const SONAME: &str = "libnccl.so.2";
/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: what rank 0 makes and every rank needs to join the same communicator.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// Lower-case hex, for the rendezvous store.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The id [`UniqueId::to_hex`] wrote; `None` for anything else.
    pub fn from_hex(text: &str) -> Option<UniqueId> {
        let text = text.trim();
        if text.len() != 2 * UNIQUE_ID_BYTES || !text.is_ascii() {
            return None;
        }
        let mut id = [0u8; UNIQUE_ID_BYTES];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(UniqueId(id))
    }
}

impl UniqueId {
    /// A short fingerprint of the whole id (FNV-1a, 64 bits), for messages: ranks that
    /// print the same one joined with the same id.
    pub fn digest(&self) -> String {
        let h = self.0.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("{h:016x}")
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}..)", &self.to_hex()[..16])
    }
}

/// NCCL's version as `ncclGetVersion` encodes it (major × 10000 + minor × 100 + patch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    fn from_code(code: c_int) -> Version {
        let c = code.max(0) as u32;
        // Before 2.9 the code was major × 1000 + minor × 100 + patch.
        let (major, rest) = if c >= 10000 {
            (c / 10000, c % 10000)
        } else {
            (c / 1000, c % 1000)
        };
        Version {
            major,
            minor: rest / 100,
            patch: rest % 100,
        }
    }
}

impl Version {
    /// The code `ncclGetVersion` gives (major × 10000 + minor × 100 + patch), as nccl-tests
    /// prints it in `nccl-library=`.
    pub fn code(&self) -> u32 {
        self.major * 10000 + self.minor * 100 + self.patch
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// The library could not be opened: what was tried and the loader's words.
    #[error(
        "NCCL's library {what} could not be opened ({why}); install it (`pip install \
         nvidia-nccl-cu12` puts it under nvidia/nccl/lib) and set {LIBRARY_ENV} to its path, \
         or use busbw's own engine"
    )]
    NotFound { what: String, why: String },
    /// The library lacks a function busbw calls (an NCCL older than 2.x, or not NCCL).
    #[error("{path} has no {symbol}: is it NCCL 2.x?")]
    Missing { path: String, symbol: &'static str },
    /// A call returned an error: its code, NCCL's words for the code, and NCCL's last error
    /// (the cause: "CUDA driver version is insufficient", a network failure ...).
    #[error("{call} failed: {what} (ncclResult_t {code}){}", last_error(.last))]
    Call {
        call: &'static str,
        code: i32,
        what: String,
        last: String,
    },
    /// [`Nccl::global`] failed earlier in this process; the words are that failure's.
    #[error("{0}")]
    Unavailable(String),
    /// An operation did not complete in time (`-T`); the communicator was aborted.
    #[error(
        "{what} did not complete within {secs:.0} s; the communicator was aborted (ncclCommAbort)"
    )]
    Timeout { what: String, secs: f64 },
    /// NCCL reported an error asynchronously while an operation ran (a peer failed, the
    /// network broke).
    #[error("{what} failed on the device: {error} (ncclResult_t {code}){}", last_error(.last))]
    Async {
        what: String,
        code: i32,
        error: String,
        last: String,
    },
    /// A type or operation NCCL has no counterpart for.
    #[error("{0}")]
    Unsupported(String),
}

fn last_error(last: &str) -> String {
    if last.is_empty() {
        String::new()
    } else {
        format!("; NCCL's last error: {last}")
    }
}

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> c_int;
type CommFinish = unsafe extern "C" fn(RawComm) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type GetLastError = unsafe extern "C" fn(RawComm) -> *const c_char;
type CommSplit = unsafe extern "C" fn(RawComm, c_int, c_int, *mut RawComm, *mut c_void) -> c_int;
type CommGetAsyncError = unsafe extern "C" fn(RawComm, *mut c_int) -> c_int;
pub(crate) type AllReduce =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, Stream) -> c_int;
type Reduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    RawComm,
    Stream,
) -> c_int;
type Broadcast =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, Stream) -> c_int;
type AllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, Stream) -> c_int;
type Send = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, Stream) -> c_int;
type Recv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, Stream) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;
type PreMulSum = unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, RawComm) -> c_int;
type RedOpDestroy = unsafe extern "C" fn(c_int, RawComm) -> c_int;

/// `ncclComm_t`.
pub(crate) type RawComm = *mut c_void;
/// `cudaStream_t` (the driver's `CUstream`: the same handle).
pub type Stream = *mut c_void;

/// The opened library and the functions busbw calls.
pub struct Nccl {
    path: String,
    get_version: GetVersion,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_destroy: CommFinish,
    comm_abort: CommFinish,
    get_error_string: GetErrorString,
    get_last_error: GetLastError,
    pub(crate) comm_split: CommSplit,
    pub(crate) get_async_error: CommGetAsyncError,
    pub(crate) all_reduce: AllReduce,
    pub(crate) reduce: Reduce,
    pub(crate) broadcast: Broadcast,
    pub(crate) all_gather: AllGather,
    pub(crate) reduce_scatter: AllReduce,
    pub(crate) send: Send,
    pub(crate) recv: Recv,
    pub(crate) group_start: Group,
    pub(crate) group_end: Group,
    pub(crate) premul_sum: PreMulSum,
    pub(crate) red_op_destroy: RedOpDestroy,
}

// SAFETY: the functions are NCCL's thread-safe entry points; the handle is never closed.
unsafe impl std::marker::Send for Nccl {}
unsafe impl Sync for Nccl {}

/// The library [`Nccl::open`] found, opened once per process: NCCL's own threads outlive
/// any one communicator, so the handle is never closed and every rank of the process shares
/// it.
static GLOBAL: OnceLock<Result<Nccl, String>> = OnceLock::new();

impl Nccl {
    /// `NCCL_LIBRARY` when set, else the soname through the loader's search path.
    pub fn open() -> Result<Nccl, NcclError> {
        match std::env::var(LIBRARY_ENV) {
            Ok(p) if !p.trim().is_empty() => Nccl::open_path(p.trim()),
            _ => Nccl::open_path(SONAME),
        }
    }

    /// The process's library ([`Nccl::open`] on first use; a failure is remembered and
    /// repeated, in the same words, to every later caller).
    pub fn global() -> Result<&'static Nccl, NcclError> {
        match GLOBAL.get_or_init(|| Nccl::open().map_err(|e| e.to_string())) {
            Ok(n) => Ok(n),
            Err(why) => Err(NcclError::Unavailable(why.clone())),
        }
    }

    /// The library at `path` (a path, or a soname the loader searches for).
    pub fn open_path(path: &str) -> Result<Nccl, NcclError> {
        let what = if path.contains('/') {
            path.to_string()
        } else {
            format!("{path} (by the loader's search path; {LIBRARY_ENV} unset)")
        };
        let c = CString::new(path).map_err(|_| NcclError::NotFound {
            what: what.clone(),
            why: "the path holds a NUL byte".into(),
        })?;
        // SAFETY: a NUL-terminated path; RTLD_NOW resolves everything now, so a broken
        // library fails here rather than at its first call.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(NcclError::NotFound {
                what,
                why: dl_error(),
            });
        }
        let sym = |symbol: &'static str| -> Result<*mut c_void, NcclError> {
            let name = CString::new(symbol).map_err(|_| NcclError::Missing {
                path: path.into(),
                symbol,
            })?;
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if p.is_null() {
                Err(NcclError::Missing {
                    path: path.into(),
                    symbol,
                })
            } else {
                Ok(p)
            }
        };
        macro_rules! f {
            ($name:literal, $ty:ty) => {
                // SAFETY: the symbol is NCCL's function of that name, whose C signature the
                // type spells (nccl.h).
                unsafe { std::mem::transmute::<*mut c_void, $ty>(sym($name)?) }
            };
        }
        Ok(Nccl {
            path: path.to_string(),
            get_version: f!("ncclGetVersion", GetVersion),
            get_unique_id: f!("ncclGetUniqueId", GetUniqueId),
            comm_init_rank: f!("ncclCommInitRank", CommInitRank),
            comm_destroy: f!("ncclCommDestroy", CommFinish),
            comm_abort: f!("ncclCommAbort", CommFinish),
            get_error_string: f!("ncclGetErrorString", GetErrorString),
            get_last_error: f!("ncclGetLastError", GetLastError),
            comm_split: f!("ncclCommSplit", CommSplit),
            get_async_error: f!("ncclCommGetAsyncError", CommGetAsyncError),
            all_reduce: f!("ncclAllReduce", AllReduce),
            reduce: f!("ncclReduce", Reduce),
            broadcast: f!("ncclBroadcast", Broadcast),
            all_gather: f!("ncclAllGather", AllGather),
            reduce_scatter: f!("ncclReduceScatter", AllReduce),
            send: f!("ncclSend", Send),
            recv: f!("ncclRecv", Recv),
            group_start: f!("ncclGroupStart", Group),
            group_end: f!("ncclGroupEnd", Group),
            premul_sum: f!("ncclRedOpCreatePreMulSum", PreMulSum),
            red_op_destroy: f!("ncclRedOpDestroy", RedOpDestroy),
        })
    }

    /// Where the library was opened from, as given.
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn version(&self) -> Result<Version, NcclError> {
        let mut code: c_int = 0;
        // SAFETY: an out-pointer to an int.
        let r = unsafe { (self.get_version)(&mut code) };
        self.check("ncclGetVersion", r, std::ptr::null_mut())?;
        Ok(Version::from_code(code))
    }

    /// A fresh id for a communicator (rank 0 makes it; the others receive it).
    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut id = UniqueId([0; UNIQUE_ID_BYTES]);
        // SAFETY: an out-pointer to an ncclUniqueId.
        let r = unsafe { (self.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", r, std::ptr::null_mut())?;
        Ok(id)
    }

    /// Joins rank `rank` of `nranks` to the communicator `id` names, on the calling thread's
    /// current CUDA device. Blocks until every rank has joined.
    pub fn init_rank(
        &self,
        nranks: usize,
        id: UniqueId,
        rank: usize,
    ) -> Result<Comm<'_>, NcclError> {
        let (n, r) = match (c_int::try_from(nranks), c_int::try_from(rank)) {
            (Ok(n), Ok(r)) if rank < nranks => (n, r),
            _ => {
                return Err(NcclError::Call {
                    call: "ncclCommInitRank",
                    code: 4,
                    what: format!("rank {rank} is outside a communicator of {nranks} ranks"),
                    last: String::new(),
                })
            }
        };
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: an out-pointer to a communicator handle and the id by value, as nccl.h says.
        let res = unsafe { (self.comm_init_rank)(&mut raw, n, id, r) };
        self.check("ncclCommInitRank", res, std::ptr::null_mut())?;
        Ok(Comm::new(self, raw, rank, nranks))
    }

    pub(crate) fn check(
        &self,
        call: &'static str,
        code: c_int,
        comm: RawComm,
    ) -> Result<(), NcclError> {
        if code == 0 {
            return Ok(());
        }
        Err(NcclError::Call {
            call,
            code,
            what: self.error_string(code),
            last: self.last_error(comm),
        })
    }

    /// NCCL's words for result `code`.
    pub(crate) fn error_string(&self, code: c_int) -> String {
        // SAFETY: NCCL returns a static string (or null) for any code.
        unsafe { text((self.get_error_string)(code)) }
    }

    /// NCCL's last error on `comm` (null: the thread's last).
    pub(crate) fn last_error(&self, comm: RawComm) -> String {
        // SAFETY: NCCL returns a static string (or null) for any communicator, null included.
        unsafe { text((self.get_last_error)(comm)) }
    }

    pub(crate) fn destroy(&self, raw: RawComm) {
        // SAFETY: a communicator NCCL made, ended once (the caller forgets it).
        unsafe { (self.comm_destroy)(raw) };
    }

    pub(crate) fn abort_raw(&self, raw: RawComm) -> Result<(), NcclError> {
        // SAFETY: a communicator NCCL made, ended once (the caller forgets it).
        let r = unsafe { (self.comm_abort)(raw) };
        self.check("ncclCommAbort", r, std::ptr::null_mut())
    }
}

/// # Safety
/// `p` null or a NUL-terminated string.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().trim().to_string()
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or the loader's last message.
    unsafe { text(libc::dlerror()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_both_encodings() {
        assert_eq!(Version::from_code(23203).to_string(), "2.32.3");
        assert_eq!(Version::from_code(2708).to_string(), "2.7.8");
        assert_eq!(Version::from_code(23203).code(), 23203);
    }

    #[test]
    fn ids_travel_as_hex_and_nothing_else_is_taken_for_one() {
        let mut raw = [0u8; UNIQUE_ID_BYTES];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = (i * 37 % 256) as u8;
        }
        let id = UniqueId(raw);
        assert_eq!(UniqueId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(UniqueId::from_hex(&format!("{}\n", id.to_hex())), Some(id));
        assert!(UniqueId::from_hex(&id.to_hex()[2..]).is_none(), "short");
        assert!(UniqueId::from_hex(&"zz".repeat(UNIQUE_ID_BYTES)).is_none());
        assert!(UniqueId::from_hex(&"é".repeat(UNIQUE_ID_BYTES)).is_none());
    }

    #[test]
    fn a_missing_library_is_named_with_what_to_install() {
        let e = Nccl::open_path("/nonexistent/libnccl.so.2")
            .err()
            .expect("no library there");
        let m = e.to_string();
        assert!(m.contains("/nonexistent/libnccl.so.2"), "{m}");
        assert!(
            m.contains("nvidia-nccl-cu12") && m.contains(LIBRARY_ENV),
            "{m}"
        );
    }
}
