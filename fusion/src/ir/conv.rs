//! The dense stride-1 convolution kernel op: `out = conv(x, w)` with one group, unit stride,
//! zero padding and dilation, computed without writing its columns.
//!
//! Composed from other ops, a convolution is im2col (a copy of `C * K` values per output
//! position) and a product, and its input gradient the transposed product (`C * K` values per
//! position written by a product whose contraction is only the output channels) scattered back
//! by K read-modify-write passes. At unit stride every kernel tap of a position is a fixed
//! offset into the zero-padded input, so a backend can copy each block of columns just before
//! the product reads it, from an input that stays in cache, and write only the output. The
//! input gradient of a stride-1 convolution is itself one: the output gradient convolved with
//! the weight transposed and flipped (`Conv::mirrored`), padded by `span - 1 - padding`; the
//! PyTorch frontend uses the op for that gradient (its forward keeps im2col, whose columns the
//! weight gradient reuses). Nothing fuses across it (its outputs depend on neighbouring
//! elements), so it is a kernel op: the planner cuts around it and a backend runs it as one
//! routine.

use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::infer::{ArgMeta, Inferred};
use super::kernel::tensor;
use super::layout::{fmt_dims, Dims};

const NAME: &str = "conv";

/// A dense stride-1 convolution's geometry, per spatial dim (1 to 3 of them, all of the same
/// length): output position `o` of a dim reads input position `o - padding + t * dilation` for
/// each tap `t < kernel` (the weight's spatial size); positions outside the input read zero.
/// Operands: x `[N, C, in...]` and w `[OC, C, k...]`, float32; result `[N, OC, out...]` with
/// `out = in + 2 * padding - dilation * (k - 1)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv {
    /// Zero padding on both sides per spatial dim.
    pub padding: Dims,
    /// Spacing of the taps per spatial dim (at least 1).
    pub dilation: Dims,
    /// The weight is given as `[C, OC, k...]` (a forward convolution's weight, `C` here being
    /// its output channels) and read transposed with every spatial dim reversed: the op is
    /// then that convolution's input gradient (x its output gradient, padding `span - 1 -` its
    /// padding), with no transposing or flipping op recorded before it.
    pub mirrored: bool,
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
                    (Some(span), Some(padded)) if padded >= span => Ok(padded - span + 1),
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
            ".p{:?}.d{:?}{}",
            self.padding.as_slice(),
            self.dilation.as_slice(),
            if self.mirrored { ".mirrored" } else { "" }
        )
    }
}

/// Output dtype and shape of a dense stride-1 convolution, or why it is invalid.
pub(super) fn infer_conv(k: &Conv, args: &[ArgMeta]) -> OpResult<Inferred> {
    let d = k.padding.len();
    if !(1..=3).contains(&d) || k.dilation.len() != d || k.dilation.contains(&0) {
        return Err(OpError::new(
            NAME,
            "geometry",
            "1 to 3 spatial dims, each with a padding and a dilation of at least 1",
            format!("{k}"),
        ));
    }
    if args.len() != 2 {
        return Err(OpError::new(
            NAME,
            "inputs",
            "2 operands (x, weight)",
            format!("{}", args.len()),
        ));
    }
    let (dx, x) = tensor(NAME, args, 0, "x")?;
    let (dw, w) = tensor(NAME, args, 1, "weight")?;
    for (i, what, dt) in [(0, "x", dx), (1, "weight", dw)] {
        if dt != DType::F32 {
            return Err(OpError::new(
                NAME,
                format!("input {i} ({what})"),
                "dtype float32 (other dtypes take the im2col path)",
                format!("dtype {dt}"),
            ));
        }
    }
    // The weight's (output, input) channel dims, as stored.
    let (w_out, w_in) = if k.mirrored { (1, 0) } else { (0, 1) };
    for (i, what, s) in [(0, "x", x), (1, "weight", w)] {
        if s.len() != d + 2 {
            let dims = match (i, k.mirrored) {
                (0, _) => "[N, C, spatial...]",
                (_, false) => "[OC, C, k...]",
                (_, true) => "[C, OC, k...] (mirrored)",
            };
            return Err(OpError::new(
                NAME,
                format!("input {i} ({what})"),
                format!("{} dims {dims} for {d} spatial dims", d + 2),
                format!("shape {}", fmt_dims(s)),
            ));
        }
    }
    if w[w_in] != x[1] || w[2..].contains(&0) {
        let want = match k.mirrored {
            false => format!("[OC, {}, k...]", x[1]),
            true => format!("[{}, OC, k...] (mirrored)", x[1]),
        };
        return Err(OpError::new(
            NAME,
            "input 1 (weight)",
            format!("{want} with every k at least 1"),
            format!("shape {}", fmt_dims(w)),
        ));
    }
    let out = k.output_sizes(&x[2..], &w[2..]).map_err(|i| {
        OpError::new(
            NAME,
            "geometry",
            format!("a padded input at least as long as the dilated kernel in spatial dim {i}"),
            format!("input {} and weight {} with {k}", fmt_dims(x), fmt_dims(w)),
        )
    })?;
    let mut sizes = Dims::from_slice(&[x[0], w[w_out]]);
    sizes.extend_from_slice(&out);
    Ok(Inferred {
        dtype: DType::F32,
        sizes,
        compute: DType::F32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{infer, KernelOp, Op};
    use smallvec::smallvec;

    fn conv(p: usize, d: usize) -> Op {
        Op::Kernel(KernelOp::Conv(Box::new(Conv {
            padding: smallvec![p, p],
            dilation: smallvec![d, d],
            mirrored: false,
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
    fn a_mirrored_weight_gives_its_second_dim_s_channels() {
        let op = Op::Kernel(KernelOp::Conv(Box::new(Conv {
            padding: smallvec![1, 1],
            dilation: smallvec![1, 1],
            mirrored: true,
        })));
        let r = infer(&op, &[t(&[2, 8, 15, 16]), t(&[8, 4, 3, 3])]).unwrap();
        assert_eq!(r.sizes.as_slice(), &[2, 4, 15, 16]);
        let e = infer(&op, &[t(&[2, 8, 15, 16]), t(&[4, 8, 3, 3])]).unwrap_err();
        assert!(e.expected.contains("[8, OC, k...] (mirrored)"), "{e}");
    }

    #[test]
    fn a_weight_of_another_input_channel_count_is_named() {
        let e = infer(&conv(1, 1), &[t(&[2, 8, 6, 6]), t(&[4, 3, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "input 1 (weight)");
        assert!(e.expected.contains("[OC, 8, k...]"), "{e}");
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
    fn a_zero_dilation_or_a_geometry_of_another_rank_is_refused() {
        let e = infer(&conv(1, 0), &[t(&[1, 2, 4, 4]), t(&[2, 2, 3, 3])]).unwrap_err();
        assert_eq!(e.operand, "geometry");
        let e = infer(&conv(1, 1), &[t(&[1, 2, 4]), t(&[2, 2, 3])]).unwrap_err();
        assert_eq!(e.operand, "input 0 (x)");
    }
}
