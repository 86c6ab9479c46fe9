//! Random op programs for `random_graphs.rs`, `fuzz_differential.rs` and the cargo-fuzz target
//! (`fuzz/`): a few inputs of any dtype and broadcast-compatible shapes (every dim is 1 or n,
//! rank <= 3, some strided), then ops chosen from raw choices against the program's state so
//! that every op is valid: elementwise ops with tensor or scalar operands, reductions, views
//! (transpose, permute, select, slice with a step, expand, squeeze, unsqueeze, as_strided),
//! in-place writes (also through views and aliases, which later reads see), host reads and
//! flushes mid-program, releases, and switches of the thread's mode.
//!
//! [`from_bytes`] decodes the same raw choices from arbitrary bytes (for cargo-fuzz); `check`
//! runs a program in every mode against the reference.
#![allow(dead_code)]
// `x % k == 0` reads best here; `is_multiple_of` needs Rust 1.87 and the workspace targets 1.85.
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

pub mod check;
pub mod exec;

use crate::harness::Rng;
use crate::reference::views::RefLayout;
use crate::reference::{broadcast_shapes, RefTensor};
use deferfuse::fusion::ir::{infer, ArgMeta};
use deferfuse::{BinaryOp, DType, Mode, Op, ReduceOp, Scalar, UnaryOp};

/// The second operand of a binary op.
#[derive(Clone, Copy, Debug)]
pub enum Other {
    Slot(usize),
    Scalar(Scalar),
}

/// A view of a slot, with the runtime's arguments.
#[derive(Clone, Debug)]
pub enum ViewKind {
    Transpose,
    Select {
        dim: usize,
        index: usize,
    },
    Unsqueeze(usize),
    SqueezeAll,
    /// Expand every size-1 dim (and a 0-dim tensor) to n; other sizes stay.
    ExpandToN,
    /// `[k:k+1]` along `dim`.
    Narrow {
        dim: usize,
        start: usize,
    },
    /// `[:]` along dim 0: a new handle aliasing the same elements.
    Alias,
    /// `[start::2]` along `dim`.
    SliceStep {
        dim: usize,
        start: usize,
    },
    /// `permute` reversing the dims (rank 3).
    Reverse,
    /// `as_strided` onto the main diagonal of a square 2-D slot (strides summed).
    Diagonal,
    /// `as_strided` flattening a contiguous slot to one dim.
    Flatten,
}

#[derive(Clone, Debug)]
pub enum Ins {
    /// `out` = op(...): a new slot; `target` = Some(slot) writes in place instead.
    Unary(UnaryOp, usize, Option<usize>),
    Binary(BinaryOp, usize, Other, Option<usize>),
    Where(usize, usize, Other),
    Clamp(usize, Option<f64>, Option<f64>),
    Cast(usize, DType),
    Reduce(ReduceOp, usize, Vec<usize>, bool),
    View(usize, ViewKind),
    /// Read a slot to the host mid-program.
    Sync(usize),
    /// `synchronize` the stream: everything pending runs.
    Flush,
    /// Release a slot's handle; it is never used again.
    Release(usize),
    /// Switch the thread's mode (the trace run ignores it).
    Mode(Mode),
}

/// A program: the inputs (values, strided?) and the instructions.
#[derive(Clone, Debug)]
pub struct Program {
    pub n: usize,
    pub inputs: Vec<(RefTensor, bool)>,
    pub ins: Vec<Ins>,
}

/// What generation (and execution) knows of a slot.
#[derive(Clone, Debug)]
pub struct SlotInfo {
    pub dtype: DType,
    pub layout: RefLayout,
    pub storage: usize,
    pub alive: bool,
}

impl SlotInfo {
    pub fn sizes(&self) -> &[usize] {
        &self.layout.sizes
    }

    /// Two indices name one element (an expanded view): not writable.
    pub fn overlaps(&self) -> bool {
        self.layout
            .sizes
            .iter()
            .zip(&self.layout.strides)
            .any(|(&s, &st)| s > 1 && st == 0)
    }
}

/// PyTorch's can_cast: a result may be written into a tensor of the same or a higher category.
pub fn can_cast(from: DType, to: DType) -> bool {
    let cat = |d: DType| match d {
        DType::Bool => 0,
        d if d.is_float() => 2,
        _ => 1,
    };
    cat(from) <= cat(to)
}

