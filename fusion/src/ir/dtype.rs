//! Element types and PyTorch's type-promotion lattice.
//!
//! Promotion lives here, and only here, so that the runtime, the planner and every backend agree on
//! what dtype an op produces.

use std::fmt;

/// An element type a tensor can hold.
///
/// `repr(u32)` with explicit values because the C ABI passes these numbers; never renumber.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float (`torch.float32`).
    F32 = 0,
    /// 64-bit IEEE float (`torch.float64`).
    F64 = 1,
    /// 16-bit IEEE half (`torch.float16`); computes in float32.
    F16 = 2,
    /// bfloat16 (`torch.bfloat16`); computes in float32.
    BF16 = 3,
    /// `torch.int32`.
    I32 = 4,
    /// `torch.int64`.
    I64 = 5,
    /// `torch.uint8`.
    U8 = 6,
    /// `torch.bool`, one byte per element.
    Bool = 7,
}

/// The coarse kind PyTorch uses to decide whether a Python scalar may change a tensor's dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    /// `bool`.
    Bool,
    /// The integer dtypes (and Python ints).
    Integer,
    /// The floating dtypes (and Python floats).
    Float,
}

impl DType {
    /// Every dtype, in ABI order (handy for tests and for validating ABI numbers).
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    /// Decodes an ABI number; `None` for an unknown value, so callers can report it.
    pub fn from_u32(v: u32) -> Option<DType> {
        DType::ALL.get(v as usize).copied()
    }

    /// Bytes one element occupies in a buffer.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// The promotion category of the dtype.
    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::I32 | DType::I64 | DType::U8 => Category::Integer,
            _ => Category::Float,
        }
    }

    /// Float32, float64, float16 and bfloat16.
    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    /// The short name PyTorch prints (`float32`, `int64`, ...), used in every error message.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// The type arithmetic on this dtype is carried out in. f16/bf16 compute in f32 and round on
    /// store; u8 and bool compute in i32 and are truncated on store (wrapping like PyTorch).
    pub fn compute(self) -> DType {
        match self {
            DType::F16 | DType::BF16 | DType::F32 => DType::F32,
            DType::U8 | DType::Bool | DType::I32 => DType::I32,
            other => other,
        }
    }

    /// PyTorch's `promote_types` for two tensor dtypes.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a, b) {
            (Bool, x) | (x, Bool) => x,
            (F64, _) | (_, F64) => F64,
            (F32, _) | (_, F32) => F32,
            (F16, BF16) | (BF16, F16) => F32,
            (F16, _) | (_, F16) => F16,
            (BF16, _) | (_, BF16) => BF16,
            (I64, _) | (_, I64) => I64,
            (I32, _) | (_, I32) => I32,
            _ => U8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The dtype PyTorch gives float results of integer inputs (`torch.get_default_dtype()`).
pub(crate) const DEFAULT_FLOAT: DType = DType::F32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_pytorch_table() {
        use DType::*;
        assert_eq!(DType::promote(U8, I32), I32);
        assert_eq!(DType::promote(I32, I64), I64);
        assert_eq!(DType::promote(F16, BF16), F32);
        assert_eq!(DType::promote(I64, F16), F16);
        assert_eq!(DType::promote(Bool, U8), U8);
        assert_eq!(DType::promote(F32, F64), F64);
        assert_eq!(DType::promote(BF16, I64), BF16);
    }

    #[test]
    fn abi_numbers_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_u32(d as u32), Some(d));
        }
        assert_eq!(DType::from_u32(8), None);
    }
}
