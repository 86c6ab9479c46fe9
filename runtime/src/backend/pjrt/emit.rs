//! Emitting StableHLO: a region plus a bucketed [`Signature`] becomes one StableHLO module (entry
//! `@main`); XLA fuses inside it.
//!
//! Arguments are the staged operands (each a dense array of its non-broadcast dims, see
//! `stage`), then the scalar slots as 0-d tensors, then, for row kernels, the valid length of
//! the reduced dim (so padding to the bucket is masked out of every reduction), then the valid
//! size of every dim of the space (a 1-D i64 array). Results are the outputs in operand order,
//! each as a dense array of its own present dims whose padding is zero.
//!
//! Zero padding on output is what lets a result stay on the device as its buffer's value: it
//! is then exactly the array an upload of the host bytes would stage (`stage::gather` pads with
//! zeros), so a later matmul contracting over a padded dim, or anything else that relies on the
//! padding of an input being zero, sees the same thing either way. The select fuses into the
//! producer and costs no extra pass.

use super::hlo::{Elem, Func, Ty, Val};
use super::ops::{binary, cast, pred, unary};
use super::stage::{DenseKey, Signature};
use deferfuse_fusion::ir::{DType, ReduceOp};
use deferfuse_fusion::region::{InstrKind, LoopRegion};
use deferfuse_fusion::Region;

/// An operand's staged argument, broadcast to its full (bucketed) dims.
fn operand_arg(f: &mut Func, sig: &Signature, j: usize, dtype: DType) -> Val {
    let o = &sig.operands[j];
    let staged: Vec<usize> = o.staged_dims(sig);
    let arg = f.arg(Ty::new(Elem::of(dtype), &staged));
    let full: Vec<usize> = o.map.iter().map(|&d| sig.space[d]).collect();
    let present: Vec<usize> = (0..o.map.len()).filter(|&d| o.present[d]).collect();
    f.broadcast(&arg, &full, &present)
}

/// A result for operand `j` from its full-dims value `v`: broadcast dims dropped.
fn operand_result(f: &mut Func, sig: &Signature, j: usize, v: &Val) -> Val {
    let o = &sig.operands[j];
    let absent: Vec<usize> = (0..o.map.len()).filter(|&d| !o.present[d]).collect();
    let v = if absent.is_empty() {
        v.clone()
    } else {
        f.slice_first(v, &absent)
    };
    f.reshape(&v, &o.staged_dims(sig))
}

/// Zeroes the padding of result `v` of operand `j`: every element whose index along a staged
/// dim is at or past that dim's valid size (an element of the `valid` argument).
fn zero_padding(f: &mut Func, sig: &Signature, j: usize, v: &Val, valid: &Val) -> Val {
    if sig.exact {
        return v.clone();
    }
    let o = &sig.operands[j];
    let space_dims: Vec<usize> = (0..o.map.len())
        .filter(|&d| o.present[d])
        .map(|d| o.map[d])
        .collect();
    let dims = v.ty.dims.clone();
    let mut keep: Option<Val> = None;
    for (axis, &d) in space_dims.iter().enumerate() {
        if dims[axis] <= 1 {
            continue;
        }
        let n = f.slice(valid, d, d + 1);
        let n = f.reshape(&n, &[]);
        let n = f.broadcast(&n, &dims, &[]);
        let idx = f.iota(axis, Ty::new(Elem::I64, &dims));
        let inside = f.compare("LT", &idx, &n);
        keep = Some(match keep {
            None => inside,
            Some(k) => f.ew("and", &[&k, &inside]),
        });
    }
    match keep {
        None => v.clone(),
        Some(k) => {
            let zero = f.fconst(0.0, v.ty.clone());
            f.select(&k, v, &zero)
        }
    }
}

/// The module that turns the device array `from` into `to`: the same buffer value staged with
/// other dims (e.g. a loop over the flat buffer produced it and a row kernel reads it as rows).
/// Compiled for exact sizes: valid part, row-major reshape, zero padding.
pub fn relayout(from: &DenseKey, to: &DenseKey) -> String {
    let mut f = Func::default();
    let e = Elem::of(from.dtype);
    let x = f.arg(Ty::new(e, &from.padded));
    let v = f.take(&x, &from.valid);
    let v = f.reshape(&v, &to.valid);
    let v = f.pad_zeros(&v, &to.padded);
    f.finish(&[v])
}

/// The module for `region` at `sig`.
pub fn module(region: &Region, sig: &Signature) -> String {
    let (f, results) = body(region, sig);
    f.finish(&results)
}

/// `region` at `sig` as function `@name`, for a module that calls several (a whole program,
/// see `graph`): its text and its result types. Its arguments are `module`'s.
pub fn function(region: &Region, sig: &Signature, name: &str) -> (String, Vec<Ty>) {
    let (f, results) = body(region, sig);
    let tys = results.iter().map(|v| v.ty.clone()).collect();
    (f.function(name, &results, &[]), tys)
}

