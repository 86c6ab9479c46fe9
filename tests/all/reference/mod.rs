//! An independent, plain-Rust reference interpreter for deferfuse's ops.
//!
//! Every value is an `f64` (exact for every float dtype and for the small integers the tests
//! use). Only the output *dtype* may come from `deferfuse::fusion::ir::infer` (the record-time
//! checker); every *value* is computed here, from PyTorch's semantics as the runtime documents
//! them:
//!
//! * operands are first converted to the op's compute dtype (a cast), Python scalars to the
//!   compute type's width (f32 for f32/f16/bf16 compute, like PyTorch's opmath);
//! * float ops run in f64 on those values and are rounded once to the result dtype (f32 with
//!   `as f32`, f16/bf16 with `half`'s round-to-nearest-even);
//! * integer ops wrap in the dtype (u8 mod 256), bool is `value != 0`.
#![allow(dead_code)]
// `x % k == 0` reads best here; `is_multiple_of` needs Rust 1.87 and the workspace targets 1.85.
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

pub mod kernels;
pub mod linalg;
mod math;
pub mod reduce;
pub mod views;

pub use math::{erf, floor_divide, int_pow, sigmoid};

use deferfuse::fusion::ir::{infer, ArgMeta, Inferred, OpError};
use deferfuse::{BinaryOp, DType, Op, Scalar, UnaryOp};
use half::{bf16, f16};

/// A dense row-major tensor of values.
#[derive(Clone, Debug, PartialEq)]
pub struct RefTensor {
    pub dtype: DType,
    pub sizes: Vec<usize>,
    pub data: Vec<f64>,
}

pub fn numel(sizes: &[usize]) -> usize {
    sizes.iter().product()
}

/// Row-major strides of `sizes`.
pub fn contiguous_strides(sizes: &[usize]) -> Vec<usize> {
    let mut st = vec![1usize; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * sizes[i + 1].max(1);
    }
    st
}

/// Every index of `sizes` in row-major order.
pub fn indices(sizes: &[usize]) -> Vec<Vec<usize>> {
    let n = numel(sizes);
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; sizes.len()];
    for _ in 0..n {
        out.push(idx.clone());
        for d in (0..sizes.len()).rev() {
            idx[d] += 1;
            if idx[d] < sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

impl RefTensor {
    /// A tensor of `values` stored into `dtype` (floats rounded, integers wrapped).
    pub fn new(dtype: DType, sizes: &[usize], values: Vec<f64>) -> RefTensor {
        assert_eq!(values.len(), numel(sizes), "values for {sizes:?}");
        RefTensor {
            dtype,
            sizes: sizes.to_vec(),
            data: values.into_iter().map(|v| store(v, dtype)).collect(),
        }
    }

    pub fn scalar(dtype: DType, v: f64) -> RefTensor {
        RefTensor::new(dtype, &[], vec![v])
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn rank(&self) -> usize {
        self.sizes.len()
    }

    pub fn at(&self, idx: &[usize]) -> f64 {
        let st = contiguous_strides(&self.sizes);
        self.data[idx.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>()]
    }

    /// Decodes little-endian runtime bytes. Bool bytes are kept raw (a stored 2 reads as 2).
    pub fn from_bytes(dtype: DType, sizes: &[usize], bytes: &[u8]) -> RefTensor {
        let es = dtype.size();
        assert_eq!(bytes.len(), numel(sizes) * es, "byte length for {sizes:?}");
        RefTensor {
            dtype,
            sizes: sizes.to_vec(),
            data: bytes.chunks(es).map(|c| decode(dtype, c)).collect(),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.numel() * self.dtype.size());
        for &v in &self.data {
            encode(self.dtype, v, &mut out);
        }
        out
    }

    /// `x.to(dtype)`.
    pub fn cast(&self, to: DType) -> RefTensor {
        RefTensor {
            dtype: to,
            sizes: self.sizes.clone(),
            data: self
                .data
                .iter()
                .map(|&v| cast_value(v, self.dtype, to))
                .collect(),
        }
    }

    /// `|x|` as float64 (for accumulation-error scales).
    pub fn abs_f64(&self) -> RefTensor {
        RefTensor {
            dtype: DType::F64,
            sizes: self.sizes.clone(),
            data: self.data.iter().map(|v| v.abs()).collect(),
        }
    }
}

pub fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F16 => f16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f64(),
        DType::BF16 => bf16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f64(),
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U8 | DType::Bool => b[0] as f64,
    }
}

pub fn encode(dtype: DType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend((v as f32).to_le_bytes()),
        DType::F64 => out.extend(v.to_le_bytes()),
        DType::F16 => out.extend(f16::from_f64(v).to_bits().to_le_bytes()),
        DType::BF16 => out.extend(bf16::from_f64(v).to_bits().to_le_bytes()),
        DType::I32 => out.extend((v as i64 as i32).to_le_bytes()),
        DType::I64 => out.extend((v as i64).to_le_bytes()),
        DType::U8 => out.push(v as i64 as u8),
        DType::Bool => out.push((v != 0.0) as u8),
    }
}

