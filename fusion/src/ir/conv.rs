//! The dense convolution kernel op: `out = conv(x, w)` with one group, zero padding, dilation
//! and stride, computed without writing its columns.
//!
//! Composed from other ops, a convolution is im2col (a copy of `C * K` values per output
//! position) and a product, and its input gradient the transposed product (`C * K` values per
//! position written by a product whose contraction is only the output channels) scattered back
//! by K read-modify-write passes. At unit stride every kernel tap of a position is a fixed
//! offset into the zero-padded input, so a backend can copy each block of columns just before
//! the product reads it, from an input that stays in cache, and write only the output. The
//! input gradient of a stride-1 convolution is itself one: the output gradient convolved with
//! the weight transposed and flipped (`ConvPart::InputGrad`), padded by `span - 1 - padding`;
//! the weight gradient multiplies the same blocks of columns by their positions' gradient
//! (`ConvPart::WeightGrad`). At a larger stride the taps of a position are fixed offsets into
//! the padded input split by phase (element `p` of a dim strided by `s` lies in phase `p % s`
//! at `p / s`), so the forward and the weight gradient keep that shape; the input gradient of
//! a strided convolution is not a convolution of this kind: it is the product `W^T @ grad`
//! followed by `ConvPart::ColumnsToInput`, which adds each tap's column back where it was read
//! (col2im). Nothing fuses across it (its outputs depend on neighbouring
//! elements), so it is a kernel op: the planner cuts around it and a backend runs it as one
//! routine.

use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::infer::{ArgMeta, Inferred};
use super::kernel::tensor;
use super::layout::{fmt_dims, Dims};

const NAME: &str = "conv";

/// Which product of a dense convolution the op computes. `repr(u32)` with explicit
/// numbers because the C ABI passes them; append new values, never renumber.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvPart {
    /// `out = conv(x, w)`: operands x `[N, C, in...]` and w `[OC, C, k...]`; result `[N, OC,
    /// out...]`.
    Forward = 0,
    /// The forward of the weight transposed with every spatial dim reversed: operands x and a
    /// forward convolution's weight `[C, OC, k...]` (`C` being that convolution's output
    /// channels); result `[N, OC, out...]`. With x a stride-1 convolution's output gradient and
    /// padding `span - 1 -` its padding, this is its input gradient, with no transposing or
    /// flipping op recorded before it. Stride 1 only.
    InputGrad = 1,
    /// `d out / d w` summed over the batch: operands grad `[N, OC, out...]` and x `[N, C,
    /// in...]`; result `[OC, C, k...]` (the geometry's `kernel`).
    WeightGrad = 2,
    /// col2im, the last step of a strided convolution's input gradient (and so of a transposed
    /// convolution's forward): one operand, the gradient of the convolution's columns `[N, C,
    /// k..., out...]` (the product `W^T @ grad`, any strides), each tap's values added at the
    /// input positions it read. Result `[N, C, in...]`, `in` the geometry's `sizes`: at least
    /// the positions the windows cover, `(out - 1) * stride + dilation * (k - 1) + 1 - 2 *
    /// padding`, and less than a stride more (a convolution's input that the last window does
    /// not reach, or a transposed convolution's `output_padding`): those positions are zero.
    /// Each element sums its taps in the kernel's row-major tap order, starting from +0.0:
    /// the order of the strided adds it replaces, so the bits are theirs. Composed from
    /// strided adds it took K read-modify-write passes over the whole input with rows of a
    /// few elements; as one routine each `(n, c)` plane is summed in cache.
    ColumnsToInput = 3,
    /// im2col: one operand, x `[N, C, in...]` (any strides), whose windows are copied into
    /// columns `[C, k..., N, out...]` (`k` the geometry's `sizes`; zero where a window reads
    /// padding), the layout a product folding the batch into its columns reads without a
    /// copy. Composed from ops it was a padded copy of x and a window copy with rows of a few
    /// elements; one routine gathers each `(n, c)` plane from cache.
    InputToColumns = 4,
}

impl ConvPart {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [ConvPart; 5] = [
        ConvPart::Forward,
        ConvPart::InputGrad,
        ConvPart::WeightGrad,
        ConvPart::ColumnsToInput,
        ConvPart::InputToColumns,
    ];

    /// Decodes an ABI number; `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<ConvPart> {
        ConvPart::ALL.get(v as usize).copied()
    }
}

