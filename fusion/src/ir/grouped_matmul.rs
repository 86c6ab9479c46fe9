//! The grouped matrix product kernel op (`torch._grouped_mm`): a mixture-of-experts layer's
//! products, each expert's weights applied to the tokens routed to it.
//!
//! The tokens are sorted by expert and `offs` (an int tensor on the device) holds where each
//! expert's rows end. Composed from other ops, this needs the offsets on the host (a sync point
//! per product, as PyTorch's own fallback does with `offs.cpu()`) or a product per expert over
//! every token with the others masked out (the experts-times-larger work). As a kernel op the
//! offsets are read when the op runs, inside the flush, and each group is one product of its
//! own rows: the output's shape never depends on the offsets, only which rows hold what.

use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::infer::{ArgMeta, Inferred};
use super::kernel::tensor;
use super::layout::{fmt_dims, Dims};
use smallvec::smallvec;

/// Which operand's dim the offsets cut into groups (torch's 2-D x 3-D, 3-D x 2-D and 2-D x 2-D
/// cases; 3-D x 3-D has no offsets and is a batched product). `repr(u32)` with explicit numbers
/// because the C ABI passes them; append new values, never renumber.
///
/// Group `g` covers `[offs[g - 1], offs[g])` of the cut dim (`offs[-1]` is 0), each end
/// clamped to `[0, extent]`, as PyTorch slices it (a group whose end comes before its start is
/// empty; decreasing offsets make the next group overlap earlier ones, and its rows or columns
/// replace theirs, as PyTorch writes groups in order). What no group covers, past the last
/// offset, is zero: PyTorch leaves it uninitialised, so any value there is correct for it, and
/// zeros keep runs reproducible.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupedMatmul {
    /// `a [M, K]` cut by rows, `b [G, K, N]`: result `[M, N]`, group g's rows times `b[g]`
    /// (the forward of an expert layer, and its input gradient).
    Rows = 0,
    /// `a [G, M, K]`, `b [K, N]` cut by columns: result `[M, N]`, `a[g]` times group g's
    /// columns.
    Cols = 1,
    /// `a [M, K]` and `b [K, N]`, both cut along K: result `[G, M, N]`, `a[:, Kg] @ b[Kg, :]`
    /// (an expert layer's weight gradient: each expert's tokens only).
    Contraction = 2,
}

impl GroupedMatmul {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [GroupedMatmul; 3] = [
        GroupedMatmul::Rows,
        GroupedMatmul::Cols,
        GroupedMatmul::Contraction,
    ];

    /// Decodes an ABI number; `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<GroupedMatmul> {
        GroupedMatmul::ALL.get(v as usize).copied()
    }

    /// `(rank of a, rank of b)` the case takes.
    fn ranks(self) -> (usize, usize) {
        match self {
            GroupedMatmul::Rows => (2, 3),
            GroupedMatmul::Cols => (3, 2),
            GroupedMatmul::Contraction => (2, 2),
        }
    }
}

impl std::fmt::Display for GroupedMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            GroupedMatmul::Rows => "rows",
            GroupedMatmul::Cols => "cols",
            GroupedMatmul::Contraction => "contraction",
        };
        f.write_str(s)
    }
}

const NAME: &str = "grouped_mm";

