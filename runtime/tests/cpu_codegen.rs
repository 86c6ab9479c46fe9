//! What the CPU backend's generated code must look like (read from the optimized Cranelift IR
//! a program keeps for dumps), where a slip costs speed but no test of values would notice.

mod common;

use common::{blocks, optimized_ir};
use deferfuse_fusion::ir::{BinaryOp, DType, Layout, Op, Scalar};
use deferfuse_fusion::lower::lower_node;
use deferfuse_fusion::trace::{Node, Operand, TensorRef};
use deferfuse_runtime::backend::cpu::CpuBackend;
use deferfuse_runtime::backend::Backend;

/// The optimized IR of `x * 0.5` over a [rows, cols] view with a row stride that keeps the
/// two loops from being coalesced into one.
fn optimized_ir_of_scale_by_param() -> String {
    let view = Layout {
        sizes: [64, 1000].into_iter().collect(),
        strides: [1024, 1].into_iter().collect(),
        offset: 0,
    };
    let t = |buffer| TensorRef {
        buffer,
        layout: view.clone(),
        dtype: DType::F32,
    };
    let node = Node {
        op: Op::Binary(BinaryOp::Mul),
        inputs: [Operand::Tensor(t(1)), Operand::Scalar(Scalar::Float(0.5))]
            .into_iter()
            .collect(),
        output: t(2),
        compute: DType::F32,
    };
    let step = lower_node(&node, 0).pop().expect("one step");
    let program = CpuBackend::new(true, 1)
        .unwrap()
        .compile(&step.region)
        .unwrap();
    optimized_ir(&program.listing()).to_string()
}

#[test]
fn scalar_params_are_converted_and_splatted_once_per_call_not_per_vector() {
    let ir = optimized_ir_of_scale_by_param();
    for (name, body) in blocks(&ir) {
        if name != "block0" {
            // A param arrives as f64 bits: bitcast, demote (then splat, which the scalar
            // tail also does to each loaded element, so it is not checked here).
            for inst in ["bitcast.f64", "fdemote"] {
                assert!(
                    !body.contains(inst),
                    "`{inst}` inside {name}: a loop invariant was not hoisted\n{ir}"
                );
            }
        }
    }
}

#[test]
fn row_addresses_are_computed_once_per_row_not_per_vector() {
    let ir = optimized_ir_of_scale_by_param();
    // A block that loads vectors is the vector loop: no row-stride multiply belongs there.
    for (name, body) in blocks(&ir) {
        if body.contains("load.f32x4") {
            assert!(
                !body.contains("imul"),
                "`imul` in the vector loop {name}: row addresses recomputed per vector\n{ir}"
            );
        }
    }
}
