//! Is there a CUDA driver and NVRTC? Asked with dlopen before cudarc is touched: cudarc's
//! dynamic loading panics when a library is missing, and a missing driver is a user's
//! configuration problem that deserves a sentence, not a backtrace.

use std::ffi::CString;

/// The sonames tried, most specific first (the driver's is fixed by the driver ABI; NVRTC's
/// carries the toolkit's major version, or major.minor before CUDA 11.3).
pub const DRIVER_SONAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];
pub const NVRTC_SONAMES: [&str; 7] = [
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
    "libnvrtc.so.11.1",
    "libnvrtc.so.11.0",
    "libnvrtc.so",
    "libnvrtc.so.11",
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("no CUDA driver: libcuda.so.1 not found ({detail}); install the NVIDIA driver or run without -g")]
    NoDriver { detail: String },
    #[error("no NVRTC: none of {tried} found ({detail}); install the CUDA runtime compiler (the cuda-nvrtc package of your CUDA version) or run without -g")]
    NoNvrtc { tried: String, detail: String },
}

/// The sonames that opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaLibs {
    pub driver: &'static str,
    pub nvrtc: &'static str,
}

/// First of `names` that dlopen accepts, or the last dlerror.
pub fn first_loadable(names: &[&'static str]) -> Result<&'static str, String> {
    let mut last = String::from("no names to try");
    for &n in names {
        let Ok(c) = CString::new(n) else { continue };
        // SAFETY: c is NUL-terminated; RTLD_LAZY|RTLD_LOCAL loads without running anything
        // beyond the library's initialisers; the handle is closed at once below.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if !h.is_null() {
            // SAFETY: h came from dlopen just above.
            unsafe { libc::dlclose(h) };
            return Ok(n);
        }
        // SAFETY: dlerror returns a thread-local, NUL-terminated string or null.
        let e = unsafe { libc::dlerror() };
        if !e.is_null() {
            // SAFETY: non-null, NUL-terminated, valid until the next dl* call on this thread.
            last = unsafe { std::ffi::CStr::from_ptr(e) }
                .to_string_lossy()
                .into_owned();
        }
    }
    Err(last)
}

/// Checks both libraries with the given soname lists (the tests pass names that cannot
/// exist).
pub fn probe_with(driver: &[&'static str], nvrtc: &[&'static str]) -> Result<CudaLibs, ProbeError> {
    let driver = first_loadable(driver).map_err(|detail| ProbeError::NoDriver { detail })?;
    let nvrtc = first_loadable(nvrtc).map_err(|detail| ProbeError::NoNvrtc {
        tried: nvrtc.join(", "),
        detail,
    })?;
    Ok(CudaLibs { driver, nvrtc })
}

/// [`probe_with`] the usual sonames.
pub fn probe() -> Result<CudaLibs, ProbeError> {
    probe_with(&DRIVER_SONAMES, &NVRTC_SONAMES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_a_sentence_that_says_what_to_do() {
        let e = probe_with(&["libbusbw-no-such-driver.so.1"], &NVRTC_SONAMES).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("no CUDA driver: libcuda.so.1 not found"),
            "{msg}"
        );
        assert!(
            msg.contains("install the NVIDIA driver or run without -g"),
            "{msg}"
        );
        assert!(
            msg.contains("libbusbw-no-such-driver.so.1"),
            "dlerror kept: {msg}"
        );
    }

    #[test]
    fn a_missing_nvrtc_names_what_was_tried() {
        // libc is always there; it stands in for a driver that loads.
        let e = probe_with(&["libc.so.6"], &["libbusbw-no-nvrtc.so.12"]).unwrap_err();
        assert!(matches!(e, ProbeError::NoNvrtc { .. }), "{e:?}");
        assert!(e.to_string().contains("libbusbw-no-nvrtc.so.12"));
        let ok = probe_with(&["libc.so.6"], &["libbusbw-nope.so", "libm.so.6"]).unwrap();
        assert_eq!(
            ok,
            CudaLibs {
                driver: "libc.so.6",
                nvrtc: "libm.so.6"
            }
        );
    }

    #[test]
    fn probe_on_this_machine_either_finds_both_or_says_what_to_do() {
        match probe() {
            Ok(l) => {
                assert!(DRIVER_SONAMES.contains(&l.driver) && NVRTC_SONAMES.contains(&l.nvrtc))
            }
            Err(e) => {
                assert!(e.to_string().contains("run without -g"), "{e}");
                eprintln!("SKIP device checks on this machine: {e}");
            }
        }
    }
}