/// Output dtype and shape of a grouped product over operands `a`, `b`, `offs`, or why they do
/// not fit `case`.
pub(super) fn infer_grouped_matmul(case: GroupedMatmul, args: &[ArgMeta]) -> OpResult<Inferred> {
    if args.len() != 3 {
        return Err(OpError::new(
            NAME,
            "inputs",
            "3 operands (a, b, offs)",
            format!("{}", args.len()),
        ));
    }
    let (ad, a) = tensor(NAME, args, 0, "a")?;
    let (bd, b) = tensor(NAME, args, 1, "b")?;
    let (od, offs) = tensor(NAME, args, 2, "offs")?;
    if !ad.is_float() {
        return Err(OpError::new(
            NAME,
            "input 0 (a)",
            "a floating dtype",
            format!("{ad}"),
        ));
    }
    if bd != ad {
        return Err(OpError::new(
            NAME,
            "input 1 (b)",
            format!("dtype {ad} (the dtype of a)"),
            format!("{bd}"),
        ));
    }
    if !matches!(od, DType::I32 | DType::I64) || offs.len() != 1 {
        return Err(OpError::new(
            NAME,
            "input 2 (offs)",
            "a 1-D int32 or int64 tensor",
            format!("dtype {od}, shape {}", fmt_dims(offs)),
        ));
    }
    let (ra, rb) = case.ranks();
    for (i, what, sizes, rank) in [(0, "a", a, ra), (1, "b", b, rb)] {
        if sizes.len() != rank {
            return Err(OpError::new(
                NAME,
                format!("input {i} ({what})"),
                format!("{rank} dims for the {case} case"),
                format!("shape {}", fmt_dims(sizes)),
            ));
        }
    }
    // The contraction dims: a's last against b's second to last.
    let (ka, kb) = (a[ra - 1], b[rb - 2]);
    if ka != kb {
        return Err(OpError::new(
            NAME,
            "input 1 (b)",
            format!("{ka} rows (a's last dim) in dim {}", rb - 2),
            format!("shape {} against a's {}", fmt_dims(b), fmt_dims(a)),
        ));
    }
    let groups = offs[0];
    let batched = match case {
        GroupedMatmul::Rows => Some(("input 1 (b)", b[0])),
        GroupedMatmul::Cols => Some(("input 0 (a)", a[0])),
        GroupedMatmul::Contraction => None,
    };
    if let Some((which, g)) = batched {
        if g != groups {
            return Err(OpError::new(
                NAME,
                which,
                format!("{groups} groups in dim 0 (one per offset)"),
                format!("{g}"),
            ));
        }
    }
    let sizes: Dims = match case {
        GroupedMatmul::Rows => smallvec![a[0], b[2]],
        GroupedMatmul::Cols => smallvec![a[1], b[1]],
        GroupedMatmul::Contraction => smallvec![groups, a[0], b[1]],
    };
    Ok(Inferred {
        dtype: ad,
        sizes,
        compute: ad,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(d: DType, s: &[usize]) -> ArgMeta {
        ArgMeta::tensor(d, s)
    }

    fn shape(case: GroupedMatmul, a: &[usize], b: &[usize], g: usize) -> OpResult<Vec<usize>> {
        infer_grouped_matmul(
            case,
            &[t(DType::F32, a), t(DType::F32, b), t(DType::I32, &[g])],
        )
        .map(|r| r.sizes.to_vec())
    }

    #[test]
    fn each_case_has_torchs_output_shape() {
        assert_eq!(
            shape(GroupedMatmul::Rows, &[10, 16], &[3, 16, 8], 3).unwrap(),
            [10, 8]
        );
        assert_eq!(
            shape(GroupedMatmul::Cols, &[3, 4, 16], &[16, 10], 3).unwrap(),
            [4, 10]
        );
        assert_eq!(
            shape(GroupedMatmul::Contraction, &[4, 10], &[10, 8], 3).unwrap(),
            [3, 4, 8]
        );
    }

    #[test]
    fn a_group_count_unlike_the_offsets_is_refused_naming_the_operand() {
        let e = shape(GroupedMatmul::Rows, &[10, 16], &[4, 16, 8], 3).unwrap_err();
        assert!(e.to_string().contains("input 1 (b)"), "{e}");
        assert!(e.to_string().contains("3 groups"), "{e}");
    }

    #[test]
    fn mismatched_contraction_dims_are_refused() {
        let e = shape(GroupedMatmul::Rows, &[10, 16], &[3, 12, 8], 3).unwrap_err();
        assert!(e.to_string().contains("16 rows"), "{e}");
    }

    #[test]
    fn offsets_must_be_a_1d_int_tensor() {
        let e = infer_grouped_matmul(
            GroupedMatmul::Rows,
            &[
                t(DType::F32, &[10, 16]),
                t(DType::F32, &[3, 16, 8]),
                t(DType::F32, &[3]),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("input 2 (offs)"), "{e}");
    }

    #[test]
    fn integer_and_mixed_dtypes_are_refused() {
        let e = infer_grouped_matmul(
            GroupedMatmul::Rows,
            &[
                t(DType::F32, &[10, 16]),
                t(DType::F16, &[3, 16, 8]),
                t(DType::I32, &[3]),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("dtype float32"), "{e}");
        let e = infer_grouped_matmul(
            GroupedMatmul::Rows,
            &[
                t(DType::I64, &[10, 16]),
                t(DType::I64, &[3, 16, 8]),
                t(DType::I32, &[3]),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("floating"), "{e}");
    }
}