/// The body of `region` at `sig`: its arguments declared, its results computed.
fn body(region: &Region, sig: &Signature) -> (Func, Vec<Val>) {
    let mut f = Func::default();
    let results = match region {
        Region::Loop(l) => {
            let n_in = l.inputs.len();
            let loads: Vec<Val> = (0..n_in)
                .map(|j| operand_arg(&mut f, sig, j, l.inputs[j].dtype))
                .collect();
            let outs = loop_body(&mut f, l, sig, loads, 0);
            outs.iter()
                .enumerate()
                .map(|(i, v)| operand_result(&mut f, sig, n_in + i, v))
                .collect()
        }
        Region::Matmul { dtype, epilogue } => matmul(&mut f, *dtype, epilogue.as_deref(), sig),
        Region::Kernel(_) => {
            unreachable!("kernel regions run as host programs (see PjrtBackend::compile)")
        }
        Region::Graph(_) => unreachable!("a graph lowers part by part (see `graph`)"),
        Region::Arange { dtype } => {
            let n = sig.space[0];
            // Integer dtypes compute in i64 from i64 start and step, half types in f32 (CPU's
            // `acc_type`s; the CPU backend's `ArangeProgram` too), the rest in f64.
            let (arg, elem, compute) = match dtype {
                d if Region::arange_in_integers(*d) => (Elem::I64, Elem::I64, DType::I64),
                DType::F16 | DType::BF16 => (Elem::F64, Elem::F32, DType::F32),
                _ => (Elem::F64, Elem::F64, DType::F64),
            };
            let ty = Ty::new(arg, &[]);
            let start = f.arg(ty.clone());
            let step = f.arg(ty);
            let (start, step) = match compute {
                DType::F32 => (f.convert(&start, elem), f.convert(&step, elem)),
                _ => (start, step),
            };
            let i = f.iota(0, Ty::new(Elem::I64, &[n]));
            let i = f.convert(&i, elem);
            let start = f.broadcast(&start, &[n], &[]);
            let step = f.broadcast(&step, &[n], &[]);
            let m = f.ew("multiply", &[&i, &step]);
            let v = f.ew("add", &[&start, &m]);
            let v = cast(&mut f, &v, compute, *dtype);
            vec![operand_result(&mut f, sig, 0, &v)]
        }
    };
    // Results are the last operands, in order (see `stage::staging`).
    let valid = f.arg(Ty::new(Elem::I64, &[sig.space.len()]));
    let first = sig.operands.len() - results.len();
    let results: Vec<Val> = results
        .iter()
        .enumerate()
        .map(|(i, v)| zero_padding(&mut f, sig, first + i, v, &valid))
        .collect();
    (f, results)
}

/// Emits a loop body over `sig.space` (or the 2-D epilogue space), given its loads; returns
/// the element outputs (full dims, compute element of each output dtype) then the stored
/// reduction results (one per row).
fn loop_body(
    f: &mut Func,
    l: &LoopRegion,
    sig: &Signature,
    loads: Vec<Val>,
    first_scalar: usize,
) -> Vec<Val> {
    let dims = sig.space.clone();
    let r = dims.len();
    let params: Vec<Val> = l
        .params
        .iter()
        .map(|&d| {
            let p = f.arg(Ty::new(Elem::of(d), &[]));
            f.broadcast(&p, &dims, &[])
        })
        .collect();
    let _ = first_scalar;
    let n_valid = if l.reduces.is_empty() {
        None
    } else {
        Some(f.arg(Ty::new(Elem::I64, &[])))
    };
    let mut vals: Vec<Val> = Vec::with_capacity(l.body.len());
    let mut reduced: Vec<(Val, DType)> = Vec::new();
    for ins in &l.body {
        let v = match &ins.kind {
            InstrKind::Load(n) => loads[*n as usize].clone(),
            InstrKind::Param(p) => params[*p as usize].clone(),
            InstrKind::Unary(u, a) => unary(
                f,
                *u,
                &vals[*a as usize],
                l.body[*a as usize].dtype,
                ins.dtype,
            ),
            InstrKind::Binary(b, x, y) => binary(
                f,
                *b,
                &vals[*x as usize],
                &vals[*y as usize],
                l.body[*x as usize].dtype,
                ins.dtype,
            ),
            InstrKind::Where(c, x, y) => {
                let p = pred(f, &vals[*c as usize]);
                f.select(&p, &vals[*x as usize], &vals[*y as usize])
            }
            InstrKind::Cast(a) => cast(f, &vals[*a as usize], l.body[*a as usize].dtype, ins.dtype),
            InstrKind::Reduced(k) => {
                let k = *k as usize;
                while reduced.len() <= k {
                    let rk = &l.reduces[reduced.len()];
                    let d = l.body[rk.value as usize].dtype;
                    let n = n_valid.as_ref().expect("row kernels get a valid length");
                    reduced.push(reduce(f, rk.op, &vals[rk.value as usize], d, n, sig.exact));
                }
                let (v, d) = &reduced[k];
                let b = f.broadcast(v, &dims, &(0..r - 1).collect::<Vec<_>>());
                cast(f, &b, *d, ins.dtype)
            }
        };
        vals.push(v);
    }
    while reduced.len() < l.reduces.len() {
        let rk = &l.reduces[reduced.len()];
        let d = l.body[rk.value as usize].dtype;
        let n = n_valid.as_ref().expect("row kernels get a valid length");
        reduced.push(reduce(f, rk.op, &vals[rk.value as usize], d, n, sig.exact));
    }
    let mut out: Vec<Val> = l
        .outputs
        .iter()
        .map(|(v, o)| cast(f, &vals[*v as usize], l.body[*v as usize].dtype, o.dtype))
        .collect();
    for (rk, (v, d)) in l.reduces.iter().zip(&reduced) {
        if let Some(o) = &rk.output {
            // A per-row result, broadcast along the row like the CPU stores it (stride 0).
            let c = cast(f, v, *d, o.dtype);
            out.push(f.broadcast(&c, &dims, &(0..r - 1).collect::<Vec<_>>()));
        }
    }
    out
}

