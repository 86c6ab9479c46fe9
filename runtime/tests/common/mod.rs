//! Helpers the codegen test suites share: reading a CPU program's listing.

// Each suite uses some of these.
#![allow(dead_code)]

pub mod lanes;

/// The optimized Cranelift IR section of a program's listing (`DEFERFUSE_DUMP_DIR` format).
pub fn optimized_ir(listing: &str) -> &str {
    let start = listing
        .find("; ---- optimized IR ----")
        .expect("the listing has the optimized IR");
    let end = listing
        .find("; ---- machine code ----")
        .unwrap_or(listing.len());
    &listing[start..end]
}

/// The text of each block of a Cranelift function, by block name.
pub fn blocks(ir: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in ir.lines() {
        if line.starts_with("block") {
            let name = line.split(['(', ':']).next().unwrap_or("").to_string();
            out.push((name, String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}
