//! Shape buckets for whole-program modules: one module serves every batch size `n` of a
//! bucket `(B/2, B]`, so a training loop whose batch changes (the last, smaller batch of an
//! epoch) compiles at most one module per bucket instead of one per size.
//!
//! The module is the graph's module at batch `B` (`batch::Template::at`), with the padding
//! masked the way one-region programs mask theirs: each part's staged sizes are the padded ones
//! and its valid sizes an argument (`emit` masks its reductions, and a mean divides by the
//! valid count), computed inside the module from `n`, which the launch passes with the
//! scalars. Every buffer's flat array is its padded length, and its padding is zero: inputs
//! are staged with zero padding (`stage::flat_padded`), parts zero their results' padding, and
//! [`check_placement`] makes sure that every view's padded elements sit in its buffer's
//! padding, past the valid elements. That holds when the batch is the outermost dim of each
//! buffer it sizes (the padding at the end of the flat array); a graph where it does not is
//! compiled per exact size instead (`graph_program`). Gathers and scatters mask their padded
//! index elements themselves (`graph_kernel::Valid`).
//!
//! A static padded module with masks, rather than bounded dynamic dims
//! (`stablehlo.set_dimension_size`, which XLA's dynamic padder masks by itself): the emitters
//! already mask padded signatures for one-region programs, so the same code serves both,
//! and no op's type has to be re-inferred with dynamic dims.

use super::batch::Template;
use super::graph;
use super::graph_view::View;
use super::hlo::{Elem, Func, Ty, Val};
use super::stage::{self, Staging};
use deferfuse_fusion::region::{GraphRegion, Region};
use deferfuse_fusion::Binding;

/// A graph bound at its bucket: what `graph::module` needs to mask the padding.
pub struct Bucket {
    /// The bucket `B`: every batch-derived number is `coeff * B`.
    pub size: usize,
    /// The binding at twice the bucket: a number that doubles from `padded`'s is batch-derived.
    pub probe: Binding,
}

/// For each dim, its sizes at the bucket (`at_b`) and at twice it (`at_2b`): 0 for a dim that
/// does not depend on the batch, else `k` where the dim is `k * batch`.
pub fn coeffs(at_b: &[usize], at_2b: &[usize], b: usize) -> Result<Vec<usize>, String> {
    if at_b.len() != at_2b.len() {
        return Err(format!(
            "a part's rank depends on the batch ({at_b:?} at {b}, {at_2b:?} at {})",
            2 * b
        ));
    }
    at_b.iter()
        .zip(at_2b)
        .map(|(&x, &y)| match () {
            _ if x == y => Ok(0),
            _ if y == 2 * x && x % b == 0 => Ok(x / b),
            _ => Err(format!(
                "a part's size is not a multiple of the batch ({x} at {b}, {y} at {})",
                2 * b
            )),
        })
        .collect()
}

/// Part `part`'s staging at the bucket (`pb`), and the batch coefficient of each dim of its
/// space (`coeffs`), or why the part cannot be bucketed. A part with batch-derived dims has a
/// padded signature (`exact` false), so `emit` masks it.
pub fn part_staging(
    region: &Region,
    pb: &Binding,
    qb: &Binding,
    b: usize,
) -> Result<(Staging, Vec<usize>), String> {
    let mut p = stage::exact(region, pb);
    let q = stage::exact(region, qb);
    if p.sig.operands != q.sig.operands || p.strides != q.strides {
        return Err(format!(
            "part {region}'s staging depends on the batch beyond its sizes"
        ));
    }
    let c = coeffs(&p.valid, &q.valid, b)?;
    if let Region::Matmul { .. } = region {
        // A contraction over the batch relies on one operand's padding being zero: one of the
        // two must walk that dim (a broadcast one repeats its valid rows into the padding).
        let nb = p.sig.space.len() - 3;
        let walks = |j: usize, at: usize| p.sig.operands[j].present[at];
        if c[nb + 1] > 0 && !walks(0, nb + 1) && !walks(1, nb) {
            return Err("a matmul contracts over the batch with both operands broadcast".into());
        }
    }
    p.sig.exact = c.iter().all(|&k| k == 0);
    Ok((p, c))
}

/// A dim's valid size as an i64 scalar in the module: `size` itself, or `coeff * n` for a
/// batch-derived dim (`n` the launch's batch, an i64 scalar, which a bucketed module has).
pub fn valid_size(f: &mut Func, size: usize, coeff: usize, n: Option<&Val>) -> Val {
    let scalar = Ty::new(Elem::I64, &[]);
    match n {
        Some(n) if coeff > 0 => {
            let k = f.iconst(coeff as i64, scalar);
            f.ew("multiply", &[&k, n])
        }
        _ => f.iconst(size as i64, scalar),
    }
}