/// The identity of `op` for values of dtype `d` (the CPU backend's initial accumulator).
fn identity(f: &mut Func, op: ReduceOp, d: DType, ty: Ty) -> Val {
    if d.is_float() {
        let c = match op {
            ReduceOp::Sum | ReduceOp::Mean => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Amax | ReduceOp::Argmax => f64::NEG_INFINITY,
            _ => f64::INFINITY,
        };
        f.fconst(c, ty)
    } else {
        let (min, max) = if Elem::of(d) == Elem::I64 {
            (i64::MIN, i64::MAX)
        } else {
            (i32::MIN as i64, i32::MAX as i64)
        };
        let c = match op {
            ReduceOp::Sum | ReduceOp::Mean => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Amax | ReduceOp::Argmax => min,
            _ => max,
        };
        f.iconst(c, ty)
    }
}

/// Reduces `v` over its last dim with `op`, the padding beyond `n` masked to the identity.
/// Returns the per-row result and its dtype.
/// With `exact` the row has no padding, and nothing is masked.
fn reduce(f: &mut Func, op: ReduceOp, v: &Val, d: DType, n: &Val, exact: bool) -> (Val, DType) {
    let dims = v.ty.dims.clone();
    let r = dims.len();
    let idx = f.iota(r - 1, Ty::new(Elem::I64, &dims));
    let nb = f.broadcast(n, &dims, &[]);
    let valid = f.compare("LT", &idx, &nb);
    let scalar = Ty::new(v.ty.elem, &[]);
    let masked = if exact {
        v.clone()
    } else {
        let id_full = identity(f, op, d, v.ty.clone());
        f.select(&valid, v, &id_full)
    };
    let init = identity(f, op, d, scalar);
    if op.is_arg() {
        let big = f.iconst(i64::MAX, Ty::new(Elem::I64, &dims));
        let idx = f.select(&valid, &idx, &big);
        let init_i = f.iconst(i64::MAX, Ty::new(Elem::I64, &[]));
        let res = f.reduce(&[&masked, &idx], &[&init, &init_i], &[r - 1], |f, a| {
            arg_combine(f, op, &a[0], &a[1], &a[2], &a[3])
        });
        return (res[1].clone(), DType::I64);
    }
    let res = f.reduce(&[&masked], &[&init], &[r - 1], |f, a| {
        vec![fold(f, op, &a[0], &a[1])]
    });
    let mut out = res[0].clone();
    if op == ReduceOp::Mean {
        let nf = f.convert(n, v.ty.elem);
        let nf = f.broadcast(&nf, &out.ty.dims.clone(), &[]);
        out = f.ew("divide", &[&out, &nf]);
    }
    (out, d)
}

fn fold(f: &mut Func, op: ReduceOp, a: &Val, b: &Val) -> Val {
    let float = a.ty.elem.is_float();
    match op {
        ReduceOp::Sum | ReduceOp::Mean => f.ew("add", &[a, b]),
        ReduceOp::Prod => f.ew("multiply", &[a, b]),
        ReduceOp::Amax | ReduceOp::Amin if float => {
            // NaN propagates whichever side it is on.
            let c = f.compare(if op == ReduceOp::Amax { "GT" } else { "LT" }, a, b);
            let r = f.select(&c, a, b);
            let nan = f.compare("NE", a, a);
            f.select(&nan, a, &r)
        }
        ReduceOp::Amax => f.ew("maximum", &[a, b]),
        _ => f.ew("minimum", &[a, b]),
    }
}

