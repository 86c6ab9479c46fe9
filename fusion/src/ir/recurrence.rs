//! The recurrence kernel op (`nn.LSTM`, `nn.GRU`, `nn.RNN`): every time step of one direction
//! of one layer, or its backward, as one op.
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

/// Which cell and which half of its recurrence the op computes. `repr(u32)` with explicit
/// numbers because the C ABI passes them; append new values, never renumber.
///
/// `T` steps, batch `B`, hidden size `H`; `G` is the cell's gate width (`4H` for the LSTM, `3H`
/// for the GRU, `H` for the plain RNN). A forward's operands are `xg [T, B, G]` (each step's
/// input product with `b_ih`), `w_hh_t [H, G]` (`W_hh` transposed, contiguous or not), `h0 [B,
/// H]`, the LSTM's `c0 [B, H]` and optionally `b_hh [G]`. A backward's are the forward's result,
/// the LSTM's `c0` or the GRU's `h0` (the plain RNN needs neither), `w_hh [G, H]`, the
/// gradients of the layer's output `dy [T, B, H]` and of its last states, `dh [B, H]` and the
/// LSTM's `dc [B, H]`.
///
/// **Packed steps** (a `PackedSequence`: sentences of different lengths, longest first): the
/// time-major operands lose their batch dim, `xg [N, G]`, the backward's `dy [N, H]` and the
/// forward's result `[N, ..]`, where step `t`'s rows are its first `batch_sizes[t]` samples,
/// the steps one after another (`N` rows in all), and a last operand `batch_sizes [T]`
/// (int64, non-increasing, the first equal to `B`) says how many. A sample's last step is the
/// last that holds it; walking in reverse, a sample starts from `h0` at its own last step. A
/// backward's result is then `[N + B, ..]`: the steps' rows, then one row per sample with the
/// first states' gradients.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecurrencePart {
    /// The LSTM's steps: result `[T, B, 6H]`, per step and sample the gates after their
    /// activations `i, f, g, o`, then the cell state `c` and the hidden state `h`.
    LstmForward = 0,
    /// Their backward: result `[T + 1, B, 4H]`, rows `0..T` each step's gate gradients before
    /// the activations (`di, df, dg, do`), row `T` the gradients of `h0` and `c0` in its first
    /// `2H` columns (the rest zero).
    LstmBackward = 1,
    /// The GRU's steps: result `[T, B, 5H]`, per step and sample `r, z, n` after their
    /// activations, the hidden product's n part `hn` (before the reset gate) and `h`.
    GruForward = 2,
    /// Their backward: result `[T + 1, B, 6H]`, rows `0..T` each step's gradients of the input
    /// product's gates (`dr, dz, dn`) then of the hidden product's (`dr, dz, dn * r`), row `T`
    /// the gradient of `h0` in its first `H` columns (the rest zero).
    GruBackward = 3,
    /// The plain RNN's steps, `h = tanh(xg + b_hh + h @ W_hh^T)`: result `[T, B, H]`, each
    /// step's `h` (the layer's output).
    RnnTanhForward = 4,
    /// Their backward: result `[T + 1, B, H]`, rows `0..T` each step's gradient before the
    /// activation, row `T` the gradient of `h0`.
    RnnTanhBackward = 5,
    /// As `RnnTanhForward` with `relu` for `tanh`.
    RnnReluForward = 6,
    /// As `RnnTanhBackward` through `relu`.
    RnnReluBackward = 7,
}

/// The cell a part's steps compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cell {
    /// `nn.LSTM`'s.
    Lstm,
    /// `nn.GRU`'s.
    Gru,
    /// `nn.RNN`'s with `nonlinearity="tanh"`.
    RnnTanh,
    /// `nn.RNN`'s with `nonlinearity="relu"`.
    RnnRelu,
}