/// A dense convolution's part and geometry, per spatial dim (1 to 3 of them, all of the same
/// length): output position `o` of a dim reads input position `o * stride - padding + t *
/// dilation` for each tap `t < k` (the kernel's spatial size); positions outside the input
/// read zero. float32 only; `out = (in + 2 * padding - dilation * (k - 1) - 1) / stride + 1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv {
    /// Which product.
    pub part: ConvPart,
    /// Zero padding on both sides per spatial dim.
    pub padding: Dims,
    /// Spacing of the taps per spatial dim (at least 1).
    pub dilation: Dims,
    /// Spacing of the output positions over the input per spatial dim (at least 1; 1 for
    /// `InputGrad`).
    pub stride: Dims,
    /// The spatial sizes the operands do not hold: the kernel's for `WeightGrad` (its operands
    /// are the gradient and x) and `InputToColumns`, the input's for `ColumnsToInput` (its
    /// operand holds the output's); empty for the other parts.
    pub sizes: Dims,
}

impl Conv {
    /// The output size of each spatial dim for an input of spatial sizes `input` and a kernel
    /// of spatial sizes `kernel`, or the first dim whose padded input is shorter than its
    /// dilated kernel (or whose sizes overflow: the C ABI passes any 64-bit value).
    pub fn output_sizes(&self, input: &[usize], kernel: &[usize]) -> Result<Dims, usize> {
        (0..input.len())
            .map(|i| {
                let span = kernel[i]
                    .checked_sub(1)
                    .and_then(|k| self.dilation[i].checked_mul(k))
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
}

impl std::fmt::Display for Conv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            ".{:?}.p{:?}.d{:?}",
            self.part,
            self.padding.as_slice(),
            self.dilation.as_slice()
        )?;
        // Only when strided, so a stride-1 op prints (and names its programs) as before.
        if self.stride.iter().any(|&s| s != 1) {
            write!(f, ".s{:?}", self.stride.as_slice())?;
        }
        match self.part {
            ConvPart::WeightGrad | ConvPart::InputToColumns => {
                write!(f, ".k{:?}", self.sizes.as_slice())?
            }
            ConvPart::ColumnsToInput => write!(f, ".in{:?}", self.sizes.as_slice())?,
            _ => {}
        }
        Ok(())
    }
}

/// The error for spatial dim `i` of `input`, padded, shorter than `kernel` dilated.
fn too_short(k: &Conv, i: usize, input: &[usize], kernel: &[usize]) -> OpError {
    OpError::new(
        NAME,
        "geometry",
        format!("a padded input at least as long as the dilated kernel in spatial dim {i}"),
        format!(
            "input {} and kernel {} with {k}",
            fmt_dims(input),
            fmt_dims(kernel)
        ),
    )
}

