//! Bad calls fail at their own call, in every mode, with an error that names the op and the
//! operand, record nothing, and leave the runtime (and its pending deferred work) usable.

use crate::harness;

use deferfuse::runtime::mode::mode_from_env;
use deferfuse::{BinaryOp, Config, DType, Error, Handle, Input, Mode, Op, ReduceOp, Runtime, View};
use harness::*;

type Setup = fn(&Runtime) -> Vec<Handle>;
type Call = fn(&Runtime, &[Handle]) -> deferfuse::runtime::error::Result<Handle>;

/// Runs `call` after `setup` in every mode, with unrelated deferred work pending; returns the
/// error after checking that nothing was recorded and the pending work still reads right.
fn fails_in_every_mode(setup: Setup, call: Call) -> Vec<Error> {
    MODES
        .iter()
        .map(|&mode| {
            let rt = runtime(mode);
            let x = tensor(&rt, DType::F32, &[3], &[1.0, 2.0, 3.0]);
            let y = bin(&rt, BinaryOp::Mul, tt(x), fs(2.0));
            let hs = setup(&rt);
            let before = rt.stats().ops_recorded;
            let e = match call(&rt, &hs) {
                Ok(h) => panic!("{mode:?}: expected an error, got handle {h}"),
                Err(e) => e,
            };
            assert_eq!(
                rt.stats().ops_recorded,
                before,
                "{mode:?}: a failed call recorded an op: {e}"
            );
            assert_eq!(
                download(&rt, y).data,
                [2.0, 4.0, 6.0],
                "{mode:?}: pending work after {e}"
            );
            // Still usable.
            let z = bin(&rt, BinaryOp::Add, tt(y), fs(1.0));
            assert_eq!(download(&rt, z).data, [3.0, 5.0, 7.0], "{mode:?}");
            e
        })
        .collect()
}

/// Asserts an `Error::Op` for `op`/`operand` whose message mentions every string in `mentions`.
fn assert_op_error(errors: &[Error], op: &str, operand: &str, mentions: &[&str]) {
    for e in errors {
        let Error::Op(o) = e else {
            panic!("expected Error::Op for {op}, got {e:?}");
        };
        assert_eq!((o.op.as_str(), o.operand.as_str()), (op, operand), "{e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("{op}: {operand}: expected ")),
            "{msg}"
        );
        for m in mentions {
            assert!(msg.contains(m), "{msg:?} should mention {m:?}");
        }
    }
}

fn f32s(rt: &Runtime, sizes: &[usize]) -> Handle {
    let n = sizes.iter().product();
    tensor(rt, DType::F32, sizes, &vec![1.0; n])
}

#[test]
fn mismatched_broadcast_shapes_name_the_op_and_operand() {
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3]), f32s(rt, &[4])],
        |rt, h| rt.op(0, Op::Binary(BinaryOp::Add), &[tt(h[0]), tt(h[1])], None),
    );
    assert_op_error(&e, "add", "input 1", &["[2, 3]", "[4]"]);
    let e = fails_in_every_mode(
        |rt| {
            vec![
                tensor(rt, DType::Bool, &[3], &[1.0; 3]),
                f32s(rt, &[3]),
                f32s(rt, &[2]),
            ]
        },
        |rt, h| rt.op(0, Op::Where, &[tt(h[0]), tt(h[1]), tt(h[2])], None),
    );
    assert_op_error(&e, "where", "input 2", &["[2]"]);
}

#[test]
fn bad_reduce_dims_are_rejected() {
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3])],
        |rt, h| rt.op(0, red(ReduceOp::Sum, &[2], false), &[tt(h[0])], None),
    );
    assert_op_error(&e, "sum", "dim", &["2"]);
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3])],
        |rt, h| rt.op(0, red(ReduceOp::Argmax, &[0, 1], false), &[tt(h[0])], None),
    );
    assert_op_error(&e, "argmax", "dim", &["[0, 1]"]);
}

#[test]
fn mean_of_int_is_rejected() {
    let e = fails_in_every_mode(
        |rt| vec![tensor(rt, DType::I32, &[3], &[1.0, 2.0, 3.0])],
        |rt, h| rt.op(0, red(ReduceOp::Mean, &[], false), &[tt(h[0])], None),
    );
    assert_op_error(&e, "mean", "input 0", &["int32", "float"]);
}

#[test]
fn where_needs_a_bool_condition() {
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[3]), f32s(rt, &[3])],
        |rt, h| rt.op(0, Op::Where, &[tt(h[0]), tt(h[1]), tt(h[1])], None),
    );
    assert_op_error(&e, "where", "condition", &["bool", "float32"]);
}