/// The storage layout of input `i` and the view the program sees (every other element of a
/// buffer twice as wide when `strided`).
pub fn input_layouts(t: &RefTensor, strided: bool) -> (Vec<usize>, RefLayout) {
    if strided && t.rank() >= 1 {
        let mut big = t.sizes.clone();
        *big.last_mut().unwrap() *= 2;
        let l = RefLayout::contiguous(&big).slice(-1, 0, 2 * t.sizes[t.rank() - 1] as i64, 2);
        (big, l)
    } else {
        (t.sizes.clone(), RefLayout::contiguous(&t.sizes))
    }
}

/// Builds a valid program from raw choices.
pub fn build(
    n: usize,
    seed: u64,
    specs: &[(u8, bool, bool)],
    raw: &[(u8, u32, u32, u32)],
) -> Program {
    let mut rng = Rng::new(seed);
    let shape_of = |k: u8| -> Vec<usize> {
        match k % 9 {
            0 => vec![n, n],
            1 => vec![1, n],
            2 => vec![n, 1],
            3 => vec![n],
            4 => vec![],
            5 => vec![n, 1, n],
            6 => vec![1, n, n],
            7 => vec![n, n, 1],
            _ => vec![n, n, n],
        }
    };
    // A quarter of the inputs are f32 or i32 (the `int` flag), the rest any other dtype.
    let dtype_of = |k: u8, int: bool| match (k / 9) % 8 {
        0 | 1 if int => DType::I32,
        0 | 1 => DType::F32,
        d => [
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I64,
            DType::U8,
            DType::Bool,
        ][d as usize - 2],
    };
    let mut inputs = Vec::new();
    let mut slots: Vec<SlotInfo> = Vec::new();
    for (i, &(k, int, strided)) in specs.iter().enumerate() {
        let sizes = shape_of(k);
        let dtype = dtype_of(k, int);
        let specials = seed % 4 == 0;
        let t = rng.tensor(dtype, &sizes, 6.0, 9, specials);
        let (_, layout) = input_layouts(&t, strided);
        slots.push(SlotInfo {
            dtype,
            layout,
            storage: i,
            alive: true,
        });
        inputs.push((t, strided));
    }
    let mut storages = specs.len();
    let mut ins = Vec::new();
    for &(kind, a, b, c) in raw {
        let alive: Vec<usize> = (0..slots.len()).filter(|&s| slots[s].alive).collect();
        if alive.is_empty() {
            break;
        }
        let pick = |x: u32, from: &[usize]| from[x as usize % from.len()];
        let s = pick(a, &alive);
        let si = slots[s].clone();
        let new_slot = |dtype: DType, sizes: &[usize], storages: &mut usize| {
            *storages += 1;
            SlotInfo {
                dtype,
                layout: RefLayout::contiguous(sizes),
                storage: *storages - 1,
                alive: true,
            }
        };
        let next: Option<(Ins, Option<SlotInfo>)> = match kind % 18 {
            0..=2 => {
                let ops: Vec<UnaryOp> = UnaryOp::ALL
                    .into_iter()
                    .filter(|&u| infer(&Op::Unary(u), &[meta_arg(&si)]).is_ok())
                    .collect();
                let u = ops[b as usize % ops.len()];
                let dtype = infer(&Op::Unary(u), &[meta_arg(&si)]).unwrap().dtype;
                Some((
                    Ins::Unary(u, s, None),
                    Some(new_slot(dtype, si.sizes(), &mut storages)),
                ))
            }
            3..=5 => binary(&slots, s, &alive, b, c, None).map(|(op, o, dtype, sizes)| {
                (
                    Ins::Binary(op, s, o, None),
                    Some(new_slot(dtype, &sizes, &mut storages)),
                )
            }),
            6 => {
                let bools: Vec<usize> = alive
                    .iter()
                    .copied()
                    .filter(|&x| slots[x].dtype == DType::Bool)
                    .collect();
                if bools.is_empty() {
                    let dtype = DType::Bool;
                    Some((
                        Ins::Binary(BinaryOp::Gt, s, Other::Scalar(Scalar::Float(0.0)), None),
                        Some(new_slot(dtype, si.sizes(), &mut storages)),
                    ))
                } else {
                    let cond = pick(b, &bools);
                    let y = if c % 3 == 0 {
                        Other::Scalar(Scalar::Float(-0.5))
                    } else {
                        Other::Slot(pick(c, &alive))
                    };
                    let args = [meta_arg(&slots[cond]), meta_arg(&si), other_arg(&slots, y)];
                    infer(&Op::Where, &args).ok().map(|inf| {
                        (
                            Ins::Where(cond, s, y),
                            Some(new_slot(inf.dtype, &inf.sizes, &mut storages)),
                        )
                    })
                }
            }
            7 => {
                let lo = [Some(-1.5), None, Some(0.0)][b as usize % 3];
                let hi = [Some(2.0), Some(0.5), None][c as usize % 3];
                let (lo, hi) = if lo.is_none() && hi.is_none() {
                    (Some(-1.0), None)
                } else {
                    (lo, hi)
                };
                let f = |v: Option<f64>| {
                    v.map_or(ArgMeta::Absent, |v| ArgMeta::Scalar(Scalar::Float(v)))
                };
                infer(&Op::Clamp, &[meta_arg(&si), f(lo), f(hi)])
                    .ok()
                    .map(|inf| {
                        (
                            Ins::Clamp(s, lo, hi),
                            Some(new_slot(inf.dtype, &inf.sizes, &mut storages)),
                        )
                    })
            }
            8 => {
                let to =
                    [DType::F32, DType::I32, DType::Bool, DType::F16, DType::I64][b as usize % 5];
                Some((
                    Ins::Cast(s, to),
                    Some(new_slot(to, si.sizes(), &mut storages)),
                ))
            }
            9 | 10 => {
                let rank = si.sizes().len();
                let dims = match (b % 3, rank) {
                    (0, _) | (_, 0) => vec![],
                    (1, _) => vec![0],
                    _ => vec![rank - 1],
                };
                let keepdim = c % 2 == 0;
                // A float product of many factors overflows (or underflows) the compute dtype
                // part way, and then 0 * inf = NaN depends on the order of the factors, in
                // PyTorch as here; the f64 reference never overflows. Keep products short.
                let reduced: usize = match dims.first() {
                    Some(&d) => si.sizes()[d],
                    None => si.sizes().iter().product(),
                };
                let ops: Vec<ReduceOp> = ReduceOp::ALL
                    .into_iter()
                    .filter(|&r| {
                        let ok_prod = r != ReduceOp::Prod
                            || si.dtype == DType::Bool
                            || si.dtype.is_float() && reduced <= 16;
                        ok_prod && infer(&red_op(r, &dims, keepdim), &[meta_arg(&si)]).is_ok()
                    })
                    .collect();
                let r = ops[(b / 3) as usize % ops.len()];
                let inf = infer(&red_op(r, &dims, keepdim), &[meta_arg(&si)]).unwrap();
                Some((
                    Ins::Reduce(r, s, dims, keepdim),
                    Some(new_slot(inf.dtype, &inf.sizes, &mut storages)),
                ))
            }
            11 | 12 => view_kind(&si, n, b, c).map(|v| {
                let layout = apply_view(&si.layout, &v, n);
                let slot = SlotInfo {
                    layout,
                    ..si.clone()
                };
                (Ins::View(s, v), Some(slot))
            }),
            13 | 16 => {
                // In place: a unary op or a binary op with an operand that broadcasts into it.
                let writable: Vec<usize> = alive
                    .iter()
                    .copied()
                    .filter(|&x| !slots[x].overlaps())
                    .collect();
                if writable.is_empty() {
                    None
                } else {
                    let t = pick(b, &writable);
                    let ti = &slots[t];
                    if c % 2 == 0 {
                        let ops: Vec<UnaryOp> = UnaryOp::ALL
                            .into_iter()
                            .filter(|&u| {
                                infer(&Op::Unary(u), &[meta_arg(ti)])
                                    .is_ok_and(|inf| can_cast(inf.dtype, ti.dtype))
                            })
                            .collect();
                        (!ops.is_empty()).then(|| {
                            (
                                Ins::Unary(ops[(c / 2) as usize % ops.len()], t, Some(t)),
                                None,
                            )
                        })
                    } else {
                        binary(&slots, t, &alive, a, c / 2, Some(t))
                            .map(|(op, o, _, _)| (Ins::Binary(op, t, o, Some(t)), None))
                    }
                }
            }
            14 if b % 4 == 0 => Some((Ins::Flush, None)),
            14 => Some((Ins::Sync(s), None)),
            17 => Some((
                Ins::Mode([Mode::Strict, Mode::Debug, Mode::Defer][b as usize % 3]),
                None,
            )),
            _ => (alive.len() > 2).then_some((Ins::Release(s), None)),
        };
        if let Some((i, slot)) = next {
            if let Ins::Release(r) = i {
                slots[r].alive = false;
            }
            if let Some(sl) = slot {
                slots.push(sl);
            }
            // An in-place write is often read through another alive view of its buffer, right
            // before or right after it: the reads must see the old and the new values.
            let alias = match i {
                Ins::Unary(_, _, Some(t)) | Ins::Binary(_, _, _, Some(t)) => (0..slots.len())
                    .filter(|&x| x != t && slots[x].alive && slots[x].storage == slots[t].storage)
                    .nth(c as usize % 4),
                _ => None,
            };
            match (alias, a % 3) {
                (Some(x), 0) => ins.extend([Ins::Sync(x), i]),
                (Some(x), 1) => ins.extend([i, Ins::Sync(x)]),
                _ => ins.push(i),
            }
        }
    }
    Program { n, inputs, ins }
}