/// Rounds a float to `dtype`'s precision (f64 values pass through).
pub fn round_float(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

/// Stores a literal test value into `dtype`: floats round, integers wrap, bool is `!= 0`.
pub fn store(v: f64, dtype: DType) -> f64 {
    let from = if dtype.is_float() || v.fract() != 0.0 || !v.is_finite() {
        DType::F64
    } else {
        DType::I64
    };
    cast_value(v, from, dtype)
}

/// Converts a value of dtype `from` to dtype `to` with PyTorch's cast rules: float to int
/// truncates toward zero and saturates (NaN gives 0; to uint8 saturates to int32 first and keeps
/// the low 8 bits); int to int wraps; anything to bool is `!= 0` (NaN is true).
pub fn cast_value(v: f64, from: DType, to: DType) -> f64 {
    let from_float = from.is_float();
    match to {
        DType::Bool => (v != 0.0) as u8 as f64,
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 => round_float(v, to),
        DType::I64 if from_float => v as i64 as f64,
        DType::I64 => v,
        DType::I32 if from_float => v as i32 as f64,
        DType::I32 => v as i64 as i32 as f64,
        DType::U8 if from_float => v as i32 as u8 as f64,
        DType::U8 => v as i64 as u8 as f64,
    }
}

/// One operand of a reference op.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    T(&'a RefTensor),
    S(Scalar),
    Absent,
}

pub fn metas(args: &[Arg]) -> Vec<ArgMeta> {
    args.iter()
        .map(|a| match a {
            Arg::T(t) => ArgMeta::tensor(t.dtype, &t.sizes),
            Arg::S(s) => ArgMeta::Scalar(*s),
            Arg::Absent => ArgMeta::Absent,
        })
        .collect()
}

/// The record-time checker's verdict (output dtype and compute dtype; shapes are recomputed).
pub fn check(op: &Op, args: &[Arg]) -> Result<Inferred, OpError> {
    infer(op, &metas(args))
}

/// PyTorch broadcasting of several shapes, or `None` if they are incompatible.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// `t`'s element at `idx` of a broadcast shape (right-aligned, size-1 dims repeat).
pub fn bget(t: &RefTensor, idx: &[usize]) -> f64 {
    let lead = idx.len() - t.rank();
    let st = contiguous_strides(&t.sizes);
    let mut off = 0;
    for d in 0..t.rank() {
        if t.sizes[d] != 1 {
            off += idx[lead + d] * st[d];
        }
    }
    t.data[off]
}

/// A Python scalar as the kernel sees it in `compute`: f64 for float64, f32 for float32, rounded
/// to float16/bfloat16 (through f32, as PyTorch casts a scalar to the op's dtype) for those,
/// and the integer truncated to the compute width.
pub fn scalar_value(s: Scalar, compute: DType) -> f64 {
    match compute {
        DType::F64 => s.as_f64(),
        DType::F16 => half::f16::from_f32(s.as_f64() as f32).to_f64(),
        DType::BF16 => half::bf16::from_f32(s.as_f64() as f32).to_f64(),
        c if c.is_float() => s.as_f64() as f32 as f64,
        DType::I64 => s.as_i64() as f64,
        // Like PyTorch, a scalar takes the computation's dtype: `u8_tensor < -3` compares
        // with 253.
        DType::U8 => s.as_i64() as u8 as f64,
        _ => s.as_i64() as i32 as f64,
    }
}

fn operand(a: &Arg, idx: &[usize], compute: DType) -> f64 {
    match a {
        Arg::T(t) => cast_value(bget(t, idx), t.dtype, compute),
        Arg::S(s) => scalar_value(*s, compute),
        Arg::Absent => unreachable!("absent operands are skipped"),
    }
}

