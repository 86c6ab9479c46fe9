//! The attributes of the kernel op kinds (GATHER, SCATTER, SCAN, SORT, RANDOM, DEPTHWISE_CONV,
//! GROUPED_MM, CTC_LOSS, CONV, RECURRENCE):
//! their sub-op enums and how `DfuseAttrs` becomes the runtime's `KernelOp`.

use crate::error::{invalid, Result};
use crate::op::{wrap_dims, DfuseAttrs};
use crate::types::{dtype_from, sizes_from, DFUSE_MAX_REDUCE_DIMS};
use deferfuse_fusion::ir::{
    Conv, ConvPart, Ctc, CtcPart, DType, Depthwise, DepthwisePart, Dims, GroupedMatmul, KernelOp,
    RandomDist, Recurrence, RecurrencePart, ScanOp, ScatterReduce,
};

/// `attrs->sub_op` for `DFUSE_OP_KIND_SCATTER`; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseScatterReduce {
    /// `scatter(src=/value=)`: replace (duplicate indices: the last in index order wins)
    Assign = 0,
    /// `scatter_add`, `scatter_reduce("sum")`
    Sum = 1,
    /// `scatter_reduce("prod")`
    Prod = 2,
    /// `scatter_reduce("amax")` (propagates NaN)
    Amax = 3,
    /// `scatter_reduce("amin")` (propagates NaN)
    Amin = 4,
    /// `scatter_reduce("mean")` (integers divide with floor; not for bool)
    Mean = 5,
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_SCAN`; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseScanOp {
    /// `cumsum`
    Sum = 0,
    /// `cumprod`
    Prod = 1,
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_RANDOM`; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseRandomDist {
    /// uniform on [0, 1) (`rand`)
    Uniform = 0,
    /// standard normal (`randn`)
    Normal = 1,
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_CONV`: which product; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseConvPart {
    /// the convolution: inputs x and weight `[OC, C, k...]`
    Forward = 0,
    /// the input gradient: inputs the output gradient and the forward's weight `[C, OC, k...]`
    /// (read transposed with every tap reversed), padding `dilation * (k - 1) - padding`
    InputGrad = 1,
    /// the weight gradient: inputs the output gradient and x; `attrs->dims[0..n]` the kernel
    WeightGrad = 2,
    /// col2im: one input, the columns' gradient `[N, C, k..., out...]` (`W^T @ grad`), each
    /// tap added back at the input positions it read; `attrs->dims[0..n]` the input's sizes
    ColumnsToInput = 3,
    /// im2col: one input, x `[N, C, in...]`, whose windows are copied into columns `[C, k...,
    /// N, out...]`; `attrs->dims[0..n]` the kernel
    InputToColumns = 4,
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_DEPTHWISE_CONV`; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseDepthwisePart {
    /// the convolution: inputs x and weight
    Forward = 0,
    /// its gradient with respect to x: inputs grad and weight
    InputGrad = 1,
    /// its gradient with respect to the weight: inputs grad and x
    WeightGrad = 2,
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_GROUPED_MM`: which operand dim the offsets cut into
/// groups; the numbers are the runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseGroupedMm {
    /// `a [M, K]` cut by rows, `b [G, K, N]`: result `[M, N]` (torch's 2-D x 3-D)
    Rows = 0,
    /// `a [G, M, K]`, `b [K, N]` cut by columns: result `[M, N]` (3-D x 2-D)
    Cols = 1,
    /// `a [M, K]`, `b [K, N]`, both cut along K: result `[G, M, N]` (2-D x 2-D)
    Contraction = 2,
}

/// The grouped product of `attrs` (kind 17).
pub(crate) fn build_grouped_mm(a: &DfuseAttrs) -> Result<KernelOp> {
    GroupedMatmul::from_u32(a.sub_op)
        .map(KernelOp::GroupedMatmul)
        .ok_or_else(|| {
            invalid(format!(
                "attrs->sub_op = {} is not a DfuseGroupedMm; expected 0..={}",
                a.sub_op,
                GroupedMatmul::ALL.len() - 1
            ))
        })
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_CTC_LOSS`: which part of the loss; the numbers are the
/// runtime's.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseCtcPart {
    /// the log-alphas: inputs log_probs, targets, lengths
    Alpha = 0,
    /// the loss per sample: inputs log_alpha, lengths
    Loss = 1,
    /// the gradient with respect to log_probs: inputs grad, log_probs, targets, lengths, loss,
    /// log_alpha
    Grad = 2,
}

/// The CTC loss part of `attrs` (kind 18): `dims[0]` the blank label, `dims[1]` the longest
/// target, both non-negative.
pub(crate) fn build_ctc(a: &DfuseAttrs) -> Result<KernelOp> {
    let part = CtcPart::from_u32(a.sub_op).ok_or_else(|| {
        invalid(format!(
            "attrs->sub_op = {} is not a DfuseCtcPart; expected 0..={}",
            a.sub_op,
            CtcPart::ALL.len() - 1
        ))
    })?;
    let v = sizes_from(&a.dims[..2], "attrs->dims (blank, longest target)")?;
    Ok(KernelOp::Ctc(Ctc {
        part,
        blank: v[0],
        max_target: v[1],
    }))
}

/// `attrs->sub_op` for `DFUSE_OP_KIND_RECURRENCE`: which cell and which half of its steps;
/// the numbers are the runtime's. G is the gate width: 4H (LSTM), 3H (GRU), H (plain RNN).
/// Packed steps replace `[T, B, ..]` with `[N, ..]` and take batch_sizes last (see
/// `DFUSE_OP_KIND_RECURRENCE`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseRecurrencePart {
    /// the LSTM's steps: inputs xg `[T, B, 4H]`, w_hh_t `[H, 4H]`, h0, c0 `[B, H]`, optionally
    /// b_hh `[4H]` -> `[T, B, 6H]` (per step i, f, g, o, c, h)
    LstmForward = 0,
    /// their backward: inputs the forward's result, c0, w_hh `[4H, H]`, dy `[T, B, H]`, dh,
    /// dc `[B, H]` -> `[T + 1, B, 4H]` (per step the gate gradients; row T: dh0, dc0)
    LstmBackward = 1,
    /// the GRU's steps: inputs xg `[T, B, 3H]`, w_hh_t `[H, 3H]`, h0 `[B, H]`, optionally b_hh
    /// `[3H]` -> `[T, B, 5H]` (per step r, z, n, the hidden product's n part, h)
    GruForward = 2,
    /// their backward: inputs the forward's result, h0, w_hh `[3H, H]`, dy `[T, B, H]`, dh
    /// `[B, H]` -> `[T + 1, B, 6H]` (per step the input product's gate gradients, then the
    /// hidden product's; row T: dh0)
    GruBackward = 3,
    /// the plain RNN's steps with tanh: inputs xg `[T, B, H]`, w_hh_t `[H, H]`, h0 `[B, H]`,
    /// optionally b_hh `[H]` -> `[T, B, H]` (each step's h)
    RnnTanhForward = 4,
    /// their backward: inputs the forward's result, w_hh `[H, H]`, dy `[T, B, H]`, dh `[B, H]`
    /// -> `[T + 1, B, H]` (per step the gradient before tanh; row T: dh0)
    RnnTanhBackward = 5,
    /// as RNN_TANH_FORWARD with relu
    RnnReluForward = 6,
    /// as RNN_TANH_BACKWARD through relu
    RnnReluBackward = 7,
}

/// The recurrence part of `attrs` (kind 20): `attrs->descending` non-zero walks the steps
/// from the last to the first.
pub(crate) fn build_recurrence(a: &DfuseAttrs) -> Result<KernelOp> {
    let part = RecurrencePart::from_u32(a.sub_op).ok_or_else(|| {
        invalid(format!(
            "recurrence: attrs->sub_op = {} is not a DfuseRecurrencePart; expected 0..={}",
            a.sub_op,
            RecurrencePart::ALL.len() - 1
        ))
    })?;
    Ok(KernelOp::Recurrence(Recurrence {
        part,
        reverse: a.descending != 0,
    }))
}

/// The depthwise convolution of `attrs` (kind 16): the sizes and geometry checked for what the
/// C side can get wrong (counts, signs); the shapes are the runtime's to check.
pub(crate) fn build_depthwise(a: &DfuseAttrs) -> Result<KernelOp> {
    let part = DepthwisePart::from_u32(a.sub_op).ok_or_else(|| {
        invalid(format!(
            "attrs->sub_op = {} is not a DfuseDepthwisePart; expected 0..={}",
            a.sub_op,
            DepthwisePart::ALL.len() - 1
        ))
    })?;
    let n = a.n_dims;
    if !(1..=3).contains(&n) {
        return Err(invalid(format!(
            "depthwise_conv: attrs->n_dims = {n}; expected 1 to 3 spatial dims"
        )));
    }
    let field =
        |v: &[i64], what: &str| -> Result<Dims> { Ok(Dims::from_vec(sizes_from(v, what)?)) };
    Ok(KernelOp::Depthwise(Box::new(Depthwise {
        part,
        kernel: field(&a.dims[..n], "attrs->dims (the kernel sizes)")?,
        stride: field(&a.stride[..n], "attrs->stride")?,
        padding: field(&a.padding[..n], "attrs->padding")?,
        dilation: field(&a.dilation[..n], "attrs->dilation")?,
        input: match part {
            DepthwisePart::InputGrad => {
                field(&a.dims[n..2 * n], "attrs->dims[n_dims..] (the input sizes)")?
            }
            _ => Dims::new(),
        },
    })))
}

/// The dense convolution of `attrs` (kind 19): the part, the spatial dim count and the
/// geometry's signs checked; the shapes are the runtime's to check. A zero stride reads as 1:
/// callers from before the op took strides leave `attrs->stride` zeroed.
pub(crate) fn build_conv(a: &DfuseAttrs) -> Result<KernelOp> {
    let n = a.n_dims;
    if !(1..=3).contains(&n) {
        return Err(invalid(format!(
            "conv: attrs->n_dims = {n}; expected 1 to 3 spatial dims"
        )));
    }
    let part = ConvPart::from_u32(a.sub_op).ok_or_else(|| {
        invalid(format!(
            "conv: attrs->sub_op = {} is not a DfuseConvPart; expected 0..={}",
            a.sub_op,
            ConvPart::ALL.len() - 1
        ))
    })?;
    let field =
        |v: &[i64], what: &str| -> Result<Dims> { Ok(Dims::from_vec(sizes_from(v, what)?)) };
    Ok(KernelOp::Conv(Box::new(Conv {
        part,
        padding: field(&a.padding[..n], "attrs->padding")?,
        dilation: field(&a.dilation[..n], "attrs->dilation")?,
        stride: field(&a.stride[..n], "attrs->stride")?
            .into_iter()
            .map(|s| s.max(1))
            .collect(),
        sizes: match part {
            ConvPart::WeightGrad | ConvPart::InputToColumns => {
                field(&a.dims[..n], "attrs->dims (the kernel sizes)")?
            }
            ConvPart::ColumnsToInput => field(&a.dims[..n], "attrs->dims (the input sizes)")?,
            _ => Dims::new(),
        },
    })))
}

/// The `KernelOp` of kind 11..=15 with attributes `a`; `rank` gives the first tensor input's
/// rank for wrapping `attrs->dim` (RANDOM, which has no tensor input, never asks).
pub(crate) fn build_kernel_op(
    kind: u32,
    a: &DfuseAttrs,
    rank: impl FnOnce() -> Result<Option<usize>>,
) -> Result<KernelOp> {
    let bad_sub = |name: &str, max: usize| {
        invalid(format!(
            "attrs->sub_op = {} is not a {name}; expected 0..={max}",
            a.sub_op
        ))
    };
    if kind == 15 {
        let dist = RandomDist::from_u32(a.sub_op)
            .ok_or_else(|| bad_sub("DfuseRandomDist", RandomDist::ALL.len() - 1))?;
        if a.n_dims > DFUSE_MAX_REDUCE_DIMS {
            return Err(invalid(format!(
                "attrs->n_dims = {} is more than the {DFUSE_MAX_REDUCE_DIMS} sizes attrs->dims \
                 holds",
                a.n_dims
            )));
        }
        return Ok(KernelOp::Random {
            dist,
            sizes: Dims::from_vec(sizes_from(&a.dims[..a.n_dims], "attrs->dims")?),
            dtype: dtype_from(a.dtype, "attrs->dtype")?,
        });
    }
    let name = match kind {
        11 => "gather",
        12 => "scatter",
        13 => "cumsum",
        _ => "argsort",
    };
    let dim = wrap_dims(name, &[a.dim], rank()?)?[0];
    Ok(match kind {
        11 => KernelOp::Gather { dim },
        12 => KernelOp::Scatter {
            dim,
            reduce: ScatterReduce::from_u32(a.sub_op)
                .ok_or_else(|| bad_sub("DfuseScatterReduce", ScatterReduce::ALL.len() - 1))?,
            include_self: a.include_self != 0,
            // attrs->dtype: the accumulation dtype for float16/bfloat16 sums, float32 only.
            wide: match a.has_dtype {
                0 => false,
                _ if dtype_from(a.dtype, "attrs->dtype")? == DType::F32 => true,
                _ => {
                    return Err(invalid(format!(
                        "scatter: attrs->dtype = {}; the accumulation dtype must be F32 (or \
                         set attrs->has_dtype = 0)",
                        a.dtype
                    )))
                }
            },
        },
        13 => KernelOp::Scan {
            op: ScanOp::from_u32(a.sub_op)
                .ok_or_else(|| bad_sub("DfuseScanOp", ScanOp::ALL.len() - 1))?,
            dim,
            dtype: match a.has_dtype {
                0 => None,
                _ => Some(dtype_from(a.dtype, "attrs->dtype")?),
            },
        },
        _ => KernelOp::Sort {
            dim,
            descending: a.descending != 0,
            limit: match a.limit {
                0 => None,
                k if k > 0 => Some(k as usize),
                k => {
                    return Err(invalid(format!(
                        "{name}: attrs->limit = {k}; expected 0 (every position) or a positive \
                         count of leading positions"
                    )))
                }
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(sub_op: u32, dim: i64) -> DfuseAttrs {
        DfuseAttrs {
            sub_op,
            dim,
            include_self: 1,
            // SAFETY: every field of DfuseAttrs is an integer, for which zero is valid.
            ..unsafe { std::mem::zeroed() }
        }
    }

    /// The conv op `a` builds (the test fails if it builds none, or another op).
    fn conv_of(a: &DfuseAttrs) -> Conv {
        match build_conv(a).unwrap() {
            KernelOp::Conv(c) => *c,
            _ => panic!("not a conv op"),
        }
    }

    #[test]
    fn sub_op_numbers_match_fusion() {
        let s = [
            DfuseScatterReduce::Assign,
            DfuseScatterReduce::Sum,
            DfuseScatterReduce::Prod,
            DfuseScatterReduce::Amax,
            DfuseScatterReduce::Amin,
            DfuseScatterReduce::Mean,
        ];
        assert_eq!(s.len(), ScatterReduce::ALL.len());
        for (x, y) in s.iter().zip(ScatterReduce::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
        for (x, y) in [DfuseScanOp::Sum, DfuseScanOp::Prod]
            .iter()
            .zip(ScanOp::ALL)
        {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
        let r = [DfuseRandomDist::Uniform, DfuseRandomDist::Normal];
        for (x, y) in r.iter().zip(RandomDist::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
        let d = [
            DfuseDepthwisePart::Forward,
            DfuseDepthwisePart::InputGrad,
            DfuseDepthwisePart::WeightGrad,
        ];
        assert_eq!(d.len(), DepthwisePart::ALL.len());
        for (x, y) in d.iter().zip(DepthwisePart::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
        let g = [
            DfuseGroupedMm::Rows,
            DfuseGroupedMm::Cols,
            DfuseGroupedMm::Contraction,
        ];
        assert_eq!(g.len(), GroupedMatmul::ALL.len());
        let c = [DfuseCtcPart::Alpha, DfuseCtcPart::Loss, DfuseCtcPart::Grad];
        assert_eq!(c.len(), CtcPart::ALL.len());
        for (x, y) in c.iter().zip(CtcPart::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
        let l = [
            DfuseRecurrencePart::LstmForward,
            DfuseRecurrencePart::LstmBackward,
            DfuseRecurrencePart::GruForward,
            DfuseRecurrencePart::GruBackward,
            DfuseRecurrencePart::RnnTanhForward,
            DfuseRecurrencePart::RnnTanhBackward,
            DfuseRecurrencePart::RnnReluForward,
            DfuseRecurrencePart::RnnReluBackward,
        ];
        assert_eq!(l.len(), RecurrencePart::ALL.len());
        for (x, y) in l.iter().zip(RecurrencePart::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
        for (x, y) in g.iter().zip(GroupedMatmul::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
    }

    #[test]
    fn depthwise_reads_the_input_sizes_only_for_the_input_gradient() {
        let mut a = attrs(1, 0);
        a.n_dims = 2;
        a.dims[..4].copy_from_slice(&[3, 3, 15, 16]);
        a.stride[..2].copy_from_slice(&[2, 2]);
        a.padding[..2].copy_from_slice(&[1, 1]);
        a.dilation[..2].copy_from_slice(&[1, 1]);
        let KernelOp::Depthwise(d) = build_depthwise(&a).unwrap() else {
            panic!("not a depthwise op")
        };
        assert_eq!(
            (d.part, d.input.as_slice()),
            (DepthwisePart::InputGrad, &[15, 16][..])
        );
        a.sub_op = 0;
        let KernelOp::Depthwise(d) = build_depthwise(&a).unwrap() else {
            panic!("not a depthwise op")
        };
        assert!(d.input.is_empty());
    }

    #[test]
    fn depthwise_refuses_negative_geometry_and_bad_counts() {
        let mut a = attrs(0, 0);
        a.n_dims = 1;
        a.dims[0] = 3;
        a.stride[0] = -1;
        let e = build_depthwise(&a).unwrap_err();
        assert!(e.to_string().contains("attrs->stride"), "{e}");
        a.n_dims = 4;
        assert!(build_depthwise(&a)
            .unwrap_err()
            .to_string()
            .contains("1 to 3"));
        a.n_dims = 1;
        a.stride[0] = 1;
        a.sub_op = 3;
        let e = build_depthwise(&a).unwrap_err();
        assert!(e.to_string().contains("not a DfuseDepthwisePart"), "{e}");
    }

    #[test]
    fn conv_reads_the_kernel_sizes_for_the_weight_gradient_and_none_for_the_input_gradient() {
        let mut a = attrs(DfuseConvPart::WeightGrad as u32, 0);
        a.n_dims = 2;
        a.dims[..2].copy_from_slice(&[3, 5]);
        a.padding[..2].copy_from_slice(&[2, 0]);
        a.dilation[..2].copy_from_slice(&[1, 3]);
        let c = conv_of(&a);
        assert_eq!(
            (
                c.part,
                c.padding.as_slice(),
                c.dilation.as_slice(),
                c.sizes.as_slice()
            ),
            (ConvPart::WeightGrad, &[2, 0][..], &[1, 3][..], &[3, 5][..])
        );
        a.sub_op = DfuseConvPart::InputGrad as u32;
        let c = conv_of(&a);
        assert_eq!((c.part, c.sizes.len()), (ConvPart::InputGrad, 0));
    }

    #[test]
    fn col2im_reads_the_input_sizes_from_dims() {
        let mut a = attrs(DfuseConvPart::ColumnsToInput as u32, 0);
        a.n_dims = 2;
        a.dims[..2].copy_from_slice(&[14, 15]);
        a.dilation[..2].copy_from_slice(&[1, 1]);
        a.stride[..2].copy_from_slice(&[2, 2]);
        let c = conv_of(&a);
        assert_eq!(
            (c.part, c.sizes.as_slice()),
            (ConvPart::ColumnsToInput, &[14, 15][..])
        );
    }

    #[test]
    fn conv_reads_its_strides_a_zero_one_as_one() {
        let mut a = attrs(DfuseConvPart::Forward as u32, 0);
        a.n_dims = 2;
        a.dilation[..2].copy_from_slice(&[1, 1]);
        a.stride[..2].copy_from_slice(&[0, 2]);
        let c = conv_of(&a);
        assert_eq!(c.stride.as_slice(), &[1, 2]);
        a.stride[0] = -2;
        let e = build_conv(&a).unwrap_err();
        assert!(e.to_string().contains("attrs->stride"), "{e}");
    }

    #[test]
    fn conv_refuses_an_unknown_part_negative_padding_and_bad_counts() {
        let mut a = attrs(99, 0);
        a.n_dims = 1;
        a.dilation[0] = 1;
        let e = build_conv(&a).unwrap_err();
        assert!(e.to_string().contains("not a DfuseConvPart"), "{e}");
        a.sub_op = 0;
        a.padding[0] = -1;
        let e = build_conv(&a).unwrap_err();
        assert!(e.to_string().contains("attrs->padding"), "{e}");
        a.n_dims = 0;
        let e = build_conv(&a).unwrap_err();
        assert!(e.to_string().contains("1 to 3"), "{e}");
    }

    #[test]
    fn conv_parts_have_the_runtime_s_numbers() {
        let p = [
            DfuseConvPart::Forward,
            DfuseConvPart::InputGrad,
            DfuseConvPart::WeightGrad,
            DfuseConvPart::ColumnsToInput,
            DfuseConvPart::InputToColumns,
        ];
        assert_eq!(p.len(), ConvPart::ALL.len());
        for (x, y) in p.iter().zip(ConvPart::ALL) {
            assert_eq!((*x as u32, format!("{x:?}")), (y as u32, format!("{y:?}")));
        }
    }

    #[test]
    fn dims_wrap_against_the_first_tensor() {
        let op = build_kernel_op(11, &attrs(0, -1), || Ok(Some(3))).unwrap();
        assert_eq!(op, KernelOp::Gather { dim: 2 });
        let e = build_kernel_op(14, &attrs(0, 3), || Ok(Some(3))).unwrap_err();
        assert!(e.to_string().contains("argsort: dim"), "{e}");
    }

    #[test]
    fn scatter_accumulates_wide_only_when_told_float32() {
        let mut a = attrs(1, 0);
        let wide = |a: &DfuseAttrs| match build_kernel_op(12, a, || Ok(Some(1))).unwrap() {
            KernelOp::Scatter { wide, .. } => wide,
            _ => panic!("not a scatter"),
        };
        assert!(!wide(&a));
        a.has_dtype = 1;
        assert!(wide(&a), "dtype 0 is F32");
        a.dtype = 3;
        let e = build_kernel_op(12, &a, || Ok(Some(1))).unwrap_err();
        assert!(
            e.to_string().contains("accumulation dtype must be F32"),
            "{e}"
        );
    }

    #[test]
    fn scan_reads_its_dtype_only_when_told() {
        let mut a = attrs(1, 0);
        a.dtype = 1;
        let op = build_kernel_op(13, &a, || Ok(Some(1))).unwrap();
        assert!(matches!(
            op,
            KernelOp::Scan {
                dtype: None,
                op: ScanOp::Prod,
                ..
            }
        ));
        a.has_dtype = 1;
        let op = build_kernel_op(13, &a, || Ok(Some(1))).unwrap();
        assert!(matches!(
            op,
            KernelOp::Scan {
                dtype: Some(deferfuse_fusion::ir::DType::F64),
                ..
            }
        ));
    }

    #[test]
    fn random_takes_its_sizes_from_dims_and_never_asks_for_a_rank() {
        let mut a = attrs(1, 0);
        a.n_dims = 2;
        a.dims[..2].copy_from_slice(&[2, 3]);
        let op = build_kernel_op(15, &a, || unreachable!()).unwrap();
        assert!(matches!(op, KernelOp::Random { ref sizes, .. } if sizes.as_slice() == [2, 3]));
        a.dims[1] = -3;
        assert!(build_kernel_op(15, &a, || unreachable!()).is_err());
        a.sub_op = 2;
        let e = build_kernel_op(15, &a, || unreachable!()).unwrap_err();
        assert!(e.to_string().contains("not a DfuseRandomDist"), "{e}");
    }
}
