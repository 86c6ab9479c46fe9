//! Short names for regions, for a timeline's program runs: the full text of a fused loop is
//! dozens of lines, too long for a viewer's slice.

use deferfuse_fusion::region::{InstrKind, LoopRegion};
use deferfuse_fusion::Region;

/// Most op names a loop's label lists before it says how many more there are.
const MAX_NAMED: usize = 4;

/// `fused mul+add+exp (+3 ops)`, `row kernel sum+... `, `matmul.f32 + epilogue`, `gather`.
pub fn region_label(r: &Region) -> String {
    match r {
        Region::Loop(l) => loop_label(l),
        Region::Matmul { dtype, epilogue } => match epilogue {
            Some(e) => format!("matmul.{dtype} + {}", loop_ops(e)),
            None => format!("matmul.{dtype}"),
        },
        Region::Arange { dtype } => format!("arange.{dtype}"),
        Region::Kernel(k) => k.name().to_string(),
        Region::Graph(g) => format!("graph of {} steps", g.parts.len()),
    }
}

/// A loop region's label (`fused mul+add`, `row kernel mul+sum`).
pub(crate) fn loop_label(l: &LoopRegion) -> String {
    let kind = if l.reduces.is_empty() {
        "fused"
    } else {
        "row kernel"
    };
    format!("{kind} {}", loop_ops(l))
}

/// The loop's ops in body order (reductions last), each named once.
fn loop_ops(l: &LoopRegion) -> String {
    let mut names: Vec<&'static str> = Vec::new();
    for ins in &l.body {
        let n = match &ins.kind {
            InstrKind::Unary(u, _) => u.name(),
            InstrKind::Binary(b, _, _) => b.name(),
            InstrKind::Where(..) => "where",
            InstrKind::Cast(_) => "cast",
            InstrKind::Load(_) | InstrKind::Param(_) | InstrKind::Reduced(_) => continue,
        };
        if !names.contains(&n) {
            names.push(n);
        }
    }
    for r in &l.reduces {
        let n = r.op.name();
        if !names.contains(&n) {
            names.push(n);
        }
    }
    if names.is_empty() {
        return "copy".into();
    }
    let more = names.len().saturating_sub(MAX_NAMED);
    let mut s = names[..names.len().min(MAX_NAMED)].join("+");
    if more > 0 {
        s.push_str(&format!(" (+{more} ops)"));
    }
    s
}
