//! The rendezvous store's request decoder on arbitrary frame bodies.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = busbw_launchers::store::fuzz_request(data);
});
