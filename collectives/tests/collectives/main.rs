//! Every collective against a reference computed without the engine: plain loops over every
//! rank's input (reductions: the fold of all inputs, exact in any order by construction).
//!
//! One test binary with a module per topic, so that CI links it once. Proptest roots its
//! regression files at the directory holding this main.rs: `properties.rs` keeps them in
//! `../proptest-regressions/properties.txt`.

mod alltoallv;
mod device;
mod harness;
mod hier;
mod hypercube;
mod ipc;
mod properties;
mod reference;
mod tcp;
