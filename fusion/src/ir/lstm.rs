//! The LSTM recurrence kernel op (`nn.LSTM`): every time step of one direction of one layer,
//! or its backward, as one op.
//!
//! Each step's hidden product waits on the step before, so nothing fuses across steps; recorded
//! step by step, a layer was ~10 ops per step forward and backward (a 2-layer LSTM over 64
//! steps ~6,900 ops a training step), and the host's recording, not the arithmetic, bounded
//! the step. As one op the recurrence is one program: the host records a handful of ops a
//! layer, and the steps run back to back in one host routine.
//!
//! The input products of all steps (`x @ W_ih^T + b_ih`) stay outside, one GEMM for the layer,
//! as do the weight gradients (one GEMM each over all steps), which read this op's results.

use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::infer::{ArgMeta, Inferred};
use super::kernel::tensor;
use super::layout::{fmt_dims, Dims};
use smallvec::smallvec;

/// Which half of the recurrence the op computes. `repr(u32)` with explicit numbers because the
/// C ABI passes them; append new values, never renumber.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LstmPart {
    /// The steps forward: operands `xg [T, B, 4H]` (each step's input product with `b_ih`),
    /// `w_hh_t [H, 4H]` (`W_hh` transposed, contiguous or not), `h0 [B, H]`, `c0 [B, H]` and
    /// optionally `b_hh [4H]`; result `[T, B, 6H]`: per step and sample the gates after their
    /// activations `i, f, g, o`, then the cell state `c` and the hidden state `h`.
    Forward = 0,
    /// The steps backward: operands the forward's result `[T, B, 6H]`, `c0 [B, H]`, `w_hh
    /// [4H, H]`, the gradients of the layer's output `dy [T, B, H]` and of its last
    /// states `dh [B, H]`, `dc [B, H]`; result `[T + 1, B, 4H]`: rows `0..T` each step's gate
    /// gradients before the activations (`di, df, dg, do`), row `T` the gradients of `h0` and
    /// `c0` in its first `2H` columns (the rest zero).
    Backward = 1,
}

impl LstmPart {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [LstmPart; 2] = [LstmPart::Forward, LstmPart::Backward];

    /// Decodes an ABI number; `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<LstmPart> {
        LstmPart::ALL.get(v as usize).copied()
    }

    fn operands(self) -> &'static [&'static str] {
        match self {
            LstmPart::Forward => &["xg", "w_hh_t", "h0", "c0", "b_hh"],
            LstmPart::Backward => &["steps", "c0", "w_hh", "dy", "dh", "dc"],
        }
    }
}

/// An LSTM recurrence part and the order its steps are walked in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lstm {
    /// Which part.
    pub part: LstmPart,
    /// The steps run from the last to the first (a bidirectional layer's second direction):
    /// step `t` follows step `t + 1`, and the first state feeds step `T - 1`.
    pub reverse: bool,
}

impl std::fmt::Display for Lstm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            ".{:?}{}",
            self.part,
            if self.reverse { ".reverse" } else { "" }
        )
    }
}

const NAME: &str = "lstm_recurrence";

/// An operand's expected shape, checked; `what` names it in the error.
fn expect_shape(i: usize, what: &str, got: (DType, &Dims), want: &[usize]) -> OpResult<()> {
    let (dtype, sizes) = got;
    if dtype == DType::F32 && sizes.as_slice() == want {
        return Ok(());
    }
    Err(OpError::new(
        NAME,
        format!("input {i} ({what})"),
        format!("float32 of shape {}", fmt_dims(want)),
        format!("dtype {dtype}, shape {}", fmt_dims(sizes)),
    ))
}