/// Output dtype and shape of a dense convolution, or why it is invalid.
pub(super) fn infer_conv(k: &Conv, args: &[ArgMeta]) -> OpResult<Inferred> {
    let d = k.padding.len();
    let kernel_ok = match k.part {
        ConvPart::WeightGrad | ConvPart::ColumnsToInput | ConvPart::InputToColumns => {
            k.sizes.len() == d && !k.sizes.contains(&0)
        }
        _ => k.sizes.is_empty(),
    };
    if !(1..=3).contains(&d)
        || k.dilation.len() != d
        || k.dilation.contains(&0)
        || k.stride.len() != d
        || k.stride.contains(&0)
        || !kernel_ok
    {
        return Err(OpError::new(
            NAME,
            "geometry",
            "1 to 3 spatial dims, each with a padding, a dilation and a stride of at least 1 \
             (and, for the weight gradient and col2im, a kernel or input size of at least 1)",
            format!("{k}"),
        ));
    }
    if k.part == ConvPart::InputGrad && k.stride.iter().any(|&s| s != 1) {
        return Err(OpError::new(
            NAME,
            "geometry",
            "stride 1 for the input gradient (a strided convolution's input gradient is not a \
             convolution of this kind: compose it from a product and strided adds)",
            format!("{k}"),
        ));
    }
    match k.part {
        ConvPart::ColumnsToInput => return infer_columns_to_input(k, args),
        ConvPart::InputToColumns => return infer_input_to_columns(k, args),
        _ => {}
    }
    if args.len() != 2 {
        return Err(OpError::new(
            NAME,
            "inputs",
            "2 operands",
            format!("{}", args.len()),
        ));
    }
    let (first, second) = match k.part {
        ConvPart::Forward
        | ConvPart::InputGrad
        | ConvPart::ColumnsToInput
        | ConvPart::InputToColumns => ("x", "weight"),
        ConvPart::WeightGrad => ("grad", "x"),
    };
    let (d0, a) = tensor(NAME, args, 0, first)?;
    let (d1, b) = tensor(NAME, args, 1, second)?;
    // bfloat16 operands (autocast's) are summed in float32 and give a float32 result, which
    // the caller rounds once after adding a bias.
    let (want, allowed) = if d0 == DType::BF16 {
        (DType::BF16, "dtype bfloat16, as input 0's")
    } else {
        (
            DType::F32,
            "dtype float32 or bfloat16 (other dtypes take the im2col path)",
        )
    };
    for (i, what, dt) in [(0, first, d0), (1, second, d1)] {
        if dt != want {
            return Err(OpError::new(
                NAME,
                format!("input {i} ({what})"),
                allowed,
                format!("dtype {dt}"),
            ));
        }
    }
    let shape_of = |i: usize| match (i, k.part) {
        (0, ConvPart::WeightGrad) => "[N, OC, out...]",
        (0, _) | (1, ConvPart::WeightGrad) => "[N, C, spatial...]",
        (_, ConvPart::Forward) => "[OC, C, k...]",
        (_, _) => "[C, OC, k...] (a forward weight, read mirrored)",
    };
    for (i, what, s) in [(0, first, a), (1, second, b)] {
        if s.len() != d + 2 {
            return Err(OpError::new(
                NAME,
                format!("input {i} ({what})"),
                format!("{} dims {} for {d} spatial dims", d + 2, shape_of(i)),
                format!("shape {}", fmt_dims(s)),
            ));
        }
    }
    let sizes = match k.part {
        ConvPart::Forward
        | ConvPart::InputGrad
        | ConvPart::ColumnsToInput
        | ConvPart::InputToColumns => {
            // The weight's (output, input) channel dims, as stored.
            let (w_out, w_in) = if k.part == ConvPart::InputGrad {
                (1, 0)
            } else {
                (0, 1)
            };
            if b[w_in] != a[1] || b[2..].contains(&0) {
                return Err(OpError::new(
                    NAME,
                    "input 1 (weight)",
                    format!("{} with {} there and every k at least 1", shape_of(1), a[1]),
                    format!("shape {}", fmt_dims(b)),
                ));
            }
            let out = k
                .output_sizes(&a[2..], &b[2..])
                .map_err(|i| too_short(k, i, &a[2..], &b[2..]))?;
            let mut sizes = Dims::from_slice(&[a[0], b[w_out]]);
            sizes.extend_from_slice(&out);
            sizes
        }
        ConvPart::WeightGrad => {
            let out = k
                .output_sizes(&b[2..], &k.sizes)
                .map_err(|i| too_short(k, i, &b[2..], &k.sizes))?;
            if a[0] != b[0] || a[2..] != out[..] {
                return Err(OpError::new(
                    NAME,
                    "input 0 (grad)",
                    format!(
                        "[{}, OC, {}] (x's batch, the output's size)",
                        b[0],
                        fmt_dims(&out)
                    ),
                    format!("shape {}", fmt_dims(a)),
                ));
            }
            let mut sizes = Dims::from_slice(&[a[1], b[1]]);
            sizes.extend_from_slice(&k.sizes);
            sizes
        }
    };
    Ok(Inferred {
        dtype: DType::F32,
        sizes,
        compute: DType::F32,
    })
}

/// The dtype and shape of im2col's or col2im's one operand (`what`: its description and its
/// short name in errors), which must have one of `dtypes` (`allowed` says them in words), or
/// why not; `otherwise` names the path other dtypes take.
fn one_operand<'a>(
    args: &'a [ArgMeta],
    what: (&str, &str),
    (dtypes, allowed): (&[DType], &str),
    otherwise: &str,
) -> OpResult<(DType, &'a [usize])> {
    if args.len() != 1 {
        return Err(OpError::new(
            NAME,
            "inputs",
            format!("1 operand ({})", what.0),
            format!("{}", args.len()),
        ));
    }
    let (dt, a) = tensor(NAME, args, 0, what.1)?;
    if !dtypes.contains(&dt) {
        return Err(OpError::new(
            NAME,
            format!("input 0 ({})", what.1),
            format!("dtype {allowed} (other dtypes take the {otherwise})"),
            format!("dtype {dt}"),
        ));
    }
    Ok((dt, a))
}

