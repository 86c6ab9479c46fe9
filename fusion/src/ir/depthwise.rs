//! The depthwise convolution kernel op: one input and one output channel per group (MobileNet,
//! EfficientNet, ConvNeXt), its forward and its two gradients.
//!
//! Composed from other ops, a depthwise convolution is either im2col (K values copied per input
//! element for a product of one row) or a sum over the K kernel taps of a shifted view times the
//! tap's weight: K multiply-adds per element through K loads of K views, and a weight gradient
//! that still needed the columns. Run directly, each output element is K multiply-adds over a
//! few rows of its channel that stay in L1, and the weight gradient is K dot products per
//! channel. Nothing fuses across it (its outputs depend on neighbouring elements), so it is a
//! kernel op: the planner cuts around it and a backend runs it as one routine.

use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::infer::{ArgMeta, Inferred};
use super::layout::{fmt_dims, Dims};

/// Which product of a depthwise convolution the op computes. `repr(u32)` with explicit numbers
/// because the C ABI passes them; append new values, never renumber.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DepthwisePart {
    /// `out = conv(x, w)`: operands x `[N, C, in...]` and w `[C, 1, k...]`; result `[N, C,
    /// out...]`.
    Forward = 0,
    /// `d out / d x`: operands grad `[N, C, out...]` and w `[C, 1, k...]`; result `[N, C,
    /// in...]` (the geometry's `input` sizes: with a stride above 1 the output's size does not
    /// determine the input's).
    InputGrad = 1,
    /// `d out / d w`: operands grad `[N, C, out...]` and x `[N, C, in...]`; result `[C, 1,
    /// k...]`.
    WeightGrad = 2,
}

impl DepthwisePart {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [DepthwisePart; 3] = [
        DepthwisePart::Forward,
        DepthwisePart::InputGrad,
        DepthwisePart::WeightGrad,
    ];

    /// Decodes an ABI number; `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<DepthwisePart> {
        DepthwisePart::ALL.get(v as usize).copied()
    }
}

/// A depthwise convolution's part and geometry, per spatial dim (1 to 3 of them, all of the
/// same length): the output position `o` of a dim reads input position `o * stride - padding +
/// t * dilation` for each tap `t < kernel`; positions outside the input read zero.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Depthwise {
    /// Which product.
    pub part: DepthwisePart,
    /// Kernel taps per spatial dim.
    pub kernel: Dims,
    /// Stride per spatial dim (at least 1).
    pub stride: Dims,
    /// Zero padding on both sides per spatial dim.
    pub padding: Dims,
    /// Spacing of the taps per spatial dim (at least 1).
    pub dilation: Dims,
    /// The input's spatial sizes; read by `InputGrad` only (empty for the other parts).
    pub input: Dims,
}

impl Depthwise {
    /// The output size of each spatial dim for an input of spatial sizes `input`, or the first
    /// dim whose (padded) input is shorter than its dilated kernel (or whose sizes overflow:
    /// the C ABI passes any non-negative 64-bit value).
    pub fn output_sizes(&self, input: &[usize]) -> Result<Dims, usize> {
        (0..input.len())
            .map(|i| {
                let span = self.dilation[i]
                    .checked_mul(self.kernel[i] - 1)
                    .and_then(|s| s.checked_add(1));
                let padded = self.padding[i]
                    .checked_mul(2)
                    .and_then(|p| p.checked_add(input[i]));
                match (span, padded) {
                    (Some(span), Some(padded)) if padded >= span => {
                        Ok((padded - span) / self.stride[i] + 1)
                    }
                    _ => Err(i),
                }
            })
            .collect()
    }

    /// The taps of one channel: the product of the kernel sizes.
    pub fn taps(&self) -> usize {
        self.kernel.iter().product()
    }
}

impl std::fmt::Display for Depthwise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            ".{:?}.k{:?}.s{:?}.p{:?}.d{:?}",
            self.part,
            self.kernel.as_slice(),
            self.stride.as_slice(),
            self.padding.as_slice(),
            self.dilation.as_slice()
        )?;
        if self.part == DepthwisePart::InputGrad {
            write!(f, ".in{:?}", self.input.as_slice())?;
        }
        Ok(())
    }
}

