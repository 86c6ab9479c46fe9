//! The ops deferfuse records: their kinds, attributes and scalar operands.
//!
//! Op kinds are `repr(u32)` with explicit numbers because the C ABI passes them; append new ones,
//! never renumber.

use super::dtype::{Category, DType};
use super::kernel::KernelOp;
use super::layout::Dims;
use std::fmt;

/// Elementwise ops of one operand.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`.
    Neg = 0,
    /// `|x|`.
    Abs = 1,
    /// `e^x`.
    Exp = 2,
    /// Natural logarithm.
    Log = 3,
    /// `log(1 + x)`, accurate near zero.
    Log1p = 4,
    /// `e^x - 1`, accurate near zero.
    Expm1 = 5,
    /// Square root.
    Sqrt = 6,
    /// `1 / sqrt(x)`.
    Rsqrt = 7,
    /// Sine.
    Sin = 8,
    /// Cosine.
    Cos = 9,
    /// Hyperbolic tangent.
    Tanh = 10,
    /// `1 / (1 + e^-x)`.
    Sigmoid = 11,
    /// `max(x, 0)`.
    Relu = 12,
    /// `gelu(x, approximate="none")`: 0.5 x (1 + erf(x / sqrt 2)).
    GeluErf = 13,
    /// `gelu(x, approximate="tanh")`.
    GeluTanh = 14,
    /// `x * sigmoid(x)`.
    Silu = 15,
    /// The Gauss error function.
    Erf = 16,
    /// Rounds toward -inf; the identity on integers.
    Floor = 17,
    /// Rounds toward +inf; the identity on integers.
    Ceil = 18,
    /// Round half to even, like `torch.round`.
    Round = 19,
    /// -1, 0 or 1 by the sign of `x`.
    Sign = 20,
    /// `1 / x`.
    Reciprocal = 21,
    /// `x == 0`, as bool.
    LogicalNot = 22,
    /// Whether `x` is NaN, as bool (false for non-float inputs).
    IsNan = 23,
    /// `~x`: logical not on bool, two's complement not on integers; floats are rejected.
    BitwiseNot = 24,
    /// Rounds toward zero; the identity on integers, like floor and ceil.
    Trunc = 25,
    /// Base-2 logarithm.
    Log2 = 26,
    /// Base-10 logarithm.
    Log10 = 27,
    /// Hyperbolic and inverse trigonometric functions (integer inputs give float32); out of
    /// their domain (asin/acos beyond [-1, 1], acosh below 1, atanh beyond [-1, 1]) they give
    /// NaN, and atanh(+-1) gives +-inf, as C's libm does.
    Sinh = 28,
    /// Hyperbolic cosine.
    Cosh = 29,
    /// Tangent.
    Tan = 30,
    /// Arcsine.
    Asin = 31,
    /// Arccosine.
    Acos = 32,
    /// Arctangent.
    Atan = 33,
    /// Inverse hyperbolic sine.
    Asinh = 34,
    /// Inverse hyperbolic cosine.
    Acosh = 35,
    /// Inverse hyperbolic tangent.
    Atanh = 36,
}