impl RecurrencePart {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [RecurrencePart; 8] = [
        RecurrencePart::LstmForward,
        RecurrencePart::LstmBackward,
        RecurrencePart::GruForward,
        RecurrencePart::GruBackward,
        RecurrencePart::RnnTanhForward,
        RecurrencePart::RnnTanhBackward,
        RecurrencePart::RnnReluForward,
        RecurrencePart::RnnReluBackward,
    ];

    /// Decodes an ABI number; `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<RecurrencePart> {
        RecurrencePart::ALL.get(v as usize).copied()
    }

    /// The cell whose steps the part computes.
    pub fn cell(self) -> Cell {
        match self {
            RecurrencePart::LstmForward | RecurrencePart::LstmBackward => Cell::Lstm,
            RecurrencePart::GruForward | RecurrencePart::GruBackward => Cell::Gru,
            RecurrencePart::RnnTanhForward | RecurrencePart::RnnTanhBackward => Cell::RnnTanh,
            RecurrencePart::RnnReluForward | RecurrencePart::RnnReluBackward => Cell::RnnRelu,
        }
    }

    /// The backward parts (odd numbers).
    pub fn is_backward(self) -> bool {
        self as u32 % 2 == 1
    }

    /// The op's name in errors and dumps.
    pub fn name(self) -> &'static str {
        match self.cell() {
            Cell::Lstm => "lstm_recurrence",
            Cell::Gru => "gru_recurrence",
            Cell::RnnTanh => "rnn_tanh_recurrence",
            Cell::RnnRelu => "rnn_relu_recurrence",
        }
    }

    /// Gates per hidden unit: the width of a step's input product over `H`.
    pub fn gates(self) -> usize {
        match self.cell() {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::RnnTanh | Cell::RnnRelu => 1,
        }
    }

    /// Floats per hidden unit in a step's row of the forward's result.
    pub fn kept(self) -> usize {
        match self.cell() {
            Cell::Lstm => 6,
            Cell::Gru => 5,
            Cell::RnnTanh | Cell::RnnRelu => 1,
        }
    }

    /// Floats per hidden unit in a step's row of the backward's result.
    pub fn grads(self) -> usize {
        match self.cell() {
            Cell::Lstm => 4,
            Cell::Gru => 6,
            Cell::RnnTanh | Cell::RnnRelu => 1,
        }
    }

    /// The operands' names, in order (a forward's last, `b_hh`, is optional).
    pub fn operands(self) -> &'static [&'static str] {
        match (self.cell(), self.is_backward()) {
            (Cell::Lstm, false) => &["xg", "w_hh_t", "h0", "c0", "b_hh"],
            (Cell::Lstm, true) => &["steps", "c0", "w_hh", "dy", "dh", "dc"],
            (Cell::Gru, true) => &["steps", "h0", "w_hh", "dy", "dh"],
            (_, false) => &["xg", "w_hh_t", "h0", "b_hh"],
            (_, true) => &["steps", "w_hh", "dy", "dh"],
        }
    }
}

/// A recurrence part and the order its steps are walked in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Recurrence {
    /// Which cell and half.
    pub part: RecurrencePart,
    /// The steps run from the last to the first (a bidirectional layer's second direction):
    /// step `t` follows step `t + 1`, and the first state feeds step `T - 1`.
    pub reverse: bool,
}

impl std::fmt::Display for Recurrence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            ".{:?}{}",
            self.part,
            if self.reverse { ".reverse" } else { "" }
        )
    }
}