/// `op(x)` on a value already converted to `compute`.
pub fn unary_value(op: UnaryOp, x: f64, compute: DType) -> f64 {
    use UnaryOp::*;
    if op == LogicalNot {
        return (x == 0.0) as u8 as f64;
    }
    if op == IsNan {
        return x.is_nan() as u8 as f64;
    }
    if op == BitwiseNot && compute == DType::Bool {
        return (x == 0.0) as u8 as f64;
    }
    if !compute.is_float() {
        // In int64, -INT64_MIN and abs(INT64_MIN) wrap to INT64_MIN (PyTorch and the runtime);
        // narrower results wrap when they are stored.
        return match op {
            Neg => (x as i64).wrapping_neg() as f64,
            Abs => (x as i64).wrapping_abs() as f64,
            Relu => x.max(0.0),
            Sign => x.signum() * (x != 0.0) as u8 as f64,
            Floor | Ceil | Round | Trunc => x,
            // Two's complement not; narrower results wrap when they are stored.
            BitwiseNot => !(x as i64) as f64,
            other => panic!("{} on integers is not an integer op", other.name()),
        };
    }
    match op {
        Neg => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Log => x.ln(),
        Log1p => x.ln_1p(),
        Log2 => x.log2(),
        Log10 => x.log10(),
        Sinh | Cosh | Tan | Asin | Acos | Atan | Asinh | Acosh | Atanh => math::trig(op, x),
        Expm1 => x.exp_m1(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Sin => x.sin(),
        Cos => x.cos(),
        Tanh => x.tanh(),
        Sigmoid => sigmoid(x),
        Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        GeluTanh => {
            0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x)).tanh())
        }
        Silu => x * sigmoid(x),
        Erf => erf(x),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round_ties_even(),
        Trunc => x.trunc(),
        Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        Reciprocal => 1.0 / x,
        LogicalNot | IsNan => unreachable!(),
        BitwiseNot => panic!("bitwise_not of a float"),
    }
}

fn max_nan(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else {
        x.max(y)
    }
}

fn min_nan(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else {
        x.min(y)
    }
}

/// `op(x, y)` on values already converted to `compute`.
pub fn binary_value(op: BinaryOp, x: f64, y: f64, compute: DType) -> f64 {
    use BinaryOp::*;
    let b = |c: bool| c as u8 as f64;
    match op {
        Eq => return b(x == y),
        Ne => return b(x != y),
        Lt => return b(x < y),
        Le => return b(x <= y),
        Gt => return b(x > y),
        Ge => return b(x >= y),
        LogicalAnd => return b(x != 0.0 && y != 0.0),
        LogicalOr => return b(x != 0.0 || y != 0.0),
        Maximum => return max_nan(x, y),
        Minimum => return min_nan(x, y),
        _ => {}
    }
    if compute.is_float() {
        return match op {
            Add => x + y,
            Sub => x - y,
            Mul => x * y,
            Div => x / y,
            Pow => x.powf(y),
            Remainder => {
                let r = x % y;
                if r != 0.0 && ((r < 0.0) != (y < 0.0)) {
                    r + y
                } else {
                    r
                }
            }
            Atan2 => x.atan2(y),
            Fmod => x % y,
            FloorDivide => floor_divide(x, y, |v| round_float(v, compute)),
            TruncDivide => round_float(x / y, compute).trunc(),
            _ => unreachable!(),
        };
    }
    let (a, c) = (x as i64, y as i64);
    let r = match op {
        Add => a.wrapping_add(c),
        Sub => a.wrapping_sub(c),
        Mul => a.wrapping_mul(c),
        Pow => int_pow(a, c),
        // Division by zero gives 0 (PyTorch raises; the runtime documents 0).
        Remainder | Fmod | FloorDivide | TruncDivide if c == 0 => 0,
        Fmod => a.wrapping_rem(c),
        TruncDivide => a.wrapping_div(c),
        FloorDivide => {
            let q = a.wrapping_div(c);
            if a.wrapping_rem(c) != 0 && ((a < 0) != (c < 0)) {
                q - 1
            } else {
                q
            }
        }
        BitwiseAnd => a & c,
        BitwiseOr => a | c,
        BitwiseXor => a ^ c,
        Remainder => {
            let r = a.wrapping_rem(c);
            if r != 0 && ((r < 0) != (c < 0)) {
                r + c
            } else {
                r
            }
        }
        Div | Atan2 => panic!("integer {} is promoted to float", op.name()),
        _ => unreachable!(),
    };
    // Wrap to the compute dtype right away (exact in f64 for every width but i64).
    match compute {
        DType::I64 => r as f64,
        DType::U8 => r as u8 as f64,
        DType::Bool => (r != 0) as u8 as f64,
        _ => r as i32 as f64,
    }
}