impl UnaryOp {
    /// Every op, indexed by its ABI number.
    pub const ALL: [UnaryOp; 37] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::GeluErf,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Erf,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Sign,
        UnaryOp::Reciprocal,
        UnaryOp::LogicalNot,
        UnaryOp::IsNan,
        UnaryOp::BitwiseNot,
        UnaryOp::Trunc,
        UnaryOp::Log2,
        UnaryOp::Log10,
        UnaryOp::Sinh,
        UnaryOp::Cosh,
        UnaryOp::Tan,
        UnaryOp::Asin,
        UnaryOp::Acos,
        UnaryOp::Atan,
        UnaryOp::Asinh,
        UnaryOp::Acosh,
        UnaryOp::Atanh,
    ];

    /// The op for an ABI number; `None` if the number is unknown.
    pub fn from_u32(v: u32) -> Option<UnaryOp> {
        UnaryOp::ALL.get(v as usize).copied()
    }

    /// The PyTorch-style name used in errors, logs and dumps.
    pub fn name(self) -> &'static str {
        use UnaryOp::*;
        match self {
            Neg => "neg",
            Abs => "abs",
            Exp => "exp",
            Log => "log",
            Log1p => "log1p",
            Expm1 => "expm1",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Sin => "sin",
            Cos => "cos",
            Tanh => "tanh",
            Sigmoid => "sigmoid",
            Relu => "relu",
            GeluErf => "gelu",
            GeluTanh => "gelu_tanh",
            Silu => "silu",
            Erf => "erf",
            Floor => "floor",
            Ceil => "ceil",
            Round => "round",
            Sign => "sign",
            Reciprocal => "reciprocal",
            LogicalNot => "logical_not",
            IsNan => "isnan",
            BitwiseNot => "bitwise_not",
            Trunc => "trunc",
            Log2 => "log2",
            Log10 => "log10",
            Sinh => "sinh",
            Cosh => "cosh",
            Tan => "tan",
            Asin => "asin",
            Acos => "acos",
            Atan => "atan",
            Asinh => "asinh",
            Acosh => "acosh",
            Atanh => "atanh",
        }
    }

    /// Ops whose result is always floating (an integer input is promoted to float32 first).
    pub(crate) fn is_float_op(self) -> bool {
        use UnaryOp::*;
        matches!(
            self,
            Exp | Log
                | Log2
                | Log10
                | Log1p
                | Expm1
                | Sqrt
                | Rsqrt
                | Sin
                | Cos
                | Tanh
                | Sigmoid
                | GeluErf
                | GeluTanh
                | Silu
                | Erf
                | Reciprocal
                | Sinh
                | Cosh
                | Tan
                | Asin
                | Acos
                | Atan
                | Asinh
                | Acosh
                | Atanh
        )
    }
}

/// Elementwise ops of two operands (tensor or scalar).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add = 0,
    /// `a - b`.
    Sub = 1,
    /// `a * b`.
    Mul = 2,
    /// True division: integer inputs give float32, like `torch.div`.
    Div = 3,
    /// `a ** b`.
    Pow = 4,
    /// Propagates NaN, like `torch.maximum`.
    Maximum = 5,
    /// Propagates NaN, like `torch.minimum`.
    Minimum = 6,
    /// Python-style modulo: the result takes the divisor's sign, like `torch.remainder`.
    Remainder = 7,
    /// `a == b`, as bool.
    Eq = 8,
    /// `a != b`, as bool.
    Ne = 9,
    /// `a < b`, as bool.
    Lt = 10,
    /// `a <= b`, as bool.
    Le = 11,
    /// `a > b`, as bool.
    Gt = 12,
    /// `a >= b`, as bool.
    Ge = 13,
    /// Both operands nonzero, as bool.
    LogicalAnd = 14,
    /// Either operand nonzero, as bool.
    LogicalOr = 15,
    /// Bool and integer operands only (floats are rejected, like PyTorch).
    BitwiseAnd = 16,
    /// `a | b`; bool and integer operands only.
    BitwiseOr = 17,
    /// `a ^ b`; bool and integer operands only.
    BitwiseXor = 18,
    /// `atan2(a, b)`: integer inputs give float32.
    Atan2 = 19,
    /// C `fmod`: the result takes the dividend's sign, like `torch.fmod`. Integer fmod by zero
    /// gives 0, like [`BinaryOp::Remainder`].
    Fmod = 20,
    /// `torch.floor_divide`: the quotient rounded toward -inf (floats follow PyTorch's
    /// `div_floor_floating`). Integer division by zero gives 0.
    FloorDivide = 21,
    /// `div(rounding_mode="trunc")`: the quotient rounded toward zero. Integer division by
    /// zero gives 0.
    TruncDivide = 22,
}