/// Combines two (value, index) candidates: the extreme wins, NaN counts as the extreme, and
/// ties go to the lower index, so the first extreme of the row wins in any reduction order.
fn arg_combine(f: &mut Func, op: ReduceOp, a: &Val, ia: &Val, b: &Val, ib: &Val) -> Vec<Val> {
    let dir = if op == ReduceOp::Argmax { "GT" } else { "LT" };
    let b_better = f.compare(dir, b, a);
    let eq = f.compare("EQ", a, b);
    let lower = f.compare("LT", ib, ia);
    let tie_b = f.ew("and", &[&eq, &lower]);
    let mut take_b = f.ew("or", &[&b_better, &tie_b]);
    if a.ty.elem.is_float() {
        let a_nan = f.compare("NE", a, a);
        let b_nan = f.compare("NE", b, b);
        let both = f.ew("and", &[&a_nan, &b_nan]);
        let both_b = f.ew("and", &[&both, &lower]);
        let t = f.constant("true", a_nan.ty.clone());
        let not_a = f.ew("xor", &[&a_nan, &t]);
        let only_b = f.ew("and", &[&b_nan, &not_a]);
        let nan_b = f.ew("or", &[&only_b, &both_b]);
        let any_nan = f.ew("or", &[&a_nan, &b_nan]);
        take_b = f.select(&any_nan, &nan_b, &take_b);
    }
    vec![f.select(&take_b, b, a), f.select(&take_b, ib, ia)]
}

/// `out = alpha * (a @ b) + beta * out`, then the epilogue (2-D) on the result.
fn matmul(f: &mut Func, dtype: DType, epilogue: Option<&LoopRegion>, sig: &Signature) -> Vec<Val> {
    let e = Elem::of(dtype);
    let a = operand_arg(f, sig, 0, dtype);
    let b = operand_arg(f, sig, 1, dtype);
    let k_in = epilogue.map_or(0, |l| l.inputs.len());
    let e_loads: Vec<Val> = epilogue
        .map(|l| {
            (0..k_in)
                .map(|j| operand_arg(f, sig, 2 + j, l.inputs[j].dtype))
                .collect()
        })
        .unwrap_or_default();
    let out_j = 2 + k_in;
    let old = operand_arg(f, sig, out_j, dtype);
    let scalar = Ty::new(e, &[]);
    let alpha = f.arg(scalar.clone());
    let beta = f.arg(scalar);
    let nb = a.ty.dims.len() - 2;
    let batch: Vec<usize> = (0..nb).collect();
    let list = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut od = old.ty.dims.clone();
    od.truncate(nb);
    od.push(a.ty.dims[nb]);
    od.push(b.ty.dims[nb + 1]);
    let dims = format!(
        "#stablehlo.dot<lhs_batching_dimensions = [{}], rhs_batching_dimensions = [{}], \
         lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [{}]>",
        list(&batch),
        list(&batch),
        nb + 1,
        nb
    );
    let p = f.dot_general(&a, &b, &dims, Ty::new(e, &od));
    let al = f.broadcast(&alpha, &od, &[]);
    let be = f.broadcast(&beta, &od, &[]);
    let scaled = f.ew("multiply", &[&al, &p]);
    let bo = f.ew("multiply", &[&be, &old]);
    let sum = f.ew("add", &[&scaled, &bo]);
    // beta == 0 never reads `out` (it may hold anything, even NaN), like the GEMM.
    let zero = f.fconst(0.0, be.ty.clone());
    let no_beta = f.compare("EQ", &be, &zero);
    let v = f.select(&no_beta, &scaled, &sum);
    // The stored value: rounded to f16/bf16 like the CPU GEMM's store.
    let stored = cast(f, &v, DType::F32, dtype);
    let stored = if dtype.compute() == DType::F32 {
        stored
    } else {
        v
    };
    let mut results = vec![operand_result(f, sig, out_j, &stored)];
    if let Some(l) = epilogue {
        // The epilogue reads the matmul's output view; it sees the new values.
        let loads: Vec<Val> = e_loads
            .into_iter()
            .enumerate()
            .map(|(j, x)| {
                if sig.operands[2 + j].view == Some(true) {
                    stored.clone()
                } else {
                    x
                }
            })
            .collect();
        let esig = sig.epilogue_space();
        let outs = loop_body(f, l, &esig, loads, 2);
        for (i, v) in outs.iter().enumerate() {
            results.push(operand_result(f, sig, out_j + 1 + i, v));
        }
    }
    results
}