/// `ConvPart::ColumnsToInput`'s result: `[N, C, in...]` from columns `[N, C, k..., out...]`.
fn infer_columns_to_input(k: &Conv, args: &[ArgMeta]) -> OpResult<Inferred> {
    let d = k.padding.len();
    let float32 = (&[DType::F32][..], "float32");
    let (_, a) = one_operand(
        args,
        ("the columns' gradient", "columns"),
        float32,
        "strided adds",
    )?;
    if a.len() != 2 * d + 2 || a[2..2 + d].contains(&0) {
        return Err(OpError::new(
            NAME,
            "input 0 (columns)",
            format!(
                "{} dims [N, C, k..., out...] for {d} spatial dims, every k at least 1",
                2 * d + 2
            ),
            format!("shape {}", fmt_dims(a)),
        ));
    }
    for i in 0..d {
        let (kernel, out, input) = (a[2 + i], a[2 + d + i], k.sizes[i]);
        // The positions the windows cover, (out - 1) * stride + dilation * (k - 1) + 1, against
        // the padded input, in checked steps (the C ABI passes any 64-bit value).
        let covered = out
            .checked_sub(1)
            .and_then(|o| o.checked_mul(k.stride[i]))
            .and_then(|o| o.checked_add(k.dilation[i].checked_mul(kernel - 1)?))
            .and_then(|o| o.checked_add(1));
        let padded = k.padding[i]
            .checked_mul(2)
            .and_then(|p| p.checked_add(input));
        let fits = matches!((covered, padded), (Some(c), Some(p)) if c <= p && p - c < k.stride[i]
            && c > 2 * k.padding[i]);
        if !fits {
            return Err(OpError::new(
                NAME,
                "geometry",
                format!(
                    "windows that cover the padded input but for less than a stride, and more \
                     than its padding, in spatial dim {i}"
                ),
                format!("columns {} with {k}", fmt_dims(a)),
            ));
        }
    }
    let mut sizes = Dims::from_slice(&a[..2]);
    sizes.extend_from_slice(&k.sizes);
    Ok(Inferred {
        dtype: DType::F32,
        sizes,
        compute: DType::F32,
    })
}