/// An elementwise op (unary, binary, where, clamp, cast, copy) with broadcasting.
pub fn elementwise(op: &Op, args: &[Arg]) -> RefTensor {
    let inf = check(op, args).unwrap_or_else(|e| panic!("reference given a bad op: {e}"));
    let shapes: Vec<&[usize]> = args
        .iter()
        .filter_map(|a| match a {
            Arg::T(t) => Some(t.sizes.as_slice()),
            _ => None,
        })
        .collect();
    let sizes = broadcast_shapes(&shapes).expect("broadcastable");
    let c = inf.compute;
    let data = indices(&sizes)
        .into_iter()
        .map(|idx| {
            let v = match op {
                Op::Unary(u) => {
                    let x = operand(&args[0], &idx, c);
                    unary_value(*u, x, c)
                }
                Op::Binary(b) => {
                    let x = operand(&args[0], &idx, c);
                    let y = operand(&args[1], &idx, c);
                    binary_value(*b, x, y, c)
                }
                Op::Where => {
                    let cond = operand(&args[0], &idx, DType::Bool);
                    let pick = if cond != 0.0 { &args[1] } else { &args[2] };
                    operand(pick, &idx, c)
                }
                Op::Clamp => {
                    let mut x = operand(&args[0], &idx, c);
                    if !matches!(args[1], Arg::Absent) {
                        x = max_nan(x, operand(&args[1], &idx, c));
                    }
                    if !matches!(args[2], Arg::Absent) {
                        x = min_nan(x, operand(&args[2], &idx, c));
                    }
                    x
                }
                Op::Cast(_) | Op::Copy => match &args[0] {
                    Arg::T(t) => bget(t, &idx),
                    _ => unreachable!(),
                },
                other => panic!("{other} is not elementwise"),
            };
            let from = match op {
                Op::Cast(_) | Op::Copy => match &args[0] {
                    Arg::T(t) => t.dtype,
                    _ => unreachable!(),
                },
                _ => c,
            };
            cast_value(v, from, inf.dtype)
        })
        .collect();
    RefTensor {
        dtype: inf.dtype,
        sizes,
        data,
    }
}

/// Any op, dispatched to its reference.
pub fn apply(op: &Op, args: &[Arg]) -> RefTensor {
    let t = |i: usize| match &args[i] {
        Arg::T(t) => *t,
        other => panic!("operand {i} of {op} must be a tensor, got {other:?}"),
    };
    let s = |i: usize| match &args[i] {
        Arg::S(s) => *s,
        other => panic!("operand {i} of {op} must be a scalar, got {other:?}"),
    };
    match op {
        Op::Reduce {
            op: r,
            dims,
            keepdim,
        } => reduce::reduce(*r, t(0), dims, *keepdim),
        Op::Cat { dim } => {
            let ts: Vec<&RefTensor> = (0..args.len()).map(t).collect();
            linalg::cat(&ts, *dim)
        }
        Op::Full { sizes, dtype } => linalg::full(sizes, s(0), *dtype),
        Op::Arange { dtype } => linalg::arange(s(0), s(1), s(2), *dtype),
        Op::Matmul => linalg::matmul(t(0), t(1)),
        Op::Addmm => linalg::addmm(t(0), t(1), t(2), s(3), s(4)),
        _ => elementwise(op, args),
    }
}

/// The result of an in-place op: `result` cast into the out tensor's dtype.
pub fn into_out(result: &RefTensor, out_dtype: DType) -> RefTensor {
    result.cast(out_dtype)
}

/// Ops whose float result is the exact result rounded once (bit-exact against the reference).
pub fn unary_is_exact(op: deferfuse::UnaryOp) -> bool {
    use deferfuse::UnaryOp::*;
    matches!(
        op,
        Neg | Abs
            | Sqrt
            | Floor
            | Ceil
            | Round
            | Trunc
            | Relu
            | Sign
            | Reciprocal
            | LogicalNot
            | IsNan
            | BitwiseNot
    )
}