impl BinaryOp {
    /// Every op, indexed by its ABI number.
    pub const ALL: [BinaryOp; 23] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Remainder,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::LogicalAnd,
        BinaryOp::LogicalOr,
        BinaryOp::BitwiseAnd,
        BinaryOp::BitwiseOr,
        BinaryOp::BitwiseXor,
        BinaryOp::Atan2,
        BinaryOp::Fmod,
        BinaryOp::FloorDivide,
        BinaryOp::TruncDivide,
    ];

    /// The op for an ABI number; `None` if the number is unknown.
    pub fn from_u32(v: u32) -> Option<BinaryOp> {
        BinaryOp::ALL.get(v as usize).copied()
    }

    /// The PyTorch-style name used in errors, logs and dumps.
    pub fn name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Remainder => "remainder",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
            LogicalAnd => "logical_and",
            LogicalOr => "logical_or",
            BitwiseAnd => "bitwise_and",
            BitwiseOr => "bitwise_or",
            BitwiseXor => "bitwise_xor",
            Atan2 => "atan2",
            Fmod => "fmod",
            FloorDivide => "floor_divide",
            TruncDivide => "div_trunc",
        }
    }

    /// Comparisons and logical ops produce bool.
    pub(crate) fn gives_bool(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr)
    }

    /// Ops defined on bool and integer operands only.
    pub(crate) fn is_bitwise(self) -> bool {
        matches!(
            self,
            BinaryOp::BitwiseAnd | BinaryOp::BitwiseOr | BinaryOp::BitwiseXor
        )
    }

    /// The division family, which PyTorch has no bool kernel for: two bool operands are an
    /// error rather than a division of 0s and 1s.
    pub(crate) fn rejects_bool(self) -> bool {
        matches!(
            self,
            BinaryOp::Fmod | BinaryOp::FloorDivide | BinaryOp::TruncDivide
        )
    }
}

/// Reductions over a set of dims.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum of the elements.
    Sum = 0,
    /// Sum divided by the number of reduced elements.
    Mean = 1,
    /// Product of the elements.
    Prod = 2,
    /// Propagates NaN, like `torch.amax`.
    Amax = 3,
    /// Propagates NaN, like `torch.amin`.
    Amin = 4,
    /// Index of the first maximum (NaN counts as the maximum), as int64.
    Argmax = 5,
    /// Index of the first minimum, as int64.
    Argmin = 6,
}

impl ReduceOp {
    /// Every reduction, indexed by its ABI number.
    pub const ALL: [ReduceOp; 7] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Prod,
        ReduceOp::Amax,
        ReduceOp::Amin,
        ReduceOp::Argmax,
        ReduceOp::Argmin,
    ];

    /// The reduction for an ABI number; `None` if the number is unknown.
    pub fn from_u32(v: u32) -> Option<ReduceOp> {
        ReduceOp::ALL.get(v as usize).copied()
    }

    /// The PyTorch-style name used in errors, logs and dumps.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Prod => "prod",
            ReduceOp::Amax => "amax",
            ReduceOp::Amin => "amin",
            ReduceOp::Argmax => "argmax",
            ReduceOp::Argmin => "argmin",
        }
    }

    /// Argmax and argmin, which give an int64 index rather than a value.
    pub fn is_arg(self) -> bool {
        matches!(self, ReduceOp::Argmax | ReduceOp::Argmin)
    }
}

/// A Python number passed where a tensor could be. Its value is a run-time parameter of the
/// compiled program, never part of the program's identity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A Python float.
    Float(f64),
    /// A Python int.
    Int(i64),
    /// A Python bool.
    Bool(bool),
}

impl Scalar {
    /// The dtype category the scalar takes part in promotion with.
    pub fn category(self) -> Category {
        match self {
            Scalar::Float(_) => Category::Float,
            Scalar::Int(_) => Category::Integer,
            Scalar::Bool(_) => Category::Bool,
        }
    }

