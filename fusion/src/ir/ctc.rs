//! The CTC loss kernel op (`F.ctc_loss`, speech and handwriting recognition): the forward
//! variables (alpha) of the forward-backward recursion, the loss read from them, and the
//! gradient with respect to the log-probabilities (through the backward variables, beta).
//!
//! Each time step depends on the previous one along a path over the target's labels, so nothing
//! fuses across it; as a kernel op the recursion runs inside the flush instead of on the host
//! fallback (a download of the log-probabilities and a sync point, twice a training step).
//!
//! Targets arrive concatenated (int64, `[sum of target lengths]` or a padded `[N, S]` tensor
//! flattened), and `lengths` is an int64 `[N, 3]` tensor of each sample's input length, target
//! length and where its target starts in `targets`: the caller knows the lengths on the host
//! (PyTorch passes them as int lists) and checks them there, so the op's shapes never depend on
//! tensor values.

use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::infer::{ArgMeta, Inferred};
use super::kernel::tensor;
use super::layout::{fmt_dims, Dims};
use smallvec::smallvec;

/// Which part of the CTC loss the op computes. `repr(u32)` with explicit numbers because the C
/// ABI passes them; append new values, never renumber.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtcPart {
    /// The log-alphas: operands log_probs `[T, N, C]`, targets, lengths; result `[N, T, 2 *
    /// max_target + 1]` (entries a sample's lengths do not reach are -inf).
    Alpha = 0,
    /// The negative log-likelihood per sample: operands log_alpha and lengths; result `[N]`.
    Loss = 1,
    /// The gradient of the loss with respect to log_probs: operands grad `[N]` (of each
    /// sample's loss), log_probs, targets, lengths, the loss and log_alpha; result `[T, N, C]`
    /// (zero past a sample's input length).
    Grad = 2,
}

impl CtcPart {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [CtcPart; 3] = [CtcPart::Alpha, CtcPart::Loss, CtcPart::Grad];

    /// Decodes an ABI number; `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<CtcPart> {
        CtcPart::ALL.get(v as usize).copied()
    }

    fn operands(self) -> &'static [&'static str] {
        match self {
            CtcPart::Alpha => &["log_probs", "targets", "lengths"],
            CtcPart::Loss => &["log_alpha", "lengths"],
            CtcPart::Grad => &[
                "grad",
                "log_probs",
                "targets",
                "lengths",
                "loss",
                "log_alpha",
            ],
        }
    }
}

/// A CTC loss part and what it needs beyond its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ctc {
    /// Which part.
    pub part: CtcPart,
    /// The blank label's index (below C).
    pub blank: usize,
    /// The longest target (the alphas' last dim is `2 * max_target + 1`); `Alpha` only.
    pub max_target: usize,
}

impl std::fmt::Display for Ctc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            ".{:?}.blank{}.max_target{}",
            self.part, self.blank, self.max_target
        )
    }
}

const NAME: &str = "ctc_loss";

fn expect(i: usize, what: &str, ok: bool, want: String, got: &Dims, dtype: DType) -> OpResult<()> {
    if ok {
        return Ok(());
    }
    Err(OpError::new(
        NAME,
        format!("input {i} ({what})"),
        want,
        format!("dtype {dtype}, shape {}", fmt_dims(got)),
    ))
}