#[test]
fn matmul_inner_size_mismatch_is_rejected() {
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3]), f32s(rt, &[4, 5])],
        |rt, h| rt.op(0, Op::Matmul, &[tt(h[0]), tt(h[1])], None),
    );
    assert_op_error(&e, "matmul", "input 1", &["[4, 5]", "[2, 3]"]);
    let e = fails_in_every_mode(
        |rt| {
            vec![
                f32s(rt, &[2, 3]),
                tensor(rt, DType::F64, &[3, 2], &[0.0; 6]),
            ]
        },
        |rt, h| rt.op(0, Op::Matmul, &[tt(h[0]), tt(h[1])], None),
    );
    assert_op_error(&e, "matmul", "input 1", &["float64"]);
}

#[test]
fn products_and_arange_refuse_an_out_of_another_dtype() {
    // They write the result's dtype into `out` as it is: a bf16 product into a float32 `out`
    // read back as float32 was garbage. PyTorch's mm/addmm/bmm refuse it too.
    fn bf16(rt: &Runtime, sizes: &[usize]) -> Handle {
        let n = sizes.iter().product();
        tensor(rt, DType::BF16, sizes, &vec![1.0; n])
    }
    let e = fails_in_every_mode(
        |rt| vec![bf16(rt, &[5, 6]), bf16(rt, &[6, 7]), f32s(rt, &[5, 7])],
        |rt, h| rt.op(0, Op::Matmul, &[tt(h[0]), tt(h[1])], Some(h[2])),
    );
    assert_op_error(&e, "matmul", "out", &["bfloat16", "float32"]);
    let e = fails_in_every_mode(
        |rt| {
            vec![
                bf16(rt, &[7]),
                bf16(rt, &[5, 6]),
                bf16(rt, &[6, 7]),
                f32s(rt, &[5, 7]),
            ]
        },
        |rt, h| {
            let ins = [tt(h[0]), tt(h[1]), tt(h[2]), fs(1.0), fs(1.0)];
            rt.op(0, Op::Addmm, &ins, Some(h[3]))
        },
    );
    assert_op_error(&e, "addmm", "out", &["bfloat16", "float32"]);
    let e = fails_in_every_mode(
        |rt| vec![tensor(rt, DType::F64, &[5], &[0.0; 5])],
        |rt, h| {
            let ins = [is(0), is(5), is(1)];
            rt.op(0, Op::Arange { dtype: DType::I32 }, &ins, Some(h[0]))
        },
    );
    assert_op_error(&e, "arange", "out", &["int32", "float64"]);
}

#[test]
fn a_gather_into_a_wider_out_converts_each_element() {
    for mode in MODES {
        let rt = runtime(mode);
        let src = tensor(&rt, DType::F32, &[4], &[1.5, 2.5, 3.5, 4.5]);
        let idx = tensor(&rt, DType::I64, &[3], &[3.0, 0.0, 1.0]);
        let out = tensor(&rt, DType::F64, &[3], &[0.0; 3]);
        let gather = Op::Kernel(deferfuse::fusion::ir::KernelOp::Gather { dim: 0 });
        rt.op(0, gather, &[tt(src), tt(idx)], Some(out)).unwrap();
        assert_eq!(download(&rt, out).data, [4.5, 1.5, 2.5], "{mode:?}");
    }
}

#[test]
fn in_place_float_result_into_int_out_is_rejected() {
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[3]), tensor(rt, DType::I32, &[3], &[0.0; 3])],
        |rt, h| {
            rt.op(
                0,
                Op::Binary(BinaryOp::Add),
                &[tt(h[0]), tt(h[0])],
                Some(h[1]),
            )
        },
    );
    assert_op_error(&e, "add", "out", &["float32", "int32"]);
    // A bool out cannot take an int result either, nor a result of another shape.
    let e = fails_in_every_mode(
        |rt| {
            vec![
                tensor(rt, DType::I32, &[3], &[1.0; 3]),
                tensor(rt, DType::Bool, &[3], &[0.0; 3]),
            ]
        },
        |rt, h| {
            rt.op(
                0,
                Op::Unary(deferfuse::UnaryOp::Neg),
                &[tt(h[0])],
                Some(h[1]),
            )
        },
    );
    assert_op_error(&e, "neg", "out", &["int32", "bool"]);
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[3]), f32s(rt, &[1])],
        |rt, h| {
            rt.op(
                0,
                Op::Binary(BinaryOp::Mul),
                &[tt(h[0]), fs(2.0)],
                Some(h[1]),
            )
        },
    );
    assert_op_error(&e, "mul", "out", &["[3]", "[1]"]);
}

