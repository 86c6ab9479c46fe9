//! The differential check of a generated [`Program`]:
//!
//! * A strict-mode "trace" run reads every buffer after every instruction. Each op's result is
//!   compared with the reference applied to the values its inputs had just before (so a
//!   transcendental's ulp never snowballs through later ops), with the tolerances of
//!   `ops_vs_reference.rs`; every byte the op must not write is checked unchanged (aliases,
//!   garbage between strided elements, other buffers), and every view reads what the reference
//!   layout says.
//! * Strict, debug and defer (with random host reads, releases and mode switches mid-program)
//!   must then read exactly the trace run's bytes at every sync point and for every live tensor
//!   at the end, and a second run on the same defer runtime (reused plans) the same bytes again.

use super::exec::{run_mode, run_on, Exec};
use super::*;
use crate::harness::*;
use crate::reference::reduce::reduce;
use crate::reference::{apply, unary_is_exact, Arg, RefTensor};
use deferfuse::{DType, Mode, Op, ReduceOp, UnaryOp};

const PROD: Tol = Tol {
    rel: 1e-4,
    abs: 1e-30,
    scaled: 0.0,
};

fn max_tol(a: Tol, b: Tol) -> Tol {
    Tol {
        rel: a.rel.max(b.rel),
        abs: a.abs.max(b.abs),
        scaled: a.scaled.max(b.scaled),
    }
}

/// Rounding twice (int -> f32 -> f16/bf16) can land one ulp away.
fn cast_tol(from: DType, to: DType) -> Tol {
    let twice = matches!(to, DType::F16 | DType::BF16)
        && matches!(from, DType::I32 | DType::I64 | DType::F64);
    float_tol(to, !twice)
}

/// The reference result of an op instruction, its tolerance and accumulation scale, and where
/// it is written (`None`: a new buffer).
pub fn expected(
    ins: &Ins,
    slots: &[SlotInfo],
    model: &[RefTensor],
) -> Option<(RefTensor, Tol, Option<RefTensor>, Option<usize>)> {
    let val = |s: usize| slots[s].layout.gather(&model[slots[s].storage]);
    let vals: Vec<RefTensor>;
    let (r, tol, scale, into) = match ins {
        Ins::Unary(u, s, into) => {
            let r = apply(&Op::Unary(*u), &[Arg::T(&val(*s))]);
            let mut tol = float_tol(r.dtype, unary_is_exact(*u));
            if *u == UnaryOp::GeluErf && r.dtype == DType::F64 {
                // x * (1 + erf(x / sqrt 2)) / 2 cancels for x << 0: a few ulp of erf near -1
                // (in the runtime's erf and in the reference's own series) become ~1e-11
                // relative error of a ~1e-4 result. Bound it absolutely instead.
                tol = max_tol(tol, Tol { abs: 1e-13, ..tol });
            }
            (r, tol, None, *into)
        }
        Ins::Binary(b, s, o, into) => {
            vals = vec![
                val(*s),
                if let Other::Slot(x) = o {
                    val(*x)
                } else {
                    val(*s)
                },
            ];
            let y = match o {
                Other::Slot(_) => Arg::T(&vals[1]),
                Other::Scalar(v) => Arg::S(*v),
            };
            let r = apply(&Op::Binary(*b), &[Arg::T(&vals[0]), y]);
            use deferfuse::BinaryOp::{Atan2, Pow};
            let tol = float_tol(r.dtype, !matches!(b, Pow | Atan2));
            (r, tol, None, *into)
        }
        Ins::Where(c, x, o) => {
            vals = vec![
                val(*c),
                val(*x),
                if let Other::Slot(y) = o {
                    val(*y)
                } else {
                    val(*x)
                },
            ];
            let y = match o {
                Other::Slot(_) => Arg::T(&vals[2]),
                Other::Scalar(v) => Arg::S(*v),
            };
            (
                apply(&Op::Where, &[Arg::T(&vals[0]), Arg::T(&vals[1]), y]),
                EXACT,
                None,
                None,
            )
        }
        Ins::Clamp(s, lo, hi) => {
            let f = |v: &Option<f64>| v.map_or(Arg::Absent, |v| Arg::S(Scalar::Float(v)));
            (
                apply(&Op::Clamp, &[Arg::T(&val(*s)), f(lo), f(hi)]),
                EXACT,
                None,
                None,
            )
        }
        Ins::Cast(s, d) => {
            let x = val(*s);
            (
                apply(&Op::Cast(*d), &[Arg::T(&x)]),
                cast_tol(x.dtype, *d),
                None,
                None,
            )
        }
        Ins::Reduce(op, s, dims, k) => {
            let x = val(*s);
            let r = reduce(*op, &x, dims, *k);
            let float = x.dtype.is_float();
            let (tol, scale) = match op {
                ReduceOp::Sum | ReduceOp::Mean if float => (
                    accum_tol(x.dtype),
                    Some(reduce(*op, &x.abs_f64(), dims, *k)),
                ),
                // Products accumulate in f32 (or f64), one rounding per factor; the final
                // rounding to f16/bf16 can then land one ulp from the reference's single one.
                ReduceOp::Prod if float => (max_tol(PROD, float_tol(x.dtype, false)), None),
                _ => (EXACT, None),
            };
            (r, tol, scale, None)
        }
        _ => return None,
    };
    match into {
        Some(t) => {
            let d = slots[t].dtype;
            let tol = max_tol(tol, cast_tol(r.dtype, d));
            let tol = if tol == EXACT {
                tol
            } else {
                max_tol(tol, float_tol(d, false))
            };
            Some((r.cast(d), tol, scale, Some(t)))
        }
        None => Some((r, tol, scale, None)),
    }
}

