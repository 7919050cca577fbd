//! A data listener's check of a connection's hello and proof, on arbitrary bytes: it must
//! return, and never accept a proof not made with the key.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    assert!(busbw_transports::auth::fuzz_data_hello(data).is_err());
});
