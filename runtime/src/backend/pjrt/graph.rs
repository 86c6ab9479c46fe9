//! Whole-program modules: a [`GraphRegion`] (every op of a flush between two cuts) becomes one
//! StableHLO module, compiled for the flush's exact shapes or for a bucket of batch sizes
//! (`graph_bucket`), and XLA fuses across its parts.
//!
//! Each part is lowered as in a one-region program (`emit::function`, at its exact sizes, so
//! no masks; in a bucketed module at the bucket's sizes, masked with the valid sizes the
//! module computes from the launch's batch) into a private function that `@main` calls; XLA
//! inlines the calls. `@main` holds
//! every buffer the graph touches as one flat array of the buffer's elements, in its dtype's
//! compute element: a part's operand is a view of that array (a slice and reshape when the view
//! is dense, plus a transpose when it is a permuted dense block, a gather by computed indices
//! otherwise), and a part's result is written back as a functional update (the whole array
//! when the view covers it, else an update of a slice or a scatter), so in-place writes need no
//! copies. Only the buffers the planner lists cross the boundary: the binding's inputs the
//! module reads (arguments after the packed scalars) and its outputs (results). An input that
//! is also an output is donated (`tf.aliasing_output`): XLA updates it in place.
//!
//! Scalars (a learning rate, AdamW's bias corrections) change every step: they are arguments,
//! packed into one 1-D array per element type, so a launch uploads a handful of small arrays.
//!
//! Kernel parts (gather, scatter, depthwise convolutions) have no staging: their operands are
//! read through their layouts and lowered by `graph_kernel`, whose bounds checks (gather's and
//! scatter's) become one extra i64 result; the layout says which checks each output's value
//! depends on (`Layout::output_checks`).

use super::emit;
use super::graph_bucket::{self, Bucket};
use super::graph_kernel::{self, Check};
use super::graph_view::View;
use super::hlo::{Elem, Func, Ty, Val};
use super::ops::cast;
use super::stage;
use deferfuse_fusion::ir::DType;
use deferfuse_fusion::region::{GraphRegion, Region};
use deferfuse_fusion::Binding;
use std::collections::HashMap;

/// How a scalar argument's 64 bits become its value (see `stage::scalar_bytes`).
#[derive(Clone, Copy, Debug)]
pub enum ScalarKind {
    /// A loop's parameter slot of this dtype.
    Param(DType),
    /// A matmul's alpha or beta, in the matmul's dtype.
    Gemm(DType),
    /// An arange's start or step (f64 bits as they are).
    F64,
    /// The launch's batch size, for a bucketed module (`graph_bucket`); an i64.
    Batch,
}

/// One scalar argument: part `part`'s slot `slot`.
#[derive(Clone, Copy, Debug)]
pub struct ScalarSrc {
    pub part: usize,
    pub slot: usize,
    pub kind: ScalarKind,
}

/// What a compiled module takes and gives, kept with its executable.
#[derive(Debug)]
pub struct Layout {
    /// The leading arguments: one 1-D array per element type, of these scalars in order.
    pub scalars: Vec<(Elem, Vec<ScalarSrc>)>,
    /// The binding inputs the module reads, in argument order after the scalar arrays, each
    /// its buffer's flat array (`stage::flat_padded`, at `lens`).
    pub inputs: Vec<usize>,
    /// Each binding operand's flat array length in the module: its buffer's, or for a
    /// bucketed module the padded length at the bucket.
    pub lens: Vec<usize>,
    /// The binding outputs, in result order (buffers with no elements are left out).
    pub outputs: Vec<usize>,
    /// The bounds checks of the gather and scatter parts, in part order: when there are any,
    /// the module's last result holds [`graph_kernel::CHECK_WORDS`] i64s per check.
    pub checks: Vec<Check>,
    /// For each output, the checks its value depends on: a bad index fails only those
    /// outputs, as on the CPU backend, where only what is computed from it fails.
    pub output_checks: Vec<Vec<usize>>,
}

/// Which bounds checks each graph buffer's current value depends on.
struct Taint(Vec<Vec<usize>>);

