//! Where a lowered step's scalar slots get their bits: from the node's scalar inputs, converted
//! as the kernels read them. Lowering computes every slot through a [`ScalarSlot`], so a
//! lowering cached for one node and re-bound to a later node of the same structure
//! ([`crate::node_cache`]) holds exactly the bits lowering that node would.

use crate::ir::{DType, Scalar};
use crate::trace::{Node, Operand};

/// The 64 bits a kernel reads for scalar `s` used as a value of dtype `to`. A scalar becomes a
/// bool by truthiness (0.5 -> true), like `torch.full(.., dtype=bool)`. A float16/bfloat16
/// operand is rounded to that dtype first (through float32, as c10's `Half(float)` does): PyTorch
/// casts a Python scalar to the op's dtype before computing, so `f16 + 0.1` adds 0.0999755859375
/// (mul and div keep the scalar in float32 by computing in float32: see `infer_binary`).
pub(crate) fn scalar_bits(s: Scalar, to: DType) -> u64 {
    match to {
        DType::Bool => (s.as_f64() != 0.0) as u64,
        DType::F16 => f64::from(half::f16::from_f32(s.as_f64() as f32)).to_bits(),
        DType::BF16 => f64::from(half::bf16::from_f32(s.as_f64() as f32)).to_bits(),
        _ => s.bits_for(to.compute()),
    }
}

/// How one scalar slot of a step [`crate::lower::lower_node`] made gets its 64 bits from the node's inputs.
/// Lowering computes every slot through one of these, so a cached lowering re-bound to a later
/// node of the same structure ([`crate::node_cache`]) gets exactly the bits lowering that node
/// would give.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarSlot {
    /// [`scalar_bits`] of scalar input `input` used as a `to` (loop parameters, kernel values).
    Bits {
        /// Index of the scalar among the node's inputs.
        input: usize,
        /// The dtype the slot holds it as.
        to: DType,
    },
    /// Input `input` as f64 bits, `absent` when it is not a scalar (arange's start and step,
    /// addmm's alpha and beta).
    F64 {
        /// Index of the input.
        input: usize,
        /// The value when the input is not a scalar.
        absent: f64,
    },
    /// Scalar input `input` as an i64 (a random op's seed and offset).
    I64 {
        /// Index of the scalar among the node's inputs.
        input: usize,
    },
    /// Bits that do not come from the node (matmul's alpha 1 and beta 0).
    Const(u64),
}

impl ScalarSlot {
    /// The slot's bits for `node`.
    pub fn bits(self, node: &Node) -> u64 {
        let scalar = |i: usize| match node.inputs[i] {
            Operand::Scalar(s) => Some(s),
            _ => None,
        };
        let expect = "a scalar slot's input is a scalar";
        match self {
            ScalarSlot::Bits { input, to } => scalar_bits(scalar(input).expect(expect), to),
            ScalarSlot::F64 { input, absent } => {
                scalar(input).map_or(absent, |s| s.as_f64()).to_bits()
            }
            ScalarSlot::I64 { input } => scalar(input).expect(expect).as_i64() as u64,
            ScalarSlot::Const(bits) => bits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Layout, Op};
    use crate::lower::lower_node_rebindable;
    use crate::trace::TensorRef;

    #[test]
    fn a_scalar_used_as_float16_or_bfloat16_is_rounded_to_that_dtype_first() {
        let f16_of_tenth = f64::from_bits(scalar_bits(Scalar::Float(0.1), DType::F16));
        assert_eq!(f16_of_tenth, 0.0999755859375);
        let bf16_of_tenth = f64::from_bits(scalar_bits(Scalar::Float(0.1), DType::BF16));
        assert_eq!(bf16_of_tenth, 0.10009765625);
        let big = f64::from_bits(scalar_bits(Scalar::Int(70000), DType::F16));
        assert_eq!(big, f64::INFINITY, "70000 overflows float16 as in PyTorch");
    }

    #[test]
    fn a_scalar_used_as_float32_or_float64_keeps_its_precision_there() {
        let f32_bits = scalar_bits(Scalar::Float(0.1), DType::F32);
        assert_eq!(
            f64::from_bits(f32_bits),
            0.1,
            "the backend rounds f64 to f32 itself"
        );
        assert_eq!(scalar_bits(Scalar::Float(2.5), DType::Bool), 1);
    }

    /// Lowers `node` and checks each step's scalars against its slots recomputed from the node.
    fn slots_give_the_lowered_scalars(node: &Node) {
        let l = lower_node_rebindable(node, 0);
        assert_eq!(l.steps.len(), l.slots.len());
        for (s, slots) in l.steps.iter().zip(&l.slots) {
            let again: Vec<u64> = slots.iter().map(|x| x.bits(node)).collect();
            assert_eq!(s.binding.scalars, again, "{node}");
        }
    }

    #[test]
    fn each_lowered_scalar_slot_says_where_its_bits_come_from() {
        use crate::ir::{KernelOp, RandomDist, ScatterReduce};
        use smallvec::smallvec;
        let t = |buffer, dtype| TensorRef {
            buffer,
            layout: Layout::contiguous(&[2, 2]),
            dtype,
        };
        let f = |v: f64| Operand::Scalar(Scalar::Float(v));
        let i = |v: i64| Operand::Scalar(Scalar::Int(v));
        let node = |op, inputs, output: TensorRef| Node {
            op,
            inputs,
            compute: output.dtype.compute(),
            output,
        };
        let x = |b| Operand::Tensor(t(b, DType::F16));
        let idx = Operand::Tensor(t(2, DType::I64));
        let scatter = KernelOp::Scatter {
            dim: 0,
            reduce: ScatterReduce::Sum,
            include_self: true,
            wide: false,
        };
        let random = KernelOp::Random {
            dist: RandomDist::Uniform,
            sizes: smallvec![2, 2],
            dtype: DType::F32,
        };
        let arange = Op::Arange { dtype: DType::F32 };
        let f32_out = TensorRef {
            layout: Layout::contiguous(&[4]),
            ..t(9, DType::F32)
        };
        let f32_mat = |b| Operand::Tensor(t(b, DType::F32));
        let addmm = |beta| {
            let inputs = smallvec![f32_mat(1), f32_mat(2), f32_mat(3), f(beta), f(-2.0)];
            node(Op::Addmm, inputs, t(9, DType::F32))
        };
        let nodes = [
            node(Op::Clamp, smallvec![x(1), f(0.1), f(0.7)], t(9, DType::F16)),
            node(
                Op::Where,
                smallvec![Operand::Tensor(t(1, DType::Bool)), f(1.5), i(3)],
                t(9, DType::F32),
            ),
            node(
                Op::Kernel(scatter),
                smallvec![x(1), idx, f(0.3)],
                t(9, DType::F16),
            ),
            node(Op::Kernel(random), smallvec![i(42), i(7)], t(9, DType::F32)),
            node(arange, smallvec![f(1.0), f(5.0), f(1.0)], f32_out),
            addmm(0.5),
            addmm(-0.0),
            node(
                Op::Matmul,
                smallvec![f32_mat(1), f32_mat(2)],
                t(9, DType::F32),
            ),
        ];
        for n in &nodes {
            slots_give_the_lowered_scalars(n);
        }
    }
}