/// Output dtype and shape of CTC part `k` over `args`, or why they do not fit.
pub(super) fn infer_ctc(k: &Ctc, args: &[ArgMeta]) -> OpResult<Inferred> {
    let names = k.part.operands();
    if args.len() != names.len() {
        return Err(OpError::new(
            NAME,
            "inputs",
            format!("{} operands ({})", names.len(), names.join(", ")),
            format!("{}", args.len()),
        ));
    }
    let mut ops = Vec::with_capacity(names.len());
    for (i, what) in names.iter().enumerate() {
        ops.push(tensor(NAME, args, i, what)?);
    }
    let find = |name: &str| names.iter().position(|n| *n == name);
    // lengths: [N, 3] int64, N from it.
    let li = find("lengths").expect("every part has lengths");
    let (ld, lengths) = ops[li];
    expect(
        li,
        "lengths",
        ld == DType::I64 && lengths.len() == 2 && lengths[1] == 3,
        "an int64 [N, 3] tensor (input length, target length, target offset)".into(),
        lengths,
        ld,
    )?;
    let n = lengths[0];
    if let Some(ti) = find("targets") {
        let (td, t) = ops[ti];
        expect(
            ti,
            "targets",
            td == DType::I64 && t.len() == 1,
            "a 1-D int64 tensor (the targets concatenated)".into(),
            t,
            td,
        )?;
    }
    let float = |i: usize, what: &str, rank: usize, lead: usize| -> OpResult<(DType, &Dims)> {
        let (d, s) = ops[i];
        expect(
            i,
            what,
            matches!(d, DType::F32 | DType::F64) && s.len() == rank && s[lead] == n,
            format!("a float32 or float64 tensor of {rank} dims with N = {n} in dim {lead}"),
            s,
            d,
        )?;
        Ok((d, s))
    };
    match k.part {
        CtcPart::Alpha => {
            let (d, lp) = float(0, "log_probs", 3, 1)?;
            if k.blank >= lp[2] {
                return Err(OpError::new(
                    NAME,
                    "blank",
                    format!("a label below C = {}", lp[2]),
                    format!("{}", k.blank),
                ));
            }
            Ok(Inferred {
                dtype: d,
                sizes: smallvec![n, lp[0], 2 * k.max_target + 1],
                compute: d,
            })
        }
        CtcPart::Loss => {
            let (d, _) = float(0, "log_alpha", 3, 0)?;
            Ok(Inferred {
                dtype: d,
                sizes: smallvec![n],
                compute: d,
            })
        }
        CtcPart::Grad => {
            let (d, lp) = float(1, "log_probs", 3, 1)?;
            for (i, what, rank, lead) in [(0, "grad", 1, 0), (4, "loss", 1, 0)] {
                float(i, what, rank, lead)?;
            }
            let (_, la) = float(5, "log_alpha", 3, 0)?;
            let same = ops.iter().all(|(od, _)| *od == d || *od == DType::I64);
            if !same || la[1] != lp[0] || k.blank >= lp[2] {
                return Err(OpError::new(
                    NAME,
                    "inputs",
                    format!(
                        "grad, loss and log_alpha of log_probs' dtype {d}, log_alpha with T = {} \
                         and a blank below C = {}",
                        lp[0], lp[2]
                    ),
                    format!("log_alpha {}, blank {}", fmt_dims(la), k.blank),
                ));
            }
            Ok(Inferred {
                dtype: d,
                sizes: lp.clone(),
                compute: d,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(d: DType, s: &[usize]) -> ArgMeta {
        ArgMeta::tensor(d, s)
    }

    fn alpha(max_target: usize) -> Ctc {
        Ctc {
            part: CtcPart::Alpha,
            blank: 0,
            max_target,
        }
    }

    #[test]
    fn the_alphas_have_one_row_per_time_step_and_two_per_label_plus_one() {
        let r = infer_ctc(
            &alpha(4),
            &[
                t(DType::F32, &[10, 3, 6]),
                t(DType::I64, &[9]),
                t(DType::I64, &[3, 3]),
            ],
        )
        .unwrap();
        assert_eq!(r.sizes.as_slice(), &[3, 10, 9]);
    }

    #[test]
    fn lengths_of_another_batch_size_are_refused_naming_the_operand() {
        let e = infer_ctc(
            &alpha(4),
            &[
                t(DType::F32, &[10, 3, 6]),
                t(DType::I64, &[9]),
                t(DType::I64, &[2, 3]),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("input 0 (log_probs)"), "{e}");
    }

    #[test]
    fn a_blank_outside_the_labels_is_refused() {
        let k = Ctc {
            blank: 6,
            ..alpha(1)
        };
        let e = infer_ctc(
            &k,
            &[
                t(DType::F32, &[10, 3, 6]),
                t(DType::I64, &[3]),
                t(DType::I64, &[3, 3]),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("blank"), "{e}");
    }

    #[test]
    fn half_precision_log_probs_are_refused_as_on_cpu() {
        let e = infer_ctc(
            &alpha(1),
            &[
                t(DType::F16, &[10, 3, 6]),
                t(DType::I64, &[3]),
                t(DType::I64, &[3, 3]),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("float32 or float64"), "{e}");
    }
}