impl Taint {
    /// The checks the values of buffers `gbs` depend on.
    fn of(&self, gbs: impl Iterator<Item = usize>) -> Vec<usize> {
        let mut t: Vec<usize> = gbs.flat_map(|gb| self.0[gb].iter().copied()).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// Buffer `gb` written with a value that depends on `t`: it replaces the old value when
    /// the write `covers` the buffer, else it joins it.
    fn write(&mut self, gb: usize, t: &[usize], covers: bool) {
        if covers {
            self.0[gb].clear();
        }
        self.0[gb].extend_from_slice(t);
        self.0[gb].sort_unstable();
        self.0[gb].dedup();
    }
}

/// The dims a buffer of `n` elements is staged with (`stage::flat_padded`): a 0-d array for one.
pub fn flat_dims(n: usize) -> Vec<usize> {
    if n > 1 {
        vec![n]
    } else {
        vec![]
    }
}

/// Every buffer of the graph: its dtype and element count.
struct Buffers {
    dtype: Vec<Option<DType>>,
    len: Vec<usize>,
    /// The binding input that carries each buffer's old value, if any.
    input: Vec<Option<usize>>,
}

/// The element count of every buffer of graph `g` bound to `b` (boundary buffers of `lens`
/// elements; an intermediate one spans its views).
pub fn buffer_lens(g: &GraphRegion, b: &Binding, lens: &[usize]) -> Vec<usize> {
    Buffers::new(g, b, lens).len
}

impl Buffers {
    fn new(g: &GraphRegion, b: &Binding, lens: &[usize]) -> Buffers {
        let n = g.buffers as usize;
        let mut s = Buffers {
            dtype: vec![None; n],
            len: vec![0; n],
            input: vec![None; n],
        };
        let mut known = vec![false; n];
        for (j, (&gb, t)) in g.operands.iter().zip(&b.operands).enumerate() {
            let gb = gb as usize;
            s.dtype[gb] = Some(t.dtype);
            s.len[gb] = lens[j];
            known[gb] = true;
            if j < g.n_inputs {
                s.input[gb] = Some(j);
            }
        }
        for (part, pb) in g.parts.iter().zip(&b.parts) {
            for (&gb, t) in part.operands.iter().zip(&pb.operands) {
                let gb = gb as usize;
                s.dtype[gb].get_or_insert(t.dtype);
                if !known[gb] {
                    // An intermediate: only its views in this graph exist.
                    s.len[gb] = s.len[gb].max(t.layout.extent());
                }
            }
        }
        s
    }