/// Output dtype and shape of part `k` over `args`, or why they do not fit. Float32 (the
/// hidden weight also bfloat16); the caller keeps other dtypes on the step-by-step path. A
/// first operand of rank 2 makes the steps packed (see [`RecurrencePart`]), with
/// `batch_sizes` the last operand.
pub(super) fn infer_recurrence(k: &Recurrence, args: &[ArgMeta]) -> OpResult<Inferred> {
    let part = k.part;
    let name = part.name();
    let names = part.operands();
    let packed = matches!(args.first(), Some(ArgMeta::Tensor { sizes, .. }) if sizes.len() == 2);
    let (args, steps) = if packed {
        let (last, rest) = args.split_last().expect("a first operand");
        (rest, Some(batch_sizes(name, last, args.len() - 1)?))
    } else {
        (args, None)
    };
    // A forward's last operand, the hidden bias, is optional.
    let fewest = names.len() - usize::from(!part.is_backward());
    if !(fewest..=names.len()).contains(&args.len()) {
        let last = if packed { ", batch_sizes" } else { "" };
        return Err(OpError::new(
            name,
            "inputs",
            format!(
                "{} to {} operands ({}{last})",
                fewest + usize::from(packed),
                names.len() + usize::from(packed),
                names.join(", ")
            ),
            format!("{}", args.len() + usize::from(packed)),
        ));
    }
    let mut ops = Vec::with_capacity(args.len());
    for (i, what) in names.iter().enumerate().take(args.len()) {
        ops.push(tensor(name, args, i, what)?);
    }
    let (d0, first) = ops[0];
    let (lanes, per_step) = if part.is_backward() {
        (part.kept(), "the forward's result")
    } else {
        (part.gates(), "each step's input product")
    };
    let rank = if packed { 2 } else { 3 };
    let rows = if packed { "N" } else { "T, B" };
    if d0 != DType::F32 || first.len() != rank || first[rank - 1] % lanes != 0 || first.contains(&0)
    {
        return Err(OpError::new(
            name,
            format!("input 0 ({})", names[0]),
            format!("a non-empty float32 [{rows}, {lanes}H] ({per_step})"),
            format!("dtype {d0}, shape {}", fmt_dims(first)),
        ));
    }
    let h = first[rank - 1] / lanes;
    // Packed, the batch is the first states' (a backward's last states') row count.
    let b = if packed {
        let state = if part.is_backward() { "dh" } else { "h0" };
        let at = names
            .iter()
            .position(|&n| n == state)
            .expect("every part has it");
        ops[at].1.first().copied().unwrap_or(0)
    } else {
        first[1]
    };
    let g = part.gates() * h;
    let shape = |what: &str| -> Vec<usize> {
        match (what, packed) {
            ("w_hh_t", _) => vec![h, g],
            ("w_hh", _) => vec![g, h],
            ("b_hh", _) => vec![g],
            ("dy", false) => vec![first[0], b, h],
            ("dy", true) => vec![first[0], h],
            _ => vec![b, h],
        }
    };
    for (i, (&what, &(dtype, sizes))) in names.iter().zip(&ops).enumerate().skip(1) {
        let want = shape(what);
        // The hidden weight may be bfloat16 (a layer under bfloat16 autocast): the steps'
        // hidden products then run in bf16 on h (or the gate gradients) rounded to bfloat16.
        let weight = what.starts_with("w_hh");
        let dtype_ok = dtype == DType::F32 || (weight && dtype == DType::BF16);
        if !dtype_ok || sizes.as_slice() != want.as_slice() {
            let dtypes = if weight {
                "float32 or bfloat16"
            } else {
                "float32"
            };
            return Err(OpError::new(
                name,
                format!("input {i} ({what})"),
                format!("{dtypes} of shape {}", fmt_dims(&want)),
                format!("dtype {dtype}, shape {}", fmt_dims(sizes)),
            ));
        }
    }
    if let Some(t) = steps {
        let n = first[0];
        if b == 0 || t > n || b > n {
            return Err(OpError::new(
                name,
                format!("input {} (batch_sizes)", args.len()),
                format!("at most {n} steps of at most {n} samples (the packed rows)"),
                format!("{t} steps of batch {b}"),
            ));
        }
    }
    let sizes: Dims = match (part.is_backward(), packed) {
        (true, false) => smallvec![first[0] + 1, b, part.grads() * h],
        (false, false) => smallvec![first[0], b, part.kept() * h],
        (true, true) => smallvec![first[0] + b, part.grads() * h],
        (false, true) => smallvec![first[0], part.kept() * h],
    };
    Ok(Inferred {
        dtype: DType::F32,
        sizes,
        compute: DType::F32,
    })
}

