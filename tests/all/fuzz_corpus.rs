//! Replays the cargo-fuzz corpus (`fuzz/corpus/differential/`) through the same differential
//! check as the fuzz target, on stable and in every `cargo test`: the corpus, and every input
//! that once found a crash or a mismatch, stays a regression test without nightly or libFuzzer.

use crate::graphgen;

use std::path::Path;

#[test]
fn every_corpus_input_passes_the_differential_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/differential");
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "no corpus in {}", dir.display());
    for path in &inputs {
        let program = graphgen::from_bytes(&std::fs::read(path).unwrap());
        // A failing input names itself before the check's own message.
        eprintln!("{}: {} instructions", path.display(), program.ins.len());
        graphgen::check::check_program(&program);
    }
}