#[test]
fn in_place_into_an_expanded_view_is_rejected() {
    let e = fails_in_every_mode(
        |rt| {
            let row = f32s(rt, &[1, 3]);
            vec![
                row,
                view(rt, row, View::Expand(vec![4, 3])),
                f32s(rt, &[4, 3]),
            ]
        },
        |rt, h| {
            rt.op(
                0,
                Op::Binary(BinaryOp::Add),
                &[tt(h[2]), fs(1.0)],
                Some(h[1]),
            )
        },
    );
    assert_op_error(&e, "add", "out", &["expanded"]);
}

#[test]
fn views_past_the_buffer_and_bad_reshapes_are_rejected() {
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3])],
        |rt, h| {
            let v = View::AsStrided {
                sizes: vec![3, 3],
                strides: vec![3, 1],
                offset: 2,
            };
            rt.view(0, h[0], &v)
        },
    );
    for err in &e {
        let Error::InvalidArgument(m) = err else {
            panic!("expected InvalidArgument, got {err:?}");
        };
        assert!(
            m.starts_with("as_strided:") && m.contains("past its buffer of 24 bytes"),
            "{m}"
        );
    }
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3])],
        |rt, h| rt.view(0, h[0], &View::Reshape(vec![4])),
    );
    assert_op_error(&e, "reshape", "shape", &["6 elements", "[4]"]);
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3])],
        |rt, h| rt.view(0, h[0], &View::Reshape(vec![-1, 4])),
    );
    assert_op_error(&e, "reshape", "shape", &["6 elements"]);
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3])],
        |rt, h| rt.view(0, h[0], &View::Select { dim: 1, index: 3 }),
    );
    assert_op_error(&e, "select", "index", &["3"]);
}

#[test]
fn stale_handles_are_invalid_handle_errors() {
    for mode in MODES {
        let rt = runtime(mode);
        let x = f32s(&rt, &[3]);
        let y = bin(&rt, BinaryOp::Mul, tt(x), fs(2.0));
        rt.release(x).unwrap();
        let e = rt
            .op(0, Op::Binary(BinaryOp::Add), &[tt(x), fs(1.0)], None)
            .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidHandle(m) if m.starts_with("add: input 0")),
            "{mode:?}: {e:?}"
        );
        let e = rt
            .op(0, Op::Binary(BinaryOp::Add), &[tt(y), fs(1.0)], Some(x))
            .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidHandle(m) if m.starts_with("add: out")),
            "{mode:?}: {e:?}"
        );
        let mut b = [0u8; 12];
        assert!(matches!(
            rt.to_host(x, &mut b),
            Err(Error::InvalidHandle(_))
        ));
        assert!(
            matches!(rt.release(x), Err(Error::InvalidHandle(_))),
            "double release"
        );
        assert!(matches!(
            rt.view(0, x, &View::Transpose(0, 0)),
            Err(Error::InvalidHandle(_))
        ));
        assert_eq!(e.status(), deferfuse::Status::InvalidHandle);
        // A handle of another runtime is not valid here either.
        let other = runtime(mode);
        let o = f32s(&other, &[3]);
        assert!(
            matches!(rt.sizes(o), Err(Error::InvalidHandle(_))),
            "{mode:?}"
        );
        // The released input's values are still what y was computed from.
        assert_eq!(download(&rt, y).data, [2.0, 2.0, 2.0]);
    }
}

#[test]
fn host_copies_with_the_wrong_byte_length_are_rejected() {
    for mode in MODES {
        let rt = runtime(mode);
        let e = rt.from_host(&[0u8; 7], DType::F32, &[2]).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.starts_with("from_host") && m.contains("7 bytes") && m.contains("needs 8")),
            "{e:?}"
        );
        let x = f32s(&rt, &[2]);
        let mut small = [0u8; 4];
        let e = rt.to_host(x, &mut small).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.starts_with("to_host")),
            "{e:?}"
        );
        assert_eq!(e.status(), deferfuse::Status::InvalidArgument);
    }
}

#[test]
fn other_bad_ops_are_rejected() {
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[2, 3]), f32s(rt, &[3, 3])],
        |rt, h| rt.op(0, Op::Cat { dim: 1 }, &[tt(h[0]), tt(h[1])], None),
    );
    assert_op_error(&e, "cat", "input 1", &["[3, 3]"]);
    let e = fails_in_every_mode(
        |_| vec![],
        |rt, _| {
            rt.op(
                0,
                Op::Arange { dtype: DType::F32 },
                &[fs(0.0), fs(1.0), fs(0.0)],
                None,
            )
        },
    );
    assert_op_error(&e, "arange", "step", &["non-zero"]);
    let e = fails_in_every_mode(
        |rt| vec![tensor(rt, DType::Bool, &[3], &[1.0; 3])],
        |rt, h| rt.op(0, Op::Binary(BinaryOp::Sub), &[tt(h[0]), tt(h[0])], None),
    );
    assert_op_error(&e, "sub", "inputs", &["bool"]);
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[3])],
        |rt, h| rt.op(0, Op::Binary(BinaryOp::Add), &[tt(h[0])], None),
    );
    assert_op_error(&e, "add", "inputs", &["2 operands"]);
    let e = fails_in_every_mode(
        |rt| vec![tensor(rt, DType::I32, &[3], &[1.0; 3])],
        |rt, h| {
            rt.op(
                0,
                Op::Unary(deferfuse::UnaryOp::GeluErf),
                &[Input::Tensor(h[0])],
                None,
            )
        },
    );
    assert_op_error(&e, "gelu", "input 0", &["int32"]);
}

