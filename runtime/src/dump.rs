//! `DEFERFUSE_DUMP_DIR`: each newly compiled region is written as readable text (with the
//! backend's program, e.g. Cranelift IR) and as a Graphviz graph, so a newcomer can see what ran
//! and why it was fused that way.

use deferfuse_cache::Fingerprint;
use deferfuse_fusion::region::{InstrKind, LoopRegion};
use deferfuse_fusion::Region;
use std::fmt::Write;
use std::path::Path;

/// Graphviz DOT of a loop region: operands, instructions and stores as nodes, data as edges.
pub fn loop_dot(key: Fingerprint, l: &LoopRegion) -> String {
    let mut s = format!("digraph region_{key} {{\n  rankdir=TB;\n  node [fontname=monospace];\n");
    for (i, inp) in l.inputs.iter().enumerate() {
        let _ = writeln!(
            s,
            "  in{i} [shape=box, label=\"in{i}: {} {:?}\"];",
            inp.dtype, inp.inner
        );
    }
    for (i, ins) in l.body.iter().enumerate() {
        let (label, args): (String, Vec<u32>) = match &ins.kind {
            InstrKind::Load(n) => {
                let _ = writeln!(s, "  in{n} -> v{i};");
                ("load".into(), vec![])
            }
            InstrKind::Param(p) => (format!("param p{p}"), vec![]),
            InstrKind::Unary(u, a) => (u.name().into(), vec![*a]),
            InstrKind::Binary(b, x, y) => (b.name().into(), vec![*x, *y]),
            InstrKind::Where(c, x, y) => ("where".into(), vec![*c, *x, *y]),
            InstrKind::Cast(a) => ("cast".into(), vec![*a]),
            InstrKind::Reduced(k) => {
                let _ = writeln!(s, "  r{k} -> v{i} [style=dashed];");
                (format!("row result r{k}"), vec![])
            }
        };
        let _ = writeln!(s, "  v{i} [label=\"v{i} {label}\\n{}\"];", ins.dtype);
        for a in args {
            let _ = writeln!(s, "  v{a} -> v{i};");
        }
    }
    for (j, (v, o)) in l.outputs.iter().enumerate() {
        let _ = writeln!(
            s,
            "  out{j} [shape=box, style=bold, label=\"out{j}: {} {:?}\"];\n  v{v} -> out{j};",
            o.dtype, o.inner
        );
    }
    for (k, r) in l.reduces.iter().enumerate() {
        let store = r
            .output
            .map(|o| format!(", stored as {}", o.dtype))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  r{k} [shape=box, style=bold, label=\"r{k}: {} per row{store}\"];\n  v{} -> r{k};",
            r.op.name(),
            r.value
        );
    }
    s.push_str("}\n");
    s
}

/// Writes `<dir>/<fingerprint>.txt` (and `.dot` for loops); failures are logged, never fatal.
pub fn write_region(dir: &Path, key: Fingerprint, region: &Region, listing: &str) {
    let text = format!("# region {key}\n{region}\n\n# program\n{listing}\n");
    let mut files = vec![(dir.join(format!("{key}.txt")), text)];
    if let Region::Loop(l) = region {
        files.push((dir.join(format!("{key}.dot")), loop_dot(key, l)));
    }
    for (path, body) in files {
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, body)) {
            tracing::warn!(path = %path.display(), error = %e, "could not write region dump");
        }
    }
}