    fn elem(&self, gb: usize) -> Elem {
        Elem::of(self.dtype[gb].expect("every graph buffer is an operand"))
    }
}

/// The scalar arguments of each part, in the order `emit` declares them after the operands
/// (a scatter's value, when it has no src tensor, in its result's dtype).
fn scalar_srcs(region: &Region, pb: &Binding, part: usize) -> Vec<ScalarSrc> {
    let src = |slot, kind| ScalarSrc { part, slot, kind };
    match region {
        Region::Loop(l) => l
            .params
            .iter()
            .enumerate()
            .map(|(slot, &d)| src(slot, ScalarKind::Param(d)))
            .collect(),
        Region::Matmul { dtype, epilogue } => {
            debug_assert!(epilogue.is_none(), "graph parts are single nodes");
            vec![
                src(0, ScalarKind::Gemm(*dtype)),
                src(1, ScalarKind::Gemm(*dtype)),
            ]
        }
        Region::Arange { dtype } => {
            let kind = if Region::arange_in_integers(*dtype) {
                ScalarKind::Param(DType::I64)
            } else {
                ScalarKind::F64
            };
            vec![src(0, kind), src(1, kind)]
        }
        Region::Kernel(_) => pb
            .scalars
            .iter()
            .enumerate()
            .map(|(slot, _)| src(slot, ScalarKind::Param(pb.operands[0].dtype)))
            .collect(),
        Region::Graph(_) => unreachable!("graphs hold no graphs"),
    }
}

fn elem_of(kind: ScalarKind) -> Elem {
    match kind {
        ScalarKind::Param(d) | ScalarKind::Gemm(d) => Elem::of(d),
        ScalarKind::F64 => Elem::F64,
        ScalarKind::Batch => Elem::I64,
    }
}

/// A part's result `v` as its buffer stores it: f16 and bf16 rounded, u8 wrapped. A one-region
/// program's host store does this; inside a module the next part must read the stored value.
fn stored(m: &mut Func, v: &Val, d: DType) -> Val {
    match d {
        DType::F16 | DType::BF16 => cast(m, v, DType::F32, d),
        DType::U8 => cast(m, v, DType::I32, d),
        _ => v.clone(),
    }
}

/// Buffer `gb`'s current value. An input's is its argument, declared on first use (and noted in
/// `inputs`); a buffer nothing wrote yet that is no input was created by this flush and holds
/// zeros, as a fresh host buffer would.
fn value(
    m: &mut Func,
    cur: &mut [Option<Val>],
    inputs: &mut Vec<usize>,
    bufs: &Buffers,
    gb: usize,
) -> Val {
    if let Some(v) = &cur[gb] {
        return v.clone();
    }
    let n = bufs.len[gb];
    let e = bufs.elem(gb);
    let v = match bufs.input[gb] {
        Some(j) if n > 0 => {
            inputs.push(j);
            let a = m.arg(Ty::new(e, &flat_dims(n)));
            m.reshape(&a, &[n])
        }
        _ => m.fconst(0.0, Ty::new(e, &[n])),
    };
    cur[gb] = Some(v.clone());
    v
}

/// Writes `r` (the values of `view`, at its sizes) into buffer `gb`: the whole array when the
/// view covers it, else a functional update of its current value.
fn store(
    m: &mut Func,
    cur: &mut [Option<Val>],
    inputs: &mut Vec<usize>,
    bufs: &Buffers,
    gb: usize,
    view: &View,
    r: &Val,
) {
    let new = if view.covers(bufs.len[gb]) {
        view.as_run(m, r).expect("a covering view is a dense block")
    } else {
        let old = value(m, cur, inputs, bufs, gb);
        view.write(m, &old, r)
    };
    cur[gb] = Some(new);
}

/// The module for graph `g` bound to `b`, whose binding operands' buffers hold `lens`
/// elements; and what it takes and gives. With `bucket`, `b` is the binding at the bucket and
/// the module masks its padding (see `graph_bucket`); it fails, saying why, when a part cannot
/// be bucketed.
pub fn module(
    g: &GraphRegion,
    b: &Binding,
    lens: &[usize],
    bucket: Option<&Bucket>,
) -> Result<(String, Layout), String> {
    let bufs = Buffers::new(g, b, lens);
    // Kernel parts have no staging: their operands are read through their layouts. With a
    // bucket, each part also has the batch coefficient of each dim of its space (loops,
    // matmuls) or of each dim of each operand (kernels).
    let mut stagings: Vec<Option<stage::Staging>> = Vec::new();
    let mut coeffs: Vec<Vec<Vec<usize>>> = Vec::new();
    for (k, (p, pb)) in g.parts.iter().zip(&b.parts).enumerate() {
        let (staging, c) = match (&*p.region, bucket) {
            (Region::Kernel(_), None) => (None, vec![]),
            (Region::Kernel(_), Some(q)) => {
                let c = pb.operands.iter().zip(&q.probe.parts[k].operands);
                let c =
                    c.map(|(x, y)| graph_bucket::coeffs(&x.layout.sizes, &y.layout.sizes, q.size));
                (None, c.collect::<Result<_, _>>()?)
            }
            (r, None) => (Some(stage::exact(r, pb)), vec![]),
            (r, Some(q)) => {
                let (s, c) = graph_bucket::part_staging(r, pb, &q.probe.parts[k], q.size)?;
                (Some(s), vec![c])
            }
        };
        stagings.push(staging);
        coeffs.push(c);
    }
    let mut m = Func::default();
    // The scalar arrays come first: their sizes are known before any part is emitted. A
    // bucketed module's batch leads them.
    let mut scalars: Vec<(Elem, Vec<ScalarSrc>)> = Vec::new();
    if bucket.is_some() {
        let batch = ScalarSrc {
            part: usize::MAX,
            slot: 0,
            kind: ScalarKind::Batch,
        };
        scalars.push((Elem::I64, vec![batch]));
    }
    let mut at: Vec<Vec<(usize, usize)>> = Vec::new();
    for (k, (part, pb)) in g.parts.iter().zip(&b.parts).enumerate() {
        let mut mine = Vec::new();
        if !stagings[k].as_ref().is_some_and(|s| s.empty) {
            for s in scalar_srcs(&part.region, pb, k) {
                let e = elem_of(s.kind);
                let a = match scalars.iter().position(|(x, _)| *x == e) {
                    Some(a) => a,
                    None => {
                        scalars.push((e, Vec::new()));
                        scalars.len() - 1
                    }
                };
                scalars[a].1.push(s);
                mine.push((a, scalars[a].1.len() - 1));
            }
        }
        at.push(mine);
    }
    let arrays: Vec<Val> = scalars
        .iter()
        .map(|(e, v)| m.arg(Ty::new(*e, &[v.len()])))
        .collect();
    let batch = bucket.map(|_| {
        let s = m.slice(&arrays[0], 0, 1);
        m.reshape(&s, &[])
    });
    let mut cur: Vec<Option<Val>> = vec![None; g.buffers as usize];
    let mut inputs: Vec<usize> = Vec::new();
    let mut functions: HashMap<String, String> = HashMap::new();
    let mut text = String::new();
    let mut checks: Vec<Check> = Vec::new();
    let mut flags: Vec<Val> = Vec::new();
    let mut taint = Taint(vec![Vec::new(); g.buffers as usize]);
    for (k, (part, pb)) in g.parts.iter().zip(&b.parts).enumerate() {
        let Some(p) = &stagings[k] else {
            let Region::Kernel(op) = &*part.region else {
                unreachable!("only kernel parts have no staging")
            };
            let mut args = Vec::new();
            for (j, t) in pb.operands[..pb.n_inputs].iter().enumerate() {
                let buf = value(
                    &mut m,
                    &mut cur,
                    &mut inputs,
                    &bufs,
                    part.operands[j] as usize,
                );
                let (view, kept) = View::of_layout(t);
                let v = view.read(&mut m, &buf);
                args.push(m.broadcast(&v, &t.layout.sizes, &kept));
            }
            let scalar = at[k].first().map(|&(a, i)| {
                let s = m.slice(&arrays[a], i, i + 1);
                m.reshape(&s, &[])
            });
            let out = &pb.operands[pb.n_inputs];
            let valid = batch.as_ref().map(|n| {
                let c = &coeffs[k];
                let at = |m: &mut Func, k: usize| graph_bucket::valid_size(m, 0, k, Some(n));
                let dim = graph_kernel::indexed_dim(op);
                graph_kernel::Valid {
                    idx: c[1]
                        .iter()
                        .map(|&k| (k > 0).then(|| at(&mut m, k)))
                        .collect(),
                    size: c[0]
                        .get(dim)
                        .filter(|&&k| k > 0)
                        .map(|&k| (k, at(&mut m, k))),
                }
            });
            let l = graph_kernel::lower(
                &mut m,
                op,
                &args,
                scalar.as_ref(),
                out.dtype,
                valid.as_ref(),
            );
            let ins = part.operands[..pb.n_inputs].iter().map(|&gb| gb as usize);
            let mut t = taint.of(ins);
            if let Some((check, flag)) = l.check {
                t.push(checks.len());
                checks.push(check);
                flags.push(flag);
            }
            let gb = part.operands[pb.n_inputs] as usize;
            let (view, kept) = View::of_layout(out);
            taint.write(gb, &t, view.covers(bufs.len[gb]));
            let r = stored(&mut m, &l.result, out.dtype);
            // An output has no broadcast dims: dropping its size-1 dims is a reshape.
            debug_assert_eq!(kept.len(), view.sizes.len());
            let r = m.reshape(&r, &view.sizes);
            store(&mut m, &mut cur, &mut inputs, &bufs, gb, &view, &r);
            continue;
        };
        if p.empty {
            continue;
        }
        let (body, tys) = emit::function(&part.region, &p.sig, "PART");
        let next = format!("part{}", functions.len());
        let name = functions.entry(body.clone()).or_insert_with(|| {
            text.push_str(&body.replacen("@PART(", &format!("@{next}("), 1));
            next.clone()
        });
        let name = name.clone();
        let mut args: Vec<Val> = Vec::new();
        for &j in &p.inputs {
            let t = &pb.operands[j];
            let unread = matches!(*part.region, Region::Matmul { .. })
                && j == pb.n_inputs
                && f64::from_bits(pb.scalars[1]) == 0.0;
            if unread {
                // beta is 0: the program never reads the old output.
                let dims = p.sig.operands[j].staged_dims(&p.sig);
                args.push(m.fconst(0.0, Ty::new(Elem::of(t.dtype), &dims)));
                continue;
            }
            let buf = value(
                &mut m,
                &mut cur,
                &mut inputs,
                &bufs,
                part.operands[j] as usize,
            );
            args.push(View::of(p, j, t).read(&mut m, &buf));
        }
        for &(a, i) in &at[k] {
            let s = m.slice(&arrays[a], i, i + 1);
            args.push(m.reshape(&s, &[]));
        }
        // The valid sizes: constants, or from the launch's batch in a bucketed module.
        let no_batch = vec![0; p.valid.len()];
        let c = coeffs[k].first().unwrap_or(&no_batch);
        if let Region::Loop(l) = &*part.region {
            if !l.reduces.is_empty() {
                let last = p.valid.len() - 1;
                let n = graph_bucket::valid_size(&mut m, p.valid[last], c[last], batch.as_ref());
                args.push(n);
            }
        }
        args.push(graph_bucket::valid_sizes(
            &mut m,
            &p.valid,
            c,
            batch.as_ref(),
        ));
        let refs: Vec<&Val> = args.iter().collect();
        let results = m.call(&name, &refs, &tys);
        let t = taint.of(p.inputs.iter().map(|&j| part.operands[j] as usize));
        for (r, &j) in results.iter().zip(&p.outputs) {
            let r = &stored(&mut m, r, pb.operands[j].dtype);
            let gb = part.operands[j] as usize;
            let view = View::of(p, j, &pb.operands[j]);
            taint.write(gb, &t, view.covers(bufs.len[gb]));
            store(&mut m, &mut cur, &mut inputs, &bufs, gb, &view, r);
        }
    }
    let mut results = Vec::new();
    let mut outputs = Vec::new();
    let mut output_checks = Vec::new();
    let mut donate = Vec::new();
    for j in g.n_inputs..g.operands.len() {
        let gb = g.operands[j] as usize;
        let n = bufs.len[gb];
        if n == 0 {
            continue;
        }
        let v = value(&mut m, &mut cur, &mut inputs, &bufs, gb);
        if let Some(arg) = bufs.input[gb].and_then(|i| inputs.iter().position(|&x| x == i)) {
            donate.push((
                arrays.len() + arg,
                format!("tf.aliasing_output = {} : i32", results.len()),
            ));
        }
        results.push(m.reshape(&v, &flat_dims(n)));
        outputs.push(j);
        output_checks.push(taint.0[gb].clone());
    }
    if !flags.is_empty() {
        let refs: Vec<&Val> = flags.iter().collect();
        let ty = Ty::new(Elem::I64, &[graph_kernel::CHECK_WORDS * flags.len()]);
        results.push(m.op("concatenate", &refs, "dimension = 0 : i64", ty));
    }
    let main = m.function("main", &results, &donate);
    let module = format!("module {{\n{text}{main}}}\n");
    let lens = g.operands.iter().map(|&gb| bufs.len[gb as usize]).collect();
    Ok((
        module,
        Layout {
            scalars,
            inputs,
            lens,
            outputs,
            checks,
            output_checks,
        },
    ))
}