/// The op's two tensor operands, or an error naming the missing one.
fn operand<'a>(args: &'a [ArgMeta], i: usize, what: &str) -> OpResult<(DType, &'a Dims)> {
    match args.get(i) {
        Some(ArgMeta::Tensor { dtype, sizes }) => Ok((*dtype, sizes)),
        other => Err(OpError::new(
            "depthwise_conv",
            format!("input {i} ({what})"),
            "a tensor",
            match other {
                Some(a) => format!("{a:?}"),
                None => "nothing".into(),
            },
        )),
    }
}

/// Output dtype and shape of a depthwise convolution part, or why it is invalid.
pub(super) fn infer_depthwise(k: &Depthwise, args: &[ArgMeta]) -> OpResult<Inferred> {
    let name = "depthwise_conv";
    let d = k.kernel.len();
    let geometry_ok = (1..=3).contains(&d)
        && [&k.stride, &k.padding, &k.dilation]
            .iter()
            .all(|v| v.len() == d)
        && k.kernel.iter().all(|&x| x >= 1)
        && k.stride.iter().all(|&x| x >= 1)
        && k.dilation.iter().all(|&x| x >= 1)
        // The input sizes belong to the input gradient alone: two ops that differ only in an
        // ignored field would compare unequal yet print alike.
        && k.input.len() == if k.part == DepthwisePart::InputGrad { d } else { 0 };
    if !geometry_ok {
        return Err(OpError::new(
            name,
            "geometry",
            "1 to 3 spatial dims, each with a kernel, stride and dilation of at least 1 (and, \
             for the input gradient, the input's size)",
            format!("{k}"),
        ));
    }
    if args.len() != 2 {
        return Err(OpError::new(
            name,
            "inputs",
            "2 operands",
            format!("{}", args.len()),
        ));
    }
    let (first, second) = match k.part {
        DepthwisePart::Forward => ("x", "weight"),
        DepthwisePart::InputGrad => ("grad", "weight"),
        DepthwisePart::WeightGrad => ("grad", "x"),
    };
    let (dt0, s0) = operand(args, 0, first)?;
    let (dt1, s1) = operand(args, 1, second)?;
    if !dt0.is_float() {
        return Err(OpError::new(
            name,
            format!("input 0 ({first})"),
            "a floating dtype",
            format!("dtype {dt0}"),
        ));
    }
    if dt1 != dt0 {
        return Err(OpError::new(
            name,
            format!("input 1 ({second})"),
            format!("dtype {dt0} (the dtype of input 0)"),
            format!("dtype {dt1}"),
        ));
    }
    if s0.len() != d + 2 {
        return Err(OpError::new(
            name,
            format!("input 0 ({first})"),
            format!("{} dims [N, C, {d} spatial]", d + 2),
            format!("shape {}", fmt_dims(s0)),
        ));
    }
    let (n, c) = (s0[0], s0[1]);
    let mut weight: Dims = Dims::from_slice(&[c, 1]);
    weight.extend_from_slice(&k.kernel);
    let batch_channels = |spatial: &[usize]| -> Dims {
        let mut v = Dims::from_slice(&[n, c]);
        v.extend_from_slice(spatial);
        v
    };
    let too_short = |i: usize, input: &[usize]| {
        OpError::new(
            name,
            "geometry",
            format!("a padded input at least as long as the dilated kernel in spatial dim {i}"),
            format!("input {} with {k}", fmt_dims(input)),
        )
    };
    let expect = |i: usize, what: &str, want: &Dims, got: &Dims| -> OpResult<()> {
        if want == got {
            Ok(())
        } else {
            Err(OpError::new(
                name,
                format!("input {i} ({what})"),
                format!("shape {}", fmt_dims(want)),
                format!("shape {}", fmt_dims(got)),
            ))
        }
    };
    let sizes = match k.part {
        DepthwisePart::Forward => {
            expect(1, second, &weight, s1)?;
            let out = k
                .output_sizes(&s0[2..])
                .map_err(|i| too_short(i, &s0[2..]))?;
            batch_channels(&out)
        }
        DepthwisePart::InputGrad => {
            expect(1, second, &weight, s1)?;
            let out = k
                .output_sizes(&k.input)
                .map_err(|i| too_short(i, &k.input))?;
            expect(0, first, &batch_channels(&out), s0)?;
            batch_channels(&k.input)
        }
        DepthwisePart::WeightGrad => {
            if s1.len() != d + 2 {
                return Err(OpError::new(
                    name,
                    format!("input 1 ({second})"),
                    format!("{} dims [N, C, {d} spatial]", d + 2),
                    format!("shape {}", fmt_dims(s1)),
                ));
            }
            let out = k
                .output_sizes(&s1[2..])
                .map_err(|i| too_short(i, &s1[2..]))?;
            expect(0, first, &batch_channels(&out), s0)?;
            if s1[..2] != s0[..2] {
                return Err(OpError::new(
                    name,
                    format!("input 1 ({second})"),
                    format!("batch and channels {}", fmt_dims(&s0[..2])),
                    format!("shape {}", fmt_dims(s1)),
                ));
            }
            weight
        }
    };
    Ok(Inferred {
        dtype: dt0,
        sizes,
        compute: dt0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{infer, KernelOp, Op};
    use smallvec::smallvec;

    fn conv(part: DepthwisePart, k: usize, s: usize, p: usize, input: &[usize]) -> Op {
        Op::Kernel(KernelOp::Depthwise(Box::new(Depthwise {
            part,
            kernel: smallvec![k, k],
            stride: smallvec![s, s],
            padding: smallvec![p, p],
            dilation: smallvec![1, 1],
            input: Dims::from_slice(input),
        })))
    }

    fn t(s: &[usize]) -> ArgMeta {
        ArgMeta::tensor(DType::F32, s)
    }

    #[test]
    fn the_forward_gives_torch_s_output_size() {
        let op = conv(DepthwisePart::Forward, 3, 2, 1, &[]);
        let r = infer(&op, &[t(&[2, 8, 15, 16]), t(&[8, 1, 3, 3])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[2, 8, 8, 8]);
    }

    #[test]
    fn the_input_gradient_takes_the_input_size_it_is_given() {
        let op = conv(DepthwisePart::InputGrad, 3, 2, 1, &[15, 16]);
        let r = infer(&op, &[t(&[2, 8, 8, 8]), t(&[8, 1, 3, 3])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[2, 8, 15, 16]);
        let e = infer(&op, &[t(&[2, 8, 7, 8]), t(&[8, 1, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "input 0 (grad)");
    }

    #[test]
    fn the_weight_gradient_has_the_weight_s_shape() {
        let op = conv(DepthwisePart::WeightGrad, 7, 1, 3, &[]);
        let r = infer(&op, &[t(&[2, 48, 16, 16]), t(&[2, 48, 16, 16])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[48, 1, 7, 7]);
    }

    #[test]
    fn a_weight_of_another_channel_count_is_named() {
        let op = conv(DepthwisePart::Forward, 3, 1, 1, &[]);
        let e = infer(&op, &[t(&[2, 8, 6, 6]), t(&[4, 1, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "input 1 (weight)");
        assert!(e.expected.contains("[8, 1, 3, 3]"), "{e}");
    }

    #[test]
    fn a_kernel_longer_than_the_padded_input_is_refused() {
        let op = conv(DepthwisePart::Forward, 7, 1, 0, &[]);
        let e = infer(&op, &[t(&[1, 2, 5, 9]), t(&[2, 1, 7, 7])]).unwrap_err();
        assert!(e.expected.contains("spatial dim 0"), "{e}");
    }

    #[test]
    fn input_sizes_are_refused_outside_the_input_gradient() {
        let op = conv(DepthwisePart::Forward, 3, 1, 1, &[6, 6]);
        let e = infer(&op, &[t(&[1, 2, 6, 6]), t(&[2, 1, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "geometry");
    }

    #[test]
    fn a_geometry_whose_sizes_overflow_is_refused() {
        let Op::Kernel(KernelOp::Depthwise(mut k)) = conv(DepthwisePart::Forward, 3, 1, 1, &[])
        else {
            unreachable!()
        };
        k.dilation = smallvec![usize::MAX / 2, 1];
        let op = Op::Kernel(KernelOp::Depthwise(k));
        let e = infer(&op, &[t(&[1, 2, 6, 6]), t(&[2, 1, 3, 3])]).unwrap_err();
        assert!(e.expected.contains("spatial dim 0"), "{e}");
    }

    #[test]
    fn integer_operands_and_zero_strides_are_refused() {
        let op = conv(DepthwisePart::Forward, 3, 1, 1, &[]);
        let i = ArgMeta::tensor(DType::I64, &[1, 2, 4, 4]);
        assert!(infer(&op, &[i, t(&[2, 1, 3, 3])]).is_err());
        let op = conv(DepthwisePart::Forward, 3, 0, 1, &[]);
        let e = infer(&op, &[t(&[1, 2, 4, 4]), t(&[2, 1, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "geometry");
    }
}