/// The valid sizes of a space of `sizes` (at the bucket) as the i64 vector `emit` takes:
/// `base + coeffs * n`, so XLA folds the dims that do not depend on the batch; the sizes
/// themselves when none does.
pub fn valid_sizes(f: &mut Func, sizes: &[usize], coeffs: &[usize], n: Option<&Val>) -> Val {
    let list = |v: Vec<usize>| {
        let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
        format!("[{}]", items.join(", "))
    };
    let ty = Ty::new(Elem::I64, &[sizes.len()]);
    let n = match n {
        Some(n) if coeffs.iter().any(|&k| k > 0) => n,
        _ => return f.constant(&list(sizes.to_vec()), ty),
    };
    let base: Vec<usize> = sizes
        .iter()
        .zip(coeffs)
        .map(|(&s, &k)| if k == 0 { s } else { 0 })
        .collect();
    let base = f.constant(&list(base), ty.clone());
    let k = f.constant(&list(coeffs.to_vec()), ty.clone());
    let nb = f.broadcast(n, &[sizes.len()], &[]);
    let kn = f.ew("multiply", &[&k, &nb]);
    f.ew("add", &[&base, &kn])
}

/// Every view of graph `g` at batch `n` (`bn`, boundary buffers of `lens_n` elements) against
/// the same view at the bucket (`pb`, `lens_b`): its padded elements (those past the valid
/// size along a batch-derived dim) must lie past its buffer's valid elements and inside its
/// padded array. Then a read of them gives the buffer's zero padding and a write of a part's
/// zeroed padding leaves the valid elements alone.
pub fn check_placement(
    g: &GraphRegion,
    (bn, lens_n): (&Binding, &[usize]),
    (pb, lens_b): (&Binding, &[usize]),
) -> Result<(), String> {
    let valid_len = graph::buffer_lens(g, bn, lens_n);
    let padded_len = graph::buffer_lens(g, pb, lens_b);
    for (part, (vn, vb)) in g.parts.iter().zip(bn.parts.iter().zip(&pb.parts)) {
        let views = |b: &Binding| -> Vec<View> {
            match &*part.region {
                Region::Kernel(_) => b.operands.iter().map(|t| View::of_layout(t).0).collect(),
                r => {
                    let p = stage::exact(r, b);
                    b.operands
                        .iter()
                        .enumerate()
                        .map(|(j, t)| View::of(&p, j, t))
                        .collect()
                }
            }
        };
        for ((n, p), &gb) in views(vn).iter().zip(&views(vb)).zip(&part.operands) {
            let gb = gb as usize;
            let why = |what: &str| {
                Err(format!(
                    "part {}: a view (sizes {:?}, strides {:?}, offset {}) of a buffer of {} \
                     elements {what}: the batch is not the outermost dim of that buffer",
                    part.region, n.sizes, n.strides, n.offset, valid_len[gb]
                ))
            };
            if n.sizes.len() != p.sizes.len() || n.strides != p.strides {
                return why("changes its dims with the batch");
            }
            let padded: Vec<usize> = (0..n.sizes.len())
                .filter(|&d| p.sizes[d] > n.sizes[d])
                .collect();
            if padded.is_empty() || n.numel() == 0 {
                continue;
            }
            if n.strides.iter().any(|&s| s < 0) {
                return why("walks it backwards");
            }
            let first_padded = padded
                .iter()
                .map(|&d| n.offset + n.sizes[d] * n.strides[d] as usize)
                .min()
                .unwrap_or(usize::MAX);
            if first_padded < valid_len[gb] {
                return why("has padding inside the valid elements");
            }
            let end = p.offset
                + p.sizes
                    .iter()
                    .zip(&p.strides)
                    .map(|(&s, &st)| (s - 1) * st as usize)
                    .sum::<usize>();
            if end >= padded_len[gb] {
                return why("reaches past its padded array");
            }
        }
    }
    Ok(())
}

/// The module of graph `g` for bucket `size`, from any binding `b` of template `t` (its
/// boundary buffers `lens` bytes): its text, layout, and each boundary array's padded length;
/// or why the graph cannot be bucketed. Placement is checked at both ends of the bucket:
/// every condition is linear in the batch, or a minimum of linear ones.
pub fn module(
    g: &GraphRegion,
    t: &Template,
    b: &Binding,
    lens: &[usize],
    size: usize,
) -> Result<(String, graph::Layout), String> {
    let elems = |b: &Binding, lens: &[usize]| -> Vec<usize> {
        lens.iter()
            .zip(&b.operands)
            .map(|(&l, t)| l / t.dtype.size())
            .collect()
    };
    let (pb, plens) = t.at(g, b, lens, size);
    let plens = elems(&pb, &plens);
    for n in [size / 2 + 1, size] {
        let (bn, nlens) = t.at(g, b, lens, n);
        check_placement(g, (&bn, &elems(&bn, &nlens)), (&pb, &plens))?;
    }
    let probe = t.at(g, b, lens, 2 * size).0;
    graph::module(g, &pb, &plens, Some(&Bucket { size, probe }))
}
