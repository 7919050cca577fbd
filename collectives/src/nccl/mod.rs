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

use std::ffi::{c_char, c_int, c_void, CStr, CString};

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
type CommInitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> c_int;
type CommFinish = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type GetLastError = unsafe extern "C" fn(*mut c_void) -> *const c_char;

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
}

// SAFETY: the functions are NCCL's thread-safe entry points; the handle is never closed.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

impl Nccl {
    /// `NCCL_LIBRARY` when set, else the soname through the loader's search path.
    pub fn open() -> Result<Nccl, NcclError> {
        match std::env::var(LIBRARY_ENV) {
            Ok(p) if !p.trim().is_empty() => Nccl::open_path(p.trim()),
            _ => Nccl::open_path(SONAME),
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
        // SAFETY: each symbol is NCCL's function of that name, whose C signature the type
        // spells (nccl.h).
        unsafe {
            Ok(Nccl {
                path: path.to_string(),
                get_version: std::mem::transmute::<*mut c_void, GetVersion>(sym("ncclGetVersion")?),
                get_unique_id: std::mem::transmute::<*mut c_void, GetUniqueId>(sym(
                    "ncclGetUniqueId",
                )?),
                comm_init_rank: std::mem::transmute::<*mut c_void, CommInitRank>(sym(
                    "ncclCommInitRank",
                )?),
                comm_destroy: std::mem::transmute::<*mut c_void, CommFinish>(sym(
                    "ncclCommDestroy",
                )?),
                comm_abort: std::mem::transmute::<*mut c_void, CommFinish>(sym("ncclCommAbort")?),
                get_error_string: std::mem::transmute::<*mut c_void, GetErrorString>(sym(
                    "ncclGetErrorString",
                )?),
                get_last_error: std::mem::transmute::<*mut c_void, GetLastError>(sym(
                    "ncclGetLastError",
                )?),
            })
        }
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
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer to a communicator handle and the id by value, as nccl.h says.
        let res = unsafe { (self.comm_init_rank)(&mut raw, n, id, r) };
        self.check("ncclCommInitRank", res, std::ptr::null_mut())?;
        Ok(Comm { nccl: self, raw })
    }

    fn check(&self, call: &'static str, code: c_int, comm: *mut c_void) -> Result<(), NcclError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns static strings (or null) for any code and any communicator,
        // null included.
        let (what, last) = unsafe {
            (
                text((self.get_error_string)(code)),
                text((self.get_last_error)(comm)),
            )
        };
        Err(NcclError::Call {
            call,
            code,
            what,
            last,
        })
    }
}

/// An NCCL communicator, destroyed when dropped.
pub struct Comm<'a> {
    nccl: &'a Nccl,
    raw: *mut c_void,
}

impl Comm<'_> {
    /// Ends the communicator at once, abandoning operations in flight (a peer stopped
    /// answering): `ncclCommAbort`.
    pub fn abort(mut self) -> Result<(), NcclError> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        // SAFETY: a communicator ncclCommInitRank made, ended once.
        let r = unsafe { (self.nccl.comm_abort)(raw) };
        self.nccl.check("ncclCommAbort", r, std::ptr::null_mut())
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: a communicator ncclCommInitRank made, ended once.
            unsafe { (self.nccl.comm_destroy)(self.raw) };
        }
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