/// The strict-mode trace run: checks every instruction against the reference; returns the
/// mismatches, the host reads and the final live slots.
pub fn trace_run(p: &Program) -> (Vec<String>, Vec<Raw>, Vec<(usize, Raw)>) {
    let rt = runtime(Mode::Strict);
    let (mut e, mut model) = Exec::new(&rt, p, false);
    let mut fails = Vec::new();
    let mut syncs = Vec::new();
    for (k, ins) in p.ins.iter().enumerate() {
        let want = expected(ins, &e.slots, &model);
        let n_storages = e.bases.len();
        if let Some(r) = e.step(ins) {
            syncs.push(r);
        }
        let ctx = format!("#{k} {ins:?}");
        let storages: Vec<RefTensor> = e.bases.iter().map(|&b| download(&rt, b)).collect();
        if let Some((r, tol, scale, into)) = &want {
            let (slot, storage) = match *into {
                Some(t) => (t, e.slots[t].storage),
                None => (e.slots.len() - 1, n_storages),
            };
            let l = &e.slots[slot].layout;
            if let Err(m) = compare(&ctx, &l.gather(&storages[storage]), r, *tol, scale.as_ref()) {
                fails.push(m);
            }
            // The op wrote its view and nothing else.
            let mut untouched = storages[storage].clone();
            if storage < n_storages {
                l.scatter(&mut untouched, &l.gather(&model[storage]));
                if let Err(m) = compare(
                    &format!("{ctx}: outside the written view"),
                    &untouched,
                    &model[storage],
                    EXACT,
                    None,
                ) {
                    fails.push(m);
                }
            }
        }
        for (s, (got, old)) in storages.iter().zip(&model).enumerate() {
            let written = matches!(&want, Some((_, _, _, Some(t))) if e.slots[*t].storage == s);
            if !written {
                if let Err(m) =
                    compare(&format!("{ctx}: buffer {s} changed"), got, old, EXACT, None)
                {
                    fails.push(m);
                }
            }
        }
        if let Ins::View(..) = ins {
            let v = e.slots.last().unwrap();
            let got = download(&rt, *e.handles.last().unwrap());
            if let Err(m) = compare(
                &format!("{ctx}: view reads"),
                &got,
                &v.layout.gather(&storages[v.storage]),
                EXACT,
                None,
            ) {
                fails.push(m);
            }
        }
        model = storages;
    }
    let finals = e.finals();
    (fails, syncs, finals)
}

pub fn check_program(p: &Program) {
    let (fails, syncs, finals) = trace_run(p);
    assert!(
        fails.is_empty(),
        "reference mismatches in {p:#?}:\n{}",
        fails.join("\n")
    );
    for mode in MODES {
        let (s, f) = run_mode(p, mode);
        assert!(
            s == syncs,
            "{mode:?}: host reads differ from the trace run in {p:#?}\n{s:?}\nvs\n{syncs:?}"
        );
        for ((slot, a), (_, b)) in f.iter().zip(&finals) {
            assert!(
                a == b,
                "{mode:?}: slot {slot} differs at the end of {p:#?}:\n{:?}\nvs\n{:?}",
                RefTensor::from_bytes(a.0, &a.1, &a.2),
                RefTensor::from_bytes(b.0, &b.1, &b.2)
            );
        }
        assert_eq!(f.len(), finals.len());
    }
    // The same program again on one defer runtime: the second run's flushes reuse the first
    // run's plans (new buffers, same structure) and must give the same bytes.
    let rt = runtime(Mode::Defer);
    let first = run_on(&rt, p);
    let second = run_on(&rt, p);
    assert!(
        first == second,
        "a reused plan changed the results of {p:#?}"
    );
}