pub fn red_op(r: ReduceOp, dims: &[usize], keepdim: bool) -> Op {
    Op::Reduce {
        op: r,
        dims: dims.iter().copied().collect(),
        keepdim,
    }
}

/// What the record-time checker needs of a slot.
fn meta_arg(s: &SlotInfo) -> ArgMeta {
    ArgMeta::tensor(s.dtype, s.sizes())
}

fn other_arg(slots: &[SlotInfo], o: Other) -> ArgMeta {
    match o {
        Other::Slot(x) => meta_arg(&slots[x]),
        Other::Scalar(v) => ArgMeta::Scalar(v),
    }
}

/// A valid binary op of slot `s` with another slot or a scalar; with `into`, the result must
/// have that slot's shape and be castable to its dtype.
fn binary(
    slots: &[SlotInfo],
    s: usize,
    alive: &[usize],
    b: u32,
    c: u32,
    into: Option<usize>,
) -> Option<(BinaryOp, Other, DType, Vec<usize>)> {
    let scalars = [
        Scalar::Float(1.5),
        Scalar::Float(-0.25),
        Scalar::Int(2),
        Scalar::Int(-3),
        Scalar::Bool(true),
    ];
    let other = if c % 4 == 0 {
        Other::Scalar(scalars[(c / 4) as usize % scalars.len()])
    } else {
        let fits: Vec<usize> = alive
            .iter()
            .copied()
            .filter(|&x| {
                into.is_none_or(|t| {
                    broadcast_shapes(&[slots[t].sizes(), slots[x].sizes()]).as_deref()
                        == Some(slots[t].sizes())
                })
            })
            .collect();
        Other::Slot(fits[(c / 4) as usize % fits.len()])
    };
    let args = [meta_arg(&slots[s]), other_arg(slots, other)];
    let ops: Vec<(BinaryOp, DType, Vec<usize>)> = BinaryOp::ALL
        .into_iter()
        .filter_map(|op| {
            let inf = infer(&Op::Binary(op), &args).ok()?;
            // Integer products and powers outgrow what an f64 holds exactly in int64.
            let int_growth = !inf.compute.is_float() && matches!(op, BinaryOp::Pow)
                || inf.compute == DType::I64 && op == BinaryOp::Mul;
            let fits = into.is_none_or(|t| can_cast(inf.dtype, slots[t].dtype));
            (!int_growth && fits).then(|| (op, inf.dtype, inf.sizes.to_vec()))
        })
        .collect();
    if ops.is_empty() {
        return None;
    }
    let (op, dtype, sizes) = ops[b as usize % ops.len()].clone();
    Some((op, other, dtype, sizes))
}