#[test]
fn bitwise_not_of_a_float_tensor_is_rejected_like_pytorch() {
    let e = fails_in_every_mode(
        |rt| vec![f32s(rt, &[3])],
        |rt, h| {
            rt.op(
                0,
                Op::Unary(deferfuse::UnaryOp::BitwiseNot),
                &[tt(h[0])],
                None,
            )
        },
    );
    assert_op_error(
        &e,
        "bitwise_not",
        "input 0",
        &["expected an integer or bool tensor, got float32"],
    );
}

#[test]
fn bitwise_binary_ops_reject_a_float_operand_naming_it() {
    let e = fails_in_every_mode(
        |rt| vec![tensor(rt, DType::I32, &[3], &[1.0; 3]), f32s(rt, &[3])],
        |rt, h| {
            rt.op(
                0,
                Op::Binary(BinaryOp::BitwiseAnd),
                &[tt(h[0]), tt(h[1])],
                None,
            )
        },
    );
    assert_op_error(
        &e,
        "bitwise_and",
        "input 1",
        &["integer or bool", "float32"],
    );
    let e = fails_in_every_mode(
        |rt| vec![tensor(rt, DType::I64, &[3], &[1.0; 3])],
        |rt, h| {
            rt.op(
                0,
                Op::Binary(BinaryOp::BitwiseXor),
                &[tt(h[0]), fs(2.5)],
                None,
            )
        },
    );
    assert_op_error(&e, "bitwise_xor", "input 1", &["float scalar 2.5"]);
}

fn bools(rt: &Runtime) -> Vec<Handle> {
    vec![tensor(rt, DType::Bool, &[3], &[1.0; 3])]
}

#[test]
fn division_family_rejects_two_bool_operands() {
    let e = fails_in_every_mode(bools, |rt, h| {
        rt.op(0, Op::Binary(BinaryOp::Fmod), &[tt(h[0]), tt(h[0])], None)
    });
    assert_op_error(&e, "fmod", "inputs", &["two bool operands"]);
    let e = fails_in_every_mode(bools, |rt, h| {
        rt.op(
            0,
            Op::Binary(BinaryOp::FloorDivide),
            &[tt(h[0]), tt(h[0])],
            None,
        )
    });
    assert_op_error(&e, "floor_divide", "inputs", &["two bool operands"]);
    let e = fails_in_every_mode(bools, |rt, h| {
        rt.op(
            0,
            Op::Binary(BinaryOp::TruncDivide),
            &[tt(h[0]), tt(h[0])],
            None,
        )
    });
    assert_op_error(&e, "div_trunc", "inputs", &["two bool operands"]);
}

#[test]
fn trunc_of_a_bool_tensor_is_rejected() {
    let e = fails_in_every_mode(bools, |rt, h| {
        rt.op(0, Op::Unary(deferfuse::UnaryOp::Trunc), &[tt(h[0])], None)
    });
    assert_op_error(&e, "trunc", "input 0", &["numeric", "bool"]);
}

#[test]
fn invalid_env_values_and_configs_are_config_errors() {
    let e = mode_from_env(Some("maybe"), None).unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("TORCH_TPU_DEFER_AND_FUSE") && m.contains("maybe")),
        "{e:?}"
    );
    assert_eq!(e.status(), deferfuse::Status::Config);
    let e = mode_from_env(None, Some("2")).unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("TORCH_TPU_LAUNCH_BLOCKING")),
        "{e:?}"
    );
    // Valid values, for contrast.
    assert_eq!(
        mode_from_env(Some("TRUE"), Some("0")).unwrap(),
        (Mode::Defer, false)
    );
    assert_eq!(mode_from_env(None, None).unwrap(), (Mode::Strict, false));
    let e = match Runtime::new(Config {
        mode: Some(Mode::Defer),
        max_pending_ops: 0,
        ..Default::default()
    }) {
        Ok(_) => panic!("max_pending_ops = 0 is invalid"),
        Err(e) => e,
    };
    assert!(
        matches!(&e, Error::Config(m) if m.contains("max_pending_ops")),
        "{e:?}"
    );
}