/// `ConvPart::InputToColumns`'s result: `[C, k..., N, out...]` from x `[N, C, in...]`, of x's
/// dtype (a copy: float32, bfloat16 or float16).
fn infer_input_to_columns(k: &Conv, args: &[ArgMeta]) -> OpResult<Inferred> {
    let d = k.padding.len();
    let floats = (
        &[DType::F32, DType::BF16, DType::F16][..],
        "float32, bfloat16 or float16",
    );
    let (dtype, a) = one_operand(args, ("x", "x"), floats, "window copy")?;
    if a.len() != d + 2 {
        return Err(OpError::new(
            NAME,
            "input 0 (x)",
            format!("{} dims [N, C, spatial...] for {d} spatial dims", d + 2),
            format!("shape {}", fmt_dims(a)),
        ));
    }
    let out = k
        .output_sizes(&a[2..], &k.sizes)
        .map_err(|i| too_short(k, i, &a[2..], &k.sizes))?;
    let mut sizes = Dims::from_slice(&[a[1]]);
    sizes.extend_from_slice(&k.sizes);
    sizes.push(a[0]);
    sizes.extend_from_slice(&out);
    Ok(Inferred {
        dtype,
        sizes,
        compute: dtype,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{infer, KernelOp, Op};
    use smallvec::smallvec;

    fn conv(p: usize, d: usize) -> Op {
        Op::Kernel(KernelOp::Conv(Box::new(Conv {
            part: ConvPart::Forward,
            padding: smallvec![p, p],
            dilation: smallvec![d, d],
            stride: smallvec![1, 1],
            sizes: Dims::new(),
        })))
    }

    fn t(s: &[usize]) -> ArgMeta {
        ArgMeta::tensor(DType::F32, s)
    }

    #[test]
    fn the_output_has_the_weight_s_channels_and_torch_s_stride_1_size() {
        let r = infer(&conv(1, 1), &[t(&[2, 8, 15, 16]), t(&[4, 8, 3, 3])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[2, 4, 15, 16]);
        let r = infer(&conv(0, 2), &[t(&[2, 8, 15, 16]), t(&[4, 8, 3, 3])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[2, 4, 11, 12]);
    }

    #[test]
    fn a_strided_output_has_torch_s_size() {
        // torch: (in + 2p - d(k-1) - 1) / s + 1, rounded down.
        let op = |s: usize| {
            Op::Kernel(KernelOp::Conv(Box::new(Conv {
                part: ConvPart::Forward,
                padding: smallvec![1, 0],
                dilation: smallvec![1, 1],
                stride: smallvec![s, 3],
                sizes: Dims::new(),
            })))
        };
        let r = infer(&op(2), &[t(&[2, 8, 64, 3199]), t(&[4, 8, 3, 3])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[2, 4, 32, 1066]);
        let r = infer(&op(5), &[t(&[1, 1, 16000, 10]), t(&[4, 1, 10, 3])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[1, 4, 3199, 3]);
    }

    #[test]
    fn a_strided_input_gradient_or_a_zero_stride_is_refused() {
        let op = |part: ConvPart, s: usize| {
            Op::Kernel(KernelOp::Conv(Box::new(Conv {
                part,
                padding: smallvec![1, 1],
                dilation: smallvec![1, 1],
                stride: smallvec![1, s],
                sizes: Dims::new(),
            })))
        };
        let (x, w) = (t(&[2, 8, 15, 16]), t(&[8, 4, 3, 3]));
        let e = infer(&op(ConvPart::InputGrad, 2), &[x.clone(), w.clone()]).unwrap_err();
        assert!(
            e.expected.contains("stride 1 for the input gradient"),
            "{e}"
        );
        let e = infer(&op(ConvPart::Forward, 0), &[x, w]).unwrap_err();
        assert_eq!(e.operand, "geometry");
    }

    #[test]
    fn a_mirrored_weight_gives_its_second_dim_s_channels() {
        let op = Op::Kernel(KernelOp::Conv(Box::new(Conv {
            part: ConvPart::InputGrad,
            padding: smallvec![1, 1],
            dilation: smallvec![1, 1],
            stride: smallvec![1, 1],
            sizes: Dims::new(),
        })));
        let r = infer(&op, &[t(&[2, 8, 15, 16]), t(&[8, 4, 3, 3])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[2, 4, 15, 16]);
        let e = infer(&op, &[t(&[2, 8, 15, 16]), t(&[4, 8, 3, 3])]).unwrap_err();
        assert!(e.expected.contains("read mirrored"), "{e}");
    }

    #[test]
    fn the_weight_gradient_has_the_weight_s_shape_and_checks_the_gradient_s() {
        let op = Op::Kernel(KernelOp::Conv(Box::new(Conv {
            part: ConvPart::WeightGrad,
            padding: smallvec![1, 0],
            dilation: smallvec![1, 1],
            stride: smallvec![1, 1],
            sizes: smallvec![3, 5],
        })));
        let r = infer(&op, &[t(&[2, 4, 15, 12]), t(&[2, 8, 15, 16])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[4, 8, 3, 5]);
        let e = infer(&op, &[t(&[2, 4, 15, 16]), t(&[2, 8, 15, 16])]).unwrap_err();
        assert_eq!(e.operand, "input 0 (grad)");
    }

    /// An im2col or col2im op (`part`) of padding `p`, stride `s`, dilation `d` and the sizes its
    /// operand does not hold (the kernel's or the input's).
    fn columns_op(part: ConvPart, p: usize, s: usize, d: usize, sizes: [usize; 2]) -> Op {
        Op::Kernel(KernelOp::Conv(Box::new(Conv {
            part,
            padding: smallvec![p, p],
            dilation: smallvec![d, d],
            stride: smallvec![s, s],
            sizes: smallvec![sizes[0], sizes[1]],
        })))
    }

    fn columns_to_input(p: usize, s: usize, d: usize, input: [usize; 2]) -> Op {
        columns_op(ConvPart::ColumnsToInput, p, s, d, input)
    }

    #[test]
    fn columns_go_back_to_the_input_their_windows_read() {
        // A transposed convolution's 4x4 stride-2 padding-1 upsampling: 7x7 -> 14x14.
        let op = columns_to_input(1, 2, 1, [14, 14]);
        let r = infer(&op, &[t(&[64, 32, 4, 4, 7, 7])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[64, 32, 14, 14]);
        // The same windows over a 15x15 input, whose last row and column none reads.
        let op = columns_to_input(1, 2, 1, [15, 14]);
        assert_eq!(infer(&op, &[t(&[1, 1, 4, 4, 7, 7])]).unwrap().sizes[2], 15);
    }

    #[test]
    fn an_input_the_windows_do_not_fit_is_refused() {
        for input in [[13, 14], [16, 14]] {
            let op = columns_to_input(1, 2, 1, input);
            let e = infer(&op, &[t(&[1, 1, 4, 4, 7, 7])]).unwrap_err();
            assert!(e.expected.contains("spatial dim 0"), "{e}");
        }
        // Windows over nothing but padding.
        let op = columns_to_input(2, 1, 1, [1, 1]);
        assert_eq!(
            infer(&op, &[t(&[1, 1, 2, 2, 1, 1])]).unwrap_err().operand,
            "geometry"
        );
    }

    #[test]
    fn columns_of_another_rank_or_a_second_operand_are_refused() {
        let op = columns_to_input(1, 2, 1, [14, 14]);
        let e = infer(&op, &[t(&[64, 32, 4, 4, 7])]).unwrap_err();
        assert_eq!(e.operand, "input 0 (columns)");
        let two = [t(&[1, 1, 2, 2, 3, 3]), t(&[1, 1, 2, 2, 3, 3])];
        assert_eq!(infer(&op, &two).unwrap_err().operand, "inputs");
    }

    #[test]
    fn columns_of_an_input_are_laid_out_channels_taps_batch_positions() {
        let op = columns_op(ConvPart::InputToColumns, 1, 2, 1, [4, 4]);
        let r = infer(&op, &[t(&[32, 64, 8, 8])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[64, 4, 4, 32, 4, 4]);
        let e = infer(&op, &[t(&[32, 64, 1, 1])]).unwrap_err();
        assert!(e.expected.contains("spatial dim 0"), "{e}");
        let e = infer(&op, &[t(&[32, 64, 8])]).unwrap_err();
        assert_eq!(e.operand, "input 0 (x)");
    }

    #[test]
    fn a_weight_of_another_input_channel_count_is_named() {
        let e = infer(&conv(1, 1), &[t(&[2, 8, 6, 6]), t(&[4, 3, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "input 1 (weight)");
        assert!(e.expected.contains("[OC, C, k...] with 8 there"), "{e}");
    }

    #[test]
    fn a_kernel_longer_than_the_padded_input_is_refused() {
        let e = infer(&conv(0, 1), &[t(&[1, 2, 5, 9]), t(&[2, 2, 7, 7])]).unwrap_err();
        assert!(e.expected.contains("spatial dim 0"), "{e}");
    }

    #[test]
    fn other_dtypes_are_refused_naming_the_operand() {
        let h = ArgMeta::tensor(DType::F16, &[1, 2, 4, 4]);
        let e = infer(&conv(1, 1), &[h, t(&[2, 2, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "input 0 (x)");
    }

    #[test]
    fn bfloat16_operands_give_a_float32_result() {
        let b = |s: &[usize]| ArgMeta::tensor(DType::BF16, s);
        let r = infer(&conv(1, 1), &[b(&[2, 3, 8, 8]), b(&[4, 3, 3, 3])]).unwrap();
        assert_eq!((r.dtype, r.compute), (DType::F32, DType::F32));
        assert_eq!(r.sizes.as_slice(), &[2, 4, 8, 8]);
    }

    #[test]
    fn a_bfloat16_input_with_a_float32_weight_is_refused_naming_the_weight() {
        let x = ArgMeta::tensor(DType::BF16, &[2, 3, 8, 8]);
        let e = infer(&conv(1, 1), &[x, t(&[4, 3, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "input 1 (weight)");
        assert!(e.expected.contains("bfloat16"), "{e}");
    }

    #[test]
    fn a_zero_dilation_or_a_geometry_of_another_rank_is_refused() {
        let e = infer(&conv(1, 0), &[t(&[1, 2, 4, 4]), t(&[2, 2, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "geometry");
        let e = infer(&conv(1, 1), &[t(&[1, 2, 4]), t(&[2, 2, 3])]).unwrap_err();
        assert_eq!(e.operand, "input 0 (x)");
    }
}