    /// The value as f64 (bool as 0 or 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Float(v) => v,
            Scalar::Int(v) => v as f64,
            Scalar::Bool(v) => v as i64 as f64,
        }
    }

    /// The value as i64 (floats truncated toward zero, bool as 0 or 1).
    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::Float(v) => v as i64,
            Scalar::Int(v) => v,
            Scalar::Bool(v) => v as i64,
        }
    }

    /// The 64 bits a kernel reads for this scalar when it computes in `compute`: f64 bits for
    /// float compute types, two's complement i64 otherwise.
    pub fn bits_for(self, compute: DType) -> u64 {
        if compute.is_float() {
            self.as_f64().to_bits()
        } else {
            self.as_i64() as u64
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Float(v) => write!(f, "{v:?}"),
            Scalar::Int(v) => write!(f, "{v}"),
            Scalar::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// One recorded op with its attributes. Views are not ops: they only change a handle's layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// An elementwise op of one operand.
    Unary(UnaryOp),
    /// An elementwise op of two operands.
    Binary(BinaryOp),
    /// `where(cond, a, b)`.
    Where,
    /// `clamp(x, min, max)`; absent bounds are `None` operands.
    Clamp,
    /// Conversion to another dtype (`.to(dtype)`, and `copy_` across dtypes).
    Cast(DType),
    /// Dense copy (`contiguous`, `clone`, `copy_`).
    Copy,
    /// Reduction over `dims` (empty = all dims).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The reduced dims (empty: all of them).
        dims: Dims,
        /// Keep the reduced dims as size 1 rather than drop them.
        keepdim: bool,
    },
    /// Concatenation along `dim`.
    Cat {
        /// The dim the operands are joined along.
        dim: usize,
    },
    /// A tensor of `sizes` filled with one scalar.
    Full {
        /// Shape of the result.
        sizes: Dims,
        /// Dtype of the result.
        dtype: DType,
    },
    /// `arange(start, end, step)`; operands are the three scalars.
    Arange {
        /// Dtype of the result.
        dtype: DType,
    },
    /// `torch.matmul` semantics (1-D, 2-D, batched with broadcasting).
    Matmul,
    /// `beta * input + alpha * (m1 @ m2)`; operands are input, m1, m2, beta, alpha.
    Addmm,
    /// Gather, scatter, scans, sort, random numbers: see [`KernelOp`].
    Kernel(KernelOp),
}

impl Op {
    /// The PyTorch-style name used in errors, logs and dumps.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Clamp => "clamp",
            Op::Cast(_) => "to",
            Op::Copy => "copy",
            Op::Reduce { op, .. } => op.name(),
            Op::Cat { .. } => "cat",
            Op::Full { .. } => "full",
            Op::Arange { .. } => "arange",
            Op::Matmul => "matmul",
            Op::Addmm => "addmm",
            Op::Kernel(k) => k.name(),
        }
    }

    /// Whether the op may run in place on operand `operand`, that is, with the operand being
    /// its own output (the same buffer and layout) and no copy of it taken first. A matrix
    /// product reads its factors across whole rows and columns while it writes the product,
    /// so a factor that is the output (`a.addmm_(a, w)`) must be copied first; `addmm`'s
    /// `input` is read only at the element being written. Every other op is safe: elementwise
    /// ops read the written element only, a reduction or `cat` whose operand has the output's
    /// layout reads nothing else, and the host kernels (gather, scatter, scans, sort) stage an
    /// output that shares a buffer with an operand themselves.
    pub fn can_run_in_place_on(&self, operand: usize) -> bool {
        match self {
            Op::Matmul => false,
            Op::Addmm => operand == 0,
            _ => true,
        }
    }

    /// Elementwise ops: one output element depends on the same-index input elements only.
    pub(crate) fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Clamp | Op::Cast(_) | Op::Copy
        ) || matches!(self, Op::Full { .. })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Cast(d) => write!(f, "to.{d}"),
            Op::Reduce { op, dims, keepdim } => {
                write!(f, "{}{:?}", op.name(), dims.as_slice())?;
                if *keepdim {
                    f.write_str(".keepdim")?;
                }
                Ok(())
            }
            Op::Cat { dim } => write!(f, "cat.{dim}"),
            Op::Full { sizes, dtype } => write!(f, "full.{dtype}{:?}", sizes.as_slice()),
            Op::Arange { dtype } => write!(f, "arange.{dtype}"),
            Op::Kernel(k) => write!(f, "{k}"),
            other => f.write_str(other.name()),
        }
    }
}