fn view_kind(si: &SlotInfo, n: usize, b: u32, c: u32) -> Option<ViewKind> {
    let sizes = si.sizes();
    let rank = sizes.len();
    let options: Vec<ViewKind> = [
        (rank == 2).then_some(ViewKind::Transpose),
        (rank >= 1).then(|| {
            let dim = c as usize % rank;
            ViewKind::Select {
                dim,
                index: (c as usize / 2) % sizes[dim],
            }
        }),
        (rank <= 1).then_some(ViewKind::Unsqueeze(c as usize % (rank + 1))),
        (sizes.contains(&1)).then_some(ViewKind::SqueezeAll),
        (n > 1 && (rank == 0 || sizes.contains(&1))).then_some(ViewKind::ExpandToN),
        (rank >= 1 && sizes[c as usize % rank] > 1).then(|| {
            let dim = c as usize % rank;
            ViewKind::Narrow {
                dim,
                start: (c as usize / 3) % sizes[dim],
            }
        }),
        (rank >= 1).then_some(ViewKind::Alias),
        (rank >= 1 && sizes[c as usize % rank] > 2).then(|| {
            let dim = c as usize % rank;
            ViewKind::SliceStep {
                dim,
                start: (c as usize / 5) % 2,
            }
        }),
        (rank == 3).then_some(ViewKind::Reverse),
        (rank == 2 && sizes[0] == sizes[1] && !si.overlaps()).then_some(ViewKind::Diagonal),
        (rank >= 2 && si.layout.is_contiguous()).then_some(ViewKind::Flatten),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!options.is_empty()).then(|| options[b as usize % options.len()].clone())
}