/// The step count of packed steps' `batch_sizes` operand (input `i`): an int64 vector.
fn batch_sizes(name: &str, arg: &ArgMeta, i: usize) -> OpResult<usize> {
    match arg {
        ArgMeta::Tensor {
            dtype: DType::I64,
            sizes,
        } if sizes.len() == 1 && sizes[0] > 0 => Ok(sizes[0]),
        other => Err(OpError::new(
            name,
            format!("input {i} (batch_sizes)"),
            "an int64 [T] of each packed step's batch size (a PackedSequence's batch_sizes), \
             last, since input 0 is packed ([N, ..])",
            format!("{other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &[usize]) -> ArgMeta {
        ArgMeta::tensor(DType::F32, s)
    }

    fn op(part: RecurrencePart) -> Recurrence {
        Recurrence {
            part,
            reverse: false,
        }
    }

    #[test]
    fn the_lstm_forward_keeps_four_gates_a_cell_and_a_hidden_state_per_step() {
        let args = [t(&[5, 2, 12]), t(&[3, 12]), t(&[2, 3]), t(&[2, 3])];
        let r = infer_recurrence(&op(RecurrencePart::LstmForward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[5, 2, 18]);
    }

    #[test]
    fn the_hidden_weight_may_be_bfloat16_and_nothing_else() {
        let w = ArgMeta::tensor(DType::BF16, &[3, 12]);
        let args = [t(&[5, 2, 12]), w, t(&[2, 3]), t(&[2, 3])];
        let r = infer_recurrence(&op(RecurrencePart::LstmForward), &args).unwrap();
        assert_eq!(r.dtype, DType::F32);
        let h0 = ArgMeta::tensor(DType::BF16, &[2, 3]);
        let args = [t(&[5, 2, 12]), t(&[3, 12]), h0, t(&[2, 3])];
        let e = infer_recurrence(&op(RecurrencePart::LstmForward), &args).unwrap_err();
        assert_eq!(e.operand, "input 2 (h0)");
    }

    #[test]
    fn a_forward_takes_an_optional_hidden_bias() {
        let args = [
            t(&[5, 2, 12]),
            t(&[3, 12]),
            t(&[2, 3]),
            t(&[2, 3]),
            t(&[12]),
        ];
        assert!(infer_recurrence(&op(RecurrencePart::LstmForward), &args).is_ok());
        let args = [t(&[5, 2, 9]), t(&[3, 9]), t(&[2, 3]), t(&[9])];
        let r = infer_recurrence(&op(RecurrencePart::GruForward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[5, 2, 15]);
    }

    #[test]
    fn a_backward_has_one_more_row_for_the_first_states_gradients() {
        let args = [
            t(&[5, 2, 18]),
            t(&[2, 3]),
            t(&[12, 3]),
            t(&[5, 2, 3]),
            t(&[2, 3]),
            t(&[2, 3]),
        ];
        let r = infer_recurrence(&op(RecurrencePart::LstmBackward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[6, 2, 12]);
        let args = [
            t(&[5, 2, 15]),
            t(&[2, 3]),
            t(&[9, 3]),
            t(&[5, 2, 3]),
            t(&[2, 3]),
        ];
        let r = infer_recurrence(&op(RecurrencePart::GruBackward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[6, 2, 18]);
    }

    #[test]
    fn the_plain_rnn_keeps_h_alone_and_its_backward_needs_no_first_state() {
        let args = [t(&[5, 2, 3]), t(&[3, 3]), t(&[2, 3])];
        let r = infer_recurrence(&op(RecurrencePart::RnnReluForward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[5, 2, 3]);
        let args = [t(&[5, 2, 3]), t(&[3, 3]), t(&[5, 2, 3]), t(&[2, 3])];
        let r = infer_recurrence(&op(RecurrencePart::RnnTanhBackward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[6, 2, 3]);
    }

    #[test]
    fn every_backward_part_is_odd() {
        for p in RecurrencePart::ALL {
            assert_eq!(p.is_backward(), p as u32 % 2 == 1, "{p:?}");
            assert_eq!(RecurrencePart::from_u32(p as u32), Some(p));
        }
    }

    #[test]
    fn a_weight_of_the_wrong_shape_is_named_with_the_shape_expected() {
        let args = [t(&[5, 2, 12]), t(&[12, 3]), t(&[2, 3]), t(&[2, 3])];
        let e = infer_recurrence(&op(RecurrencePart::LstmForward), &args).unwrap_err();
        assert_eq!(e.operand, "input 1 (w_hh_t)");
        assert!(e.expected.contains("[3, 12]"), "{}", e.expected);
    }

    fn sizes(n: usize) -> ArgMeta {
        ArgMeta::tensor(DType::I64, &[n])
    }

    #[test]
    fn packed_steps_keep_one_row_per_sample_and_step() {
        // 3 steps of batch sizes like [2, 2, 1]: 5 rows.
        let args = [
            t(&[5, 12]),
            t(&[3, 12]),
            t(&[2, 3]),
            t(&[2, 3]),
            t(&[12]),
            sizes(3),
        ];
        let r = infer_recurrence(&op(RecurrencePart::LstmForward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[5, 18]);
        let args = [t(&[5, 3]), t(&[3, 3]), t(&[2, 3]), sizes(3)];
        let r = infer_recurrence(&op(RecurrencePart::RnnTanhForward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[5, 3]);
    }

    #[test]
    fn a_packed_backward_ends_with_one_row_per_sample_for_the_first_states() {
        let args = [
            t(&[5, 18]),
            t(&[2, 3]),
            t(&[12, 3]),
            t(&[5, 3]),
            t(&[2, 3]),
            t(&[2, 3]),
            sizes(3),
        ];
        let r = infer_recurrence(&op(RecurrencePart::LstmBackward), &args);
        assert_eq!(r.unwrap().sizes.as_slice(), &[7, 12]);
    }

    #[test]
    fn packed_steps_without_their_batch_sizes_are_named() {
        let args = [t(&[5, 3]), t(&[3, 3]), t(&[2, 3]), t(&[3])];
        let e = infer_recurrence(&op(RecurrencePart::RnnTanhForward), &args).unwrap_err();
        assert_eq!(e.operand, "input 3 (batch_sizes)");
        assert!(e.expected.contains("int64 [T]"), "{}", e.expected);
    }

    #[test]
    fn packed_gradients_of_the_output_have_one_row_per_packed_row() {
        let args = [t(&[5, 3]), t(&[3, 3]), t(&[3, 2, 3]), t(&[2, 3]), sizes(3)];
        let e = infer_recurrence(&op(RecurrencePart::RnnReluBackward), &args).unwrap_err();
        assert_eq!(e.operand, "input 2 (dy)");
        assert!(e.expected.contains("[5, 3]"), "{}", e.expected);
    }

    #[test]
    fn more_steps_than_packed_rows_are_refused() {
        let args = [t(&[2, 3]), t(&[3, 3]), t(&[1, 3]), sizes(3)];
        let e = infer_recurrence(&op(RecurrencePart::RnnTanhForward), &args).unwrap_err();
        assert_eq!(e.operand, "input 3 (batch_sizes)");
    }

    #[test]
    fn float64_is_refused() {
        let args = [
            ArgMeta::tensor(DType::F64, &[5, 2, 9]),
            t(&[3, 9]),
            t(&[2, 3]),
        ];
        let e = infer_recurrence(&op(RecurrencePart::GruForward), &args).unwrap_err();
        assert_eq!(
            (e.op.as_str(), e.operand.as_str()),
            ("gru_recurrence", "input 0 (xg)")
        );
    }
}
