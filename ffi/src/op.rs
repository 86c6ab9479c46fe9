//! `dfuse_op`: one entry point for every recorded op. The op is a kind, attributes and operands;
//! this module turns them into the runtime's `Op` and `Input`s, with PyTorch's conventions for
//! negative dims, and leaves every shape and dtype check to the runtime (which reports them as
//! `DFUSE_STATUS_BAD_OP` at the call).

use crate::error::{invalid, Result};
use crate::kernel_op::{
    build_conv, build_ctc, build_depthwise, build_grouped_mm, build_kernel_op, build_recurrence,
};
use crate::types::{dtype_from, DFUSE_MAX_REDUCE_DIMS};
use deferfuse_fusion::ir::layout::wrap_dim;
use deferfuse_fusion::ir::{BinaryOp, Dims, KernelOp, Op, ReduceOp, UnaryOp};
use deferfuse_runtime::{Error, Input};

/// `dfuse_op`'s `kind`: which op to record, which `DfuseAttrs` fields it reads, and its inputs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseOpKind {
    /// `attrs->sub_op` is a `DfuseUnaryOp`; one tensor input.
    Unary = 0,
    /// `attrs->sub_op` is a `DfuseBinaryOp`; two inputs (tensors or scalars, at least one tensor).
    Binary = 1,
    /// `where(cond, a, b)`; no attrs; a bool tensor and two tensors or scalars.
    Where = 2,
    /// `clamp(x, min, max)`; no attrs; a tensor and two bounds (tensor, scalar or ABSENT).
    Clamp = 3,
    /// `x.to(dtype)`; `attrs->dtype` is the target `DfuseDtype`; one tensor input.
    Cast = 4,
    /// A dense copy (`clone`, `contiguous`, `copy_` with `out`); no attrs; one tensor input.
    Copy = 5,
    /// `attrs->sub_op` is a `DfuseReduceOp` over `attrs->dims[0..n_dims]` (0 dims = all dims;
    /// negative dims count from the end), with `attrs->keepdim`; one tensor input.
    Reduce = 6,
    /// `cat(inputs, dim=attrs->dim)` (negative counts from the end); one or more tensor inputs.
    Cat = 7,
    /// `arange(start, end, step, dtype=attrs->dtype)`; three scalar inputs.
    Arange = 8,
    /// `matmul(a, b)` with `torch.matmul` semantics; no attrs; two tensor inputs.
    Matmul = 9,
    /// `addmm(input, m1, m2, beta=, alpha=)`; no attrs; inputs are input, m1, m2, then the
    /// scalars beta and alpha.
    Addmm = 10,
    /// `gather(src, dim=attrs->dim, index)`; inputs src and index (an int64 or int32 tensor of
    /// src's rank, `index.size(d) <= src.size(d)` for d != dim); the result has index's shape
    /// and src's dtype. An index value outside `[0, src.size(dim))` is reported when the op
    /// runs (see `DFUSE_STATUS_BAD_OP` in `dfuse_op`).
    Gather = 11,
    /// Functional `scatter` / `scatter_add` / `scatter_reduce` along `attrs->dim`, combining
    /// with `attrs->sub_op` (a `DfuseScatterReduce`) and `attrs->include_self`; inputs self,
    /// index (as for GATHER), then src (a tensor of self's dtype and rank) or a scalar value.
    /// The result is a new tensor of self's shape and dtype (pass `out` = self for `scatter_`).
    /// `attrs->has_dtype` with `attrs->dtype` F32: float16/bfloat16 sums, means and products
    /// accumulate in float32, each element rounded once (CPU's scatter_add and scatter_reduce);
    /// without it every step rounds to the dtype.
    Scatter = 12,
    /// `cumsum` / `cumprod` (`attrs->sub_op`, a `DfuseScanOp`) along `attrs->dim`; with
    /// `attrs->has_dtype` non-zero, `attrs->dtype` is torch's `dtype=`. One tensor input; the
    /// result dtype is that dtype, else the input's if floating, else int64.
    Scan = 13,
    /// `argsort(input, dim=attrs->dim, descending=attrs->descending, stable=True)`: int64
    /// indices; NaN sorts as the largest value. One tensor input. A positive `attrs->limit`
    /// keeps only each row's first `limit` positions (`topk`'s indices, at a selection's cost
    /// instead of a whole sort's).
    Sort = 14,
    /// `rand` / `randn` (`attrs->sub_op`, a `DfuseRandomDist`) of sizes `attrs->dims[0..n_dims]`
    /// and floating `attrs->dtype`; inputs are two INT scalars, seed and offset. Philox4x32-10:
    /// element e's value depends only on (seed, offset, e).
    Random = 15,
    /// A depthwise convolution (groups = channels, one output channel per group) or one of its
    /// gradients (`attrs->sub_op`, a `DfuseDepthwisePart`), over `attrs->n_dims` (1 to 3)
    /// spatial dims: `attrs->dims[0..n]` are the kernel sizes, `attrs->stride`,
    /// `attrs->padding` and `attrs->dilation[0..n]` the geometry, and for the input gradient
    /// `attrs->dims[n..2n]` the input's spatial sizes. Inputs: FORWARD x `[N, C, in...]` and
    /// weight `[C, 1, k...]`; INPUT_GRAD grad `[N, C, out...]` and weight; WEIGHT_GRAD grad and
    /// x. One floating dtype for both; the result has it.
    DepthwiseConv = 16,
    /// `torch._grouped_mm` with offsets: inputs a, b (one floating dtype) and offs (a 1-D int32
    /// or int64 tensor of G cumulative group ends); `attrs->sub_op` (a `DfuseGroupedMm`) names
    /// the dim the offsets cut. Group g covers `[offs[g-1], offs[g])` (from 0), each end
    /// clamped to the dim; what no group covers is zero. The offsets are read when the op
    /// runs, so recording it is no sync point. The result has a's dtype.
    GroupedMm = 17,
    /// A part of `F.ctc_loss` (`attrs->sub_op`, a `DfuseCtcPart`) with `attrs->dims[0]` the
    /// blank label and `attrs->dims[1]` the longest target. Targets are one 1-D int64 tensor
    /// (concatenated, or a padded `[N, S]` flattened) and lengths an int64 `[N, 3]` tensor of
    /// each sample's input length, target length and target offset. ALPHA: log_probs `[T, N,
    /// C]` (float32 or float64), targets, lengths -> `[N, T, 2 * dims[1] + 1]`; LOSS:
    /// log_alpha, lengths -> `[N]`; GRAD: grad `[N]`, log_probs, targets, lengths, loss,
    /// log_alpha -> `[T, N, C]`. A length or label out of range is reported when the op runs.
    CtcLoss = 18,
    /// A dense convolution of one group over `attrs->n_dims` (1 to 3) spatial dims
    /// with `attrs->padding[0..n]` zeros on both sides, `attrs->dilation[0..n]` between taps
    /// and `attrs->stride[0..n]` between output positions (0 reads as 1), computed without
    /// writing its columns; `attrs->sub_op` (a `DfuseConvPart`) picks the product. FORWARD: x
    /// `[N, C, in...]` and weight `[OC, C, k...]` -> `[N, OC, (in + 2 * padding - dilation *
    /// (k - 1) - 1) / stride + 1]`; INPUT_GRAD (stride 1 only): a convolution's output gradient
    /// and its weight `[C, OC, k...]` (read transposed with every tap reversed) with padding
    /// `dilation * (k - 1) - padding` -> its input gradient; WEIGHT_GRAD: the output gradient
    /// `[N, OC, out...]` and x, `attrs->dims[0..n]` the kernel -> `[OC, C, k...]`;
    /// COLUMNS_TO_INPUT (col2im): one input, the columns' gradient `[N, C, k..., out...]`,
    /// `attrs->dims[0..n]` the input sizes -> `[N, C, in...]`; INPUT_TO_COLUMNS (im2col): x
    /// `[N, C, in...]`, `attrs->dims[0..n]` the kernel -> `[C, k..., N, out...]`. Dtypes:
    /// float32 throughout; FORWARD, INPUT_GRAD and WEIGHT_GRAD also take two bfloat16 operands
    /// (autocast's), summed in float32 into a float32 result; INPUT_TO_COLUMNS copies bfloat16
    /// and float16 too.
    Conv = 19,
    /// Every step of one direction of one LSTM, GRU or plain RNN layer, forward or backward
    /// (`attrs->sub_op`, a `DfuseRecurrencePart`, which gives each part's operands and
    /// result), float32 (W_hh may be bfloat16: each step's hidden product is then a bf16 one on
    /// h or the gate gradients rounded to bfloat16); `attrs->descending` non-zero walks the
    /// steps from the last to the
    /// first (a bidirectional layer's second direction). A forward takes each step's input
    /// product with b_ih `[T, B, G]` (G = 4H, 3H or H), W_hh transposed, the first states and
    /// optionally b_hh, and keeps per step what its backward reads; a backward takes that,
    /// W_hh and the gradients of the output and of the last states, and gives per step the
    /// gates' gradients, then a row with the first states' gradients. Packed steps (a
    /// PackedSequence): the time-major operands and results are `[N, ..]` (step t's first
    /// batch_sizes[t] samples, step after step) and an int64 batch_sizes `[T]` comes last; a
    /// backward's first states' gradients are then its last B rows.
    Recurrence = 20,
    /// `a @ b` of two float16 or bfloat16 tensors (one dtype, at least 2-D, batch dims
    /// broadcast as `torch.matmul`'s), summed in float32 and returned in float32, not rounded
    /// to the operands' dtype: a half-precision convolution's input gradient adds overlapping
    /// windows in float32 from it. No attrs.
    WideMatmul = 21,
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_UNARY`; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseUnaryOp {
    /// `-x`
    Neg = 0,
    /// `abs(x)`
    Abs = 1,
    /// `exp(x)`
    Exp = 2,
    /// `log(x)`
    Log = 3,
    /// `log1p(x)`
    Log1p = 4,
    /// `expm1(x)`
    Expm1 = 5,
    /// `sqrt(x)`
    Sqrt = 6,
    /// `rsqrt(x)`
    Rsqrt = 7,
    /// `sin(x)`
    Sin = 8,
    /// `cos(x)`
    Cos = 9,
    /// `tanh(x)`
    Tanh = 10,
    /// `sigmoid(x)`
    Sigmoid = 11,
    /// `relu(x)`
    Relu = 12,
    /// `gelu(x, approximate="none")`
    GeluErf = 13,
    /// `gelu(x, approximate="tanh")`
    GeluTanh = 14,
    /// `silu(x)`
    Silu = 15,
    /// `erf(x)`
    Erf = 16,
    /// `floor(x)`
    Floor = 17,
    /// `ceil(x)`
    Ceil = 18,
    /// `round(x)`, half to even
    Round = 19,
    /// `sign(x)`
    Sign = 20,
    /// `reciprocal(x)`
    Reciprocal = 21,
    /// `logical_not(x)`
    LogicalNot = 22,
    /// `isnan(x)`
    IsNan = 23,
    /// `bitwise_not(x)` (`~x`): bool and integer tensors only; on bool it is logical not
    BitwiseNot = 24,
    /// `trunc(x)`, rounding toward zero (the identity on integers; bool is rejected)
    Trunc = 25,
    /// `log2(x)` (integer inputs give float32)
    Log2 = 26,
    /// `log10(x)` (integer inputs give float32)
    Log10 = 27,
    /// `sinh(x)` (integer inputs give float32)
    Sinh = 28,
    /// `cosh(x)` (integer inputs give float32)
    Cosh = 29,
    /// `tan(x)` (integer inputs give float32)
    Tan = 30,
    /// `asin(x)` (integer inputs give float32) (NaN outside [-1, 1])
    Asin = 31,
    /// `acos(x)` (integer inputs give float32) (NaN outside [-1, 1])
    Acos = 32,
    /// `atan(x)` (integer inputs give float32)
    Atan = 33,
    /// `asinh(x)` (integer inputs give float32)
    Asinh = 34,
    /// `acosh(x)` (integer inputs give float32) (NaN below 1)
    Acosh = 35,
    /// `atanh(x)` (integer inputs give float32) (+-inf at +-1, NaN beyond)
    Atanh = 36,
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_BINARY`; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseBinaryOp {
    /// `a + b`
    Add = 0,
    /// `a - b`
    Sub = 1,
    /// `a * b`
    Mul = 2,
    /// `a / b` (true division; integer inputs give float32)
    Div = 3,
    /// `pow(a, b)`
    Pow = 4,
    /// `maximum(a, b)` (propagates NaN)
    Maximum = 5,
    /// `minimum(a, b)` (propagates NaN)
    Minimum = 6,
    /// `remainder(a, b)` (takes the divisor's sign)
    Remainder = 7,
    /// `a == b`
    Eq = 8,
    /// `a != b`
    Ne = 9,
    /// `a < b`
    Lt = 10,
    /// `a <= b`
    Le = 11,
    /// `a > b`
    Gt = 12,
    /// `a >= b`
    Ge = 13,
    /// `logical_and(a, b)`
    LogicalAnd = 14,
    /// `logical_or(a, b)`
    LogicalOr = 15,
    /// `bitwise_and(a, b)` (`a & b`): bool and integer operands only, integer promotion
    BitwiseAnd = 16,
    /// `bitwise_or(a, b)` (`a | b`): bool and integer operands only, integer promotion
    BitwiseOr = 17,
    /// `bitwise_xor(a, b)` (`a ^ b`): bool and integer operands only, integer promotion
    BitwiseXor = 18,
    /// `atan2(a, b)` (integer inputs give float32)
    Atan2 = 19,
    /// `fmod(a, b)` (C fmod: takes the dividend's sign; integer fmod by 0 gives 0; two bools
    /// are rejected)
    Fmod = 20,
    /// `floor_divide(a, b)`, `div(a, b, rounding_mode="floor")` (integer division by 0 gives 0;
    /// two bools are rejected)
    FloorDivide = 21,
    /// `div(a, b, rounding_mode="trunc")` (integer division by 0 gives 0; two bools are
    /// rejected)
    TruncDivide = 22,
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_REDUCE`; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseReduceOp {
    /// `sum` (integer inputs give int64)
    Sum = 0,
    /// `mean` (floating inputs only)
    Mean = 1,
    /// `prod` (integer inputs give int64)
    Prod = 2,
    /// `amax` (propagates NaN)
    Amax = 3,
    /// `amin` (propagates NaN)
    Amin = 4,
    /// `argmax` (int64; at most one dim)
    Argmax = 5,
    /// `argmin` (int64; at most one dim)
    Argmin = 6,
}

/// The attributes of a `dfuse_op` call; which fields are read depends on the `DfuseOpKind`, the
/// others are ignored. May be NULL for kinds that read none.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DfuseAttrs {
    /// A `DfuseUnaryOp`, `DfuseBinaryOp` or `DfuseReduceOp` (UNARY, BINARY, REDUCE).
    pub sub_op: u32,
    /// A `DfuseDtype`: the target of CAST, the dtype of ARANGE, SCAN's `dtype=` and SCATTER's
    /// accumulation dtype (see `has_dtype`).
    pub dtype: u32,
    /// REDUCE: the dims to reduce; negative dims count from the end.
    pub dims: [i64; DFUSE_MAX_REDUCE_DIMS],
    /// REDUCE: how many of `dims` are used; 0 reduces over all dims.
    pub n_dims: usize,
    /// REDUCE: keep reduced dims as size 1 when non-zero. A byte rather than a `bool`: a struct
    /// left uninitialized (or filled with memset) may hold any byte here, and reading a Rust
    /// `bool` that is not 0 or 1 is undefined behaviour, while every byte is a valid `u8`.
    pub keepdim: u8,
    /// CAT: the dim to concatenate along; GATHER, SCATTER, SCAN, SORT: the dim they work
    /// along. Negative counts from the end.
    pub dim: i64,
    /// SCATTER: non-zero to combine with self's elements (torch's `include_self=True`, its
    /// default); zero makes an element that receives values start from them alone.
    pub include_self: u8,
    /// SORT: non-zero for a descending sort. RECURRENCE: non-zero to walk the steps from the last.
    pub descending: u8,
    /// SCAN: non-zero when `dtype` holds torch's `dtype=` argument. SCATTER: non-zero when
    /// `dtype` holds the accumulation dtype of half-precision sums (F32 only).
    pub has_dtype: u8,
    /// DEPTHWISE_CONV, CONV: the stride of each spatial dim (`n_dims` of them).
    pub stride: [i64; 3],
    /// DEPTHWISE_CONV, CONV: the zero padding on both sides of each spatial dim.
    pub padding: [i64; 3],
    /// DEPTHWISE_CONV, CONV: the spacing of the kernel taps along each spatial dim.
    pub dilation: [i64; 3],
    /// SORT: when positive, how many leading positions of each sorted row to produce (at most
    /// the dim's size); 0 produces them all.
    pub limit: i64,
}

/// The op kind number's name, for messages.
pub(crate) fn kind_name(kind: u32) -> &'static str {
    #[rustfmt::skip]
    const NAMES: [&str; 22] = [
        "UNARY", "BINARY", "WHERE", "CLAMP", "CAST", "COPY", "REDUCE", "CAT", "ARANGE", "MATMUL",
        "ADDMM", "GATHER", "SCATTER", "SCAN", "SORT", "RANDOM", "DEPTHWISE_CONV", "GROUPED_MM",
        "CTC_LOSS", "CONV", "RECURRENCE", "WIDE_MATMUL",
    ];
    NAMES.get(kind as usize).copied().unwrap_or("?")
}

/// Builds the runtime op for `kind` and `attrs`. `rank` gives the rank of the first tensor
/// input (`None` if there is none); it is called only by kinds with dims to wrap.
pub(crate) fn build_op(
    kind: u32,
    attrs: Option<&DfuseAttrs>,
    rank: impl FnOnce() -> Result<Option<usize>>,
) -> Result<Op> {
    let need = |what: &str| {
        attrs.ok_or_else(|| {
            invalid(format!(
                "attrs is NULL; op kind {} ({kind}) needs {what}",
                kind_name(kind)
            ))
        })
    };
    let sub = |a: &DfuseAttrs, enum_name: &str, max: usize| {
        invalid(format!(
            "attrs->sub_op = {} is not a {enum_name}; expected 0..={max}",
            a.sub_op
        ))
    };
    Ok(match kind {
        0 => {
            let a = need("attrs->sub_op (a DfuseUnaryOp)")?;
            Op::Unary(
                UnaryOp::from_u32(a.sub_op)
                    .ok_or_else(|| sub(a, "DfuseUnaryOp", UnaryOp::ALL.len() - 1))?,
            )
        }
        1 => {
            let a = need("attrs->sub_op (a DfuseBinaryOp)")?;
            Op::Binary(
                BinaryOp::from_u32(a.sub_op)
                    .ok_or_else(|| sub(a, "DfuseBinaryOp", BinaryOp::ALL.len() - 1))?,
            )
        }
        2 => Op::Where,
        3 => Op::Clamp,
        4 => Op::Cast(dtype_from(need("attrs->dtype")?.dtype, "attrs->dtype")?),
        5 => Op::Copy,
        6 => {
            let a = need("attrs->sub_op (a DfuseReduceOp), attrs->dims and attrs->keepdim")?;
            let r = ReduceOp::from_u32(a.sub_op)
                .ok_or_else(|| sub(a, "DfuseReduceOp", ReduceOp::ALL.len() - 1))?;
            if a.n_dims > DFUSE_MAX_REDUCE_DIMS {
                return Err(invalid(format!(
                    "attrs->n_dims = {} is more than the {DFUSE_MAX_REDUCE_DIMS} dims attrs->dims \
                     holds",
                    a.n_dims
                )));
            }
            let dims = wrap_dims(r.name(), &a.dims[..a.n_dims], rank()?)?;
            Op::Reduce {
                op: r,
                dims,
                keepdim: a.keepdim != 0,
            }
        }
        7 => {
            let a = need("attrs->dim")?;
            let dim = wrap_dims("cat", &[a.dim], rank()?)?[0];
            Op::Cat { dim }
        }
        8 => Op::Arange {
            dtype: dtype_from(need("attrs->dtype")?.dtype, "attrs->dtype")?,
        },
        9 => Op::Matmul,
        10 => Op::Addmm,
        11..=15 => {
            let a = need("attrs->dim and the op's other attributes")?;
            Op::Kernel(build_kernel_op(kind, a, rank)?)
        }
        16 => {
            let a = need("attrs->sub_op (a DfuseDepthwisePart) and the geometry")?;
            Op::Kernel(build_depthwise(a)?)
        }
        17 => Op::Kernel(build_grouped_mm(need("attrs->sub_op (a DfuseGroupedMm)")?)?),
        18 => Op::Kernel(build_ctc(need(
            "attrs->sub_op (a DfuseCtcPart), the blank and the longest target",
        )?)?),
        19 => Op::Kernel(build_conv(need(
            "attrs->n_dims, attrs->padding and attrs->dilation",
        )?)?),
        20 => Op::Kernel(build_recurrence(need(
            "attrs->sub_op (a DfuseRecurrencePart) and attrs->descending (the direction)",
        )?)?),
        21 => Op::Kernel(KernelOp::WideMatmul),
        k => {
            return Err(invalid(format!(
                "kind = {k} is not a DfuseOpKind; expected 0..=21 (UNARY, BINARY, WHERE, CLAMP, \
                 CAST, COPY, REDUCE, CAT, ARANGE, MATMUL, ADDMM, GATHER, SCATTER, SCAN, SORT, \
                 RANDOM, DEPTHWISE_CONV, GROUPED_MM, CTC_LOSS, CONV, RECURRENCE, WIDE_MATMUL)"
            )))
        }
    })
}

/// Wraps negative dims against `rank` (PyTorch's rule). Without a tensor input (`rank` is
/// `None`) the dims are passed on as they are: the runtime rejects such an op for its missing
/// tensor before it looks at dims.
pub(crate) fn wrap_dims(op: &str, dims: &[i64], rank: Option<usize>) -> Result<Dims> {
    dims.iter()
        .map(|&d| match rank {
            Some(r) => wrap_dim(op, d, r).map_err(Error::from),
            None => Ok(usize::try_from(d).unwrap_or(0)),
        })
        .collect()
}

/// The rank of the first tensor input (`None` without one).
pub(crate) fn first_rank(
    rt: &deferfuse_runtime::Runtime,
    inputs: &[Input],
    op: &str,
) -> Result<Option<usize>> {
    let Some((i, h)) = inputs.iter().enumerate().find_map(|(i, x)| match x {
        Input::Tensor(h) => Some((i, *h)),
        _ => None,
    }) else {
        return Ok(None);
    };
    match rt.sizes(h) {
        Ok(s) => Ok(Some(s.len())),
        Err(Error::InvalidHandle(m)) => Err(Error::InvalidHandle(format!("{op}: input {i}: {m}"))),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(sub_op: u32, dims: &[i64], keepdim: bool) -> DfuseAttrs {
        let mut a = DfuseAttrs {
            sub_op,
            dtype: 0,
            dims: [0; DFUSE_MAX_REDUCE_DIMS],
            n_dims: dims.len(),
            keepdim: keepdim.into(),
            dim: 0,
            include_self: 1,
            descending: 0,
            has_dtype: 0,
            stride: [1; 3],
            padding: [0; 3],
            dilation: [1; 3],
            limit: 0,
        };
        a.dims[..dims.len()].copy_from_slice(dims);
        a
    }

    #[test]
    fn sub_op_numbers_match_fusion() {
        use DfuseUnaryOp as U;
        let u = [
            U::Neg,
            U::Abs,
            U::Exp,
            U::Log,
            U::Log1p,
            U::Expm1,
            U::Sqrt,
            U::Rsqrt,
            U::Sin,
            U::Cos,
            U::Tanh,
            U::Sigmoid,
            U::Relu,
            U::GeluErf,
            U::GeluTanh,
            U::Silu,
            U::Erf,
            U::Floor,
            U::Ceil,
            U::Round,
            U::Sign,
            U::Reciprocal,
            U::LogicalNot,
            U::IsNan,
            U::BitwiseNot,
            U::Trunc,
            U::Log2,
            U::Log10,
            U::Sinh,
            U::Cosh,
            U::Tan,
            U::Asin,
            U::Acos,
            U::Atan,
            U::Asinh,
            U::Acosh,
            U::Atanh,
        ];
        assert_eq!(u.len(), UnaryOp::ALL.len());
        for (a, b) in u.iter().zip(UnaryOp::ALL) {
            assert_eq!((*a as u32, format!("{a:?}")), (b as u32, format!("{b:?}")));
        }
        use DfuseBinaryOp as B;
        let b = [
            B::Add,
            B::Sub,
            B::Mul,
            B::Div,
            B::Pow,
            B::Maximum,
            B::Minimum,
            B::Remainder,
            B::Eq,
            B::Ne,
            B::Lt,
            B::Le,
            B::Gt,
            B::Ge,
            B::LogicalAnd,
            B::LogicalOr,
            B::BitwiseAnd,
            B::BitwiseOr,
            B::BitwiseXor,
            B::Atan2,
            B::Fmod,
            B::FloorDivide,
            B::TruncDivide,
        ];
        assert_eq!(b.len(), BinaryOp::ALL.len());
        for (x, y) in b.iter().zip(BinaryOp::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
        use DfuseReduceOp as R;
        let r = [
            R::Sum,
            R::Mean,
            R::Prod,
            R::Amax,
            R::Amin,
            R::Argmax,
            R::Argmin,
        ];
        assert_eq!(r.len(), ReduceOp::ALL.len());
        for (x, y) in r.iter().zip(ReduceOp::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
        for (i, k) in [
            DfuseOpKind::Unary,
            DfuseOpKind::Binary,
            DfuseOpKind::Where,
            DfuseOpKind::Clamp,
            DfuseOpKind::Cast,
            DfuseOpKind::Copy,
            DfuseOpKind::Reduce,
            DfuseOpKind::Cat,
            DfuseOpKind::Arange,
            DfuseOpKind::Matmul,
            DfuseOpKind::Addmm,
            DfuseOpKind::Gather,
            DfuseOpKind::Scatter,
            DfuseOpKind::Scan,
            DfuseOpKind::Sort,
            DfuseOpKind::Random,
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(k as usize, i);
            assert_eq!(kind_name(i as u32), format!("{k:?}").to_uppercase());
        }
    }

    #[test]
    fn reduce_dims_wrap_against_the_first_tensor() {
        let a = attrs(ReduceOp::Sum as u32, &[-1, 0], true);
        let op = build_op(6, Some(&a), || Ok(Some(3))).unwrap();
        assert_eq!(
            op,
            Op::Reduce {
                op: ReduceOp::Sum,
                dims: Dims::from_slice(&[2, 0]),
                keepdim: true
            }
        );
        let e = build_op(6, Some(&attrs(0, &[3], false)), || Ok(Some(3))).unwrap_err();
        assert_eq!(e.status(), deferfuse_runtime::Status::BadOp);
        assert!(e.to_string().contains("sum: dim"), "{e}");
        // All dims, and a 0-dim tensor accepting dim -1 like PyTorch.
        let op = build_op(6, Some(&attrs(1, &[], false)), || Ok(Some(2))).unwrap();
        assert!(matches!(op, Op::Reduce { ref dims, .. } if dims.is_empty()));
        assert!(build_op(6, Some(&attrs(0, &[-1], false)), || Ok(Some(0))).is_ok());
    }

    #[test]
    fn bad_attrs_are_invalid_arguments() {
        let mut a = attrs(0, &[], false);
        a.n_dims = 9;
        let e = build_op(6, Some(&a), || Ok(Some(2))).unwrap_err();
        assert!(e.to_string().contains("attrs->n_dims = 9"), "{e}");
        let e = build_op(0, None, || Ok(None)).unwrap_err();
        assert!(
            e.to_string().contains("attrs is NULL; op kind UNARY"),
            "{e}"
        );
        let e = build_op(1, Some(&attrs(23, &[], false)), || Ok(None)).unwrap_err();
        assert!(e
            .to_string()
            .contains("sub_op = 23 is not a DfuseBinaryOp; expected 0..=22"));
        let e = build_op(22, None, || Ok(None)).unwrap_err();
        assert!(
            e.to_string().contains("kind = 22 is not a DfuseOpKind"),
            "{e}"
        );
        // WIDE_MATMUL takes no attrs: none is no error.
        assert!(matches!(
            build_op(21, None, || Ok(None)),
            Ok(Op::Kernel(KernelOp::WideMatmul))
        ));
        let e = build_op(20, Some(&attrs(8, &[], false)), || Ok(None)).unwrap_err();
        assert!(
            e.to_string()
                .contains("sub_op = 8 is not a DfuseRecurrencePart"),
            "{e}"
        );
        let e = build_op(19, None, || Ok(None)).unwrap_err();
        assert!(e.to_string().contains("attrs is NULL; op kind CONV"), "{e}");
        let mut ctc = attrs(0, &[0, -1], false);
        ctc.n_dims = 2;
        let e = build_op(18, Some(&ctc), || Ok(None)).unwrap_err();
        assert!(
            e.to_string()
                .contains("attrs->dims (blank, longest target)"),
            "{e}"
        );
        let e = build_op(17, None, || Ok(None)).unwrap_err();
        assert!(
            e.to_string().contains("attrs is NULL; op kind GROUPED_MM"),
            "{e}"
        );
        let e = build_op(17, Some(&attrs(3, &[], false)), || Ok(None)).unwrap_err();
        assert!(
            e.to_string()
                .contains("sub_op = 3 is not a DfuseGroupedMm; expected 0..=2"),
            "{e}"
        );
        let e = build_op(16, None, || Ok(None)).unwrap_err();
        assert!(
            e.to_string()
                .contains("attrs is NULL; op kind DEPTHWISE_CONV"),
            "{e}"
        );
        let mut c = attrs(0, &[], false);
        c.dtype = 8;
        let e = build_op(4, Some(&c), || Ok(None)).unwrap_err();
        assert_eq!(e.status(), deferfuse_runtime::Status::InvalidArgument);
        // Kinds without attrs accept NULL and never ask for the rank.
        assert_eq!(build_op(9, None, || unreachable!()).unwrap(), Op::Matmul);
    }

    #[test]
    fn cat_dim_wraps() {
        let mut a = attrs(0, &[], false);
        a.dim = -2;
        assert_eq!(
            build_op(7, Some(&a), || Ok(Some(2))).unwrap(),
            Op::Cat { dim: 0 }
        );
        a.dim = 2;
        assert!(build_op(7, Some(&a), || Ok(Some(2))).is_err());
    }
}
