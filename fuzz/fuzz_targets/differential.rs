//! libFuzzer target: decodes a random op program from the input bytes and runs the
//! differential check of tests/all/random_graphs.rs on it (every op against the reference
//! interpreter in a strict trace run; strict, debug and defer, with mode switches, host reads
//! and flushes mid-program, byte for byte against that run). Any mismatch panics, which
//! libFuzzer reports as a crash with the input saved under fuzz/artifacts/.
#![no_main]

// The test suite's generator, harness and reference interpreter, shared by path.
#[path = "../../tests/all/graphgen/mod.rs"]
mod graphgen;
#[path = "../../tests/all/harness/mod.rs"]
mod harness;
#[path = "../../tests/all/reference/mod.rs"]
mod reference;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let program = graphgen::from_bytes(data);
    graphgen::check::check_program(&program);
});
