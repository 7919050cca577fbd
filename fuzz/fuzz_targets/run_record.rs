//! The files `busbw compare` and `busbw report` read (busbw run records and nccl-tests `-J`
//! output), parsed and compared with themselves.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    busbw_reports::run::fuzz_load(data);
});