/// The reference layout of a view (independent of the runtime's layout code).
pub fn apply_view(l: &RefLayout, v: &ViewKind, n: usize) -> RefLayout {
    match v {
        ViewKind::Transpose => l.transpose(0, 1),
        ViewKind::Select { dim, index } => l.select(*dim as i64, *index as i64),
        ViewKind::Unsqueeze(d) => l.unsqueeze(*d),
        ViewKind::SqueezeAll => l.squeeze(None),
        ViewKind::ExpandToN => l.expand(&expand_target(&l.sizes, n)),
        ViewKind::Narrow { dim, start } => {
            l.slice(*dim as i64, *start as i64, *start as i64 + 1, 1)
        }
        ViewKind::Alias => l.slice(0, 0, l.sizes[0] as i64, 1),
        ViewKind::SliceStep { dim, start } => {
            l.slice(*dim as i64, *start as i64, l.sizes[*dim] as i64, 2)
        }
        ViewKind::Reverse => l.permute(&[2, 1, 0]),
        ViewKind::Diagonal => RefLayout {
            sizes: vec![l.sizes[0]],
            strides: vec![l.strides[0] + l.strides[1]],
            offset: l.offset,
        },
        ViewKind::Flatten => RefLayout {
            sizes: vec![l.sizes.iter().product()],
            strides: vec![1],
            offset: l.offset,
        },
    }
}

/// What `ExpandToN` expands `sizes` to: every size-1 dim (or a 0-dim tensor) to n, the rest
/// kept (slices and flattened views make sizes other than 1 and n).
pub fn expand_target(sizes: &[usize], n: usize) -> Vec<usize> {
    if sizes.is_empty() {
        return vec![n];
    }
    sizes.iter().map(|&s| if s == 1 { n } else { s }).collect()
}

/// The `as_strided` arguments (sizes, strides, offset) of an as_strided view kind.
pub fn as_strided_args(v: &ViewKind, l: &RefLayout, n: usize) -> (Vec<i64>, Vec<i64>, i64) {
    let r = apply_view(l, v, n);
    let i = |x: &[usize]| x.iter().map(|&v| v as i64).collect();
    (i(&r.sizes), i(&r.strides), r.offset as i64)
}

/// Decodes a program from arbitrary bytes (cargo-fuzz input): n, a seed, 1 to 4 input specs,
/// then 13 bytes per instruction choice (at most 32).
pub fn from_bytes(data: &[u8]) -> Program {
    let mut it = data.iter().copied();
    let mut byte = || it.next().unwrap_or(0);
    let n = [1usize, 2, 3, 4, 5, 7, 9][byte() as usize % 7];
    let seed = u64::from_le_bytes(std::array::from_fn(|_| byte()));
    let n_specs = 1 + byte() as usize % 4;
    let specs: Vec<(u8, bool, bool)> = (0..n_specs)
        .map(|_| (byte(), byte() % 2 == 1, byte() % 2 == 1))
        .collect();
    let rest = data.len().saturating_sub(10 + 3 * n_specs);
    let word = |b: &mut dyn FnMut() -> u8| u32::from_le_bytes(std::array::from_fn(|_| b()));
    let raw: Vec<(u8, u32, u32, u32)> = (0..(rest / 13).min(32))
        .map(|_| (byte(), word(&mut byte), word(&mut byte), word(&mut byte)))
        .collect();
    build(n, seed, &specs, &raw)
}