/// Output dtype and shape of LSTM part `k` over `args`, or why they do not fit. Float32 only:
/// the caller keeps other dtypes on the step-by-step path.
pub(super) fn infer_lstm(k: &Lstm, args: &[ArgMeta]) -> OpResult<Inferred> {
    let names = k.part.operands();
    let counts = match k.part {
        LstmPart::Forward => names.len() - 1..=names.len(),
        LstmPart::Backward => names.len()..=names.len(),
    };
    if !counts.contains(&args.len()) {
        return Err(OpError::new(
            NAME,
            "inputs",
            format!("{:?} operands ({})", counts, names.join(", ")),
            format!("{}", args.len()),
        ));
    }
    let mut ops = Vec::with_capacity(args.len());
    for (i, what) in names.iter().enumerate().take(args.len()) {
        ops.push(tensor(NAME, args, i, what)?);
    }
    let (d0, first) = ops[0];
    let (lanes, per_step) = match k.part {
        LstmPart::Forward => (4, "[T, B, 4H] (each step's input product)"),
        LstmPart::Backward => (6, "[T, B, 6H] (the forward's result)"),
    };
    if d0 != DType::F32 || first.len() != 3 || first[2] % lanes != 0 || first.contains(&0) {
        return Err(OpError::new(
            NAME,
            format!("input 0 ({})", names[0]),
            format!("a non-empty float32 {per_step}"),
            format!("dtype {d0}, shape {}", fmt_dims(first)),
        ));
    }
    let (t, b, h) = (first[0], first[1], first[2] / lanes);
    let sizes: Dims = match k.part {
        LstmPart::Forward => {
            expect_shape(1, names[1], ops[1], &[h, 4 * h])?;
            expect_shape(2, names[2], ops[2], &[b, h])?;
            expect_shape(3, names[3], ops[3], &[b, h])?;
            if let Some(&bias) = ops.get(4) {
                expect_shape(4, names[4], bias, &[4 * h])?;
            }
            smallvec![t, b, 6 * h]
        }
        LstmPart::Backward => {
            expect_shape(1, names[1], ops[1], &[b, h])?;
            expect_shape(2, names[2], ops[2], &[4 * h, h])?;
            expect_shape(3, names[3], ops[3], &[t, b, h])?;
            expect_shape(4, names[4], ops[4], &[b, h])?;
            expect_shape(5, names[5], ops[5], &[b, h])?;
            smallvec![t + 1, b, 4 * h]
        }
    };
    Ok(Inferred {
        dtype: DType::F32,
        sizes,
        compute: DType::F32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &[usize]) -> ArgMeta {
        ArgMeta::tensor(DType::F32, s)
    }

    const FORWARD: Lstm = Lstm {
        part: LstmPart::Forward,
        reverse: false,
    };
    const BACKWARD: Lstm = Lstm {
        part: LstmPart::Backward,
        reverse: true,
    };

    #[test]
    fn the_forward_keeps_four_gates_a_cell_and_a_hidden_state_per_step() {
        let r = infer_lstm(
            &FORWARD,
            &[t(&[5, 2, 12]), t(&[3, 12]), t(&[2, 3]), t(&[2, 3])],
        );
        assert_eq!(r.unwrap().sizes.as_slice(), &[5, 2, 18]);
    }

    #[test]
    fn the_forward_takes_an_optional_hidden_bias() {
        let args = [
            t(&[5, 2, 12]),
            t(&[3, 12]),
            t(&[2, 3]),
            t(&[2, 3]),
            t(&[12]),
        ];
        assert!(infer_lstm(&FORWARD, &args).is_ok());
    }

    #[test]
    fn the_backward_has_one_more_row_for_the_first_states_gradients() {
        let args = [
            t(&[5, 2, 18]),
            t(&[2, 3]),
            t(&[12, 3]),
            t(&[5, 2, 3]),
            t(&[2, 3]),
            t(&[2, 3]),
        ];
        assert_eq!(
            infer_lstm(&BACKWARD, &args).unwrap().sizes.as_slice(),
            &[6, 2, 12]
        );
    }

    #[test]
    fn a_weight_of_the_wrong_shape_is_named_with_the_shape_expected() {
        let e = infer_lstm(
            &FORWARD,
            &[t(&[5, 2, 12]), t(&[12, 3]), t(&[2, 3]), t(&[2, 3])],
        )
        .unwrap_err();
        assert_eq!(e.operand, "input 1 (w_hh_t)");
        assert!(e.expected.contains("[3, 12]"), "{}", e.expected);
    }

    #[test]
    fn float64_is_refused() {
        let args = [
            ArgMeta::tensor(DType::F64, &[5, 2, 12]),
            t(&[3, 12]),
            t(&[2, 3]),
            t(&[2, 3]),
        ];
        let e = infer_lstm(&FORWARD, &args).unwrap_err();
        assert_eq!(e.operand, "input 0 (xg)");
    }
}
