//! Captured graphs: a trace captured once and launched on new inputs gives what recording its
//! ops again gives, records nothing, keeps stream order with eager ops, and refuses inputs and
//! captures it cannot replay.

use crate::harness;

use deferfuse::fusion::ir::{KernelOp, RandomDist};
use deferfuse::{BinaryOp, DType, Error, Handle, Mode, Op, ReduceOp, Runtime, Status, UnaryOp};
use harness::*;

/// The graph the tests capture: `b = exp(x * w) + 1` and `s = b.sum(1)` (two regions: an
/// elementwise loop feeding a reduction).
fn body(rt: &Runtime, ins: &[Handle]) -> Vec<Handle> {
    let a = bin(rt, BinaryOp::Mul, tt(ins[0]), tt(ins[1]));
    let b = bin(rt, BinaryOp::Add, tt(un(rt, UnaryOp::Exp, a)), fs(1.0));
    let s = run(rt, red(ReduceOp::Sum, &[1], false), &[tt(b)]);
    vec![b, s]
}

/// Captures `f` on `ins` (on the default stream); returns the graph and the capture's outputs.
fn capture(
    rt: &Runtime,
    ins: &[Handle],
    f: impl Fn(&Runtime, &[Handle]) -> Vec<Handle>,
) -> (Handle, Vec<Handle>) {
    rt.graph_capture_begin(0).unwrap();
    let outs = f(rt, ins);
    let g = rt.graph_capture_end(0, ins, &outs).unwrap();
    (g, outs)
}

fn f32s(rt: &Runtime, sizes: &[usize], seed: u64) -> Handle {
    let mut rng = Rng::new(seed);
    let n = sizes.iter().product();
    tensor(
        rt,
        DType::F32,
        sizes,
        &rng.values(DType::F32, n, 2.0, 0, false),
    )
}

fn bytes(rt: &Runtime, h: Handle) -> Vec<u8> {
    read_raw(rt, h).2
}

#[test]
fn a_launch_on_new_inputs_gives_the_bits_of_eager_defer() {
    let rt = runtime(Mode::Defer);
    let (g, _) = capture(&rt, &[f32s(&rt, &[4, 33], 1), f32s(&rt, &[4, 33], 2)], body);
    let ins = [f32s(&rt, &[4, 33], 3), f32s(&rt, &[4, 33], 4)];
    let launched = rt.graph_launch(0, g, &ins).unwrap();
    let eager = body(&rt, &ins);
    for (l, e) in launched.iter().zip(&eager) {
        assert_eq!(bytes(&rt, *l), bytes(&rt, *e));
        assert_eq!(rt.sizes(*l).unwrap(), rt.sizes(*e).unwrap());
    }
}

#[test]
fn launches_with_other_inputs_keep_each_launch_s_outputs() {
    let rt = runtime(Mode::Defer);
    let x = f32s(&rt, &[3, 8], 1);
    let (g, _) = capture(&rt, &[x, f32s(&rt, &[3, 8], 2)], body);
    let first = rt.graph_launch(0, g, &[x, f32s(&rt, &[3, 8], 5)]).unwrap();
    let w2 = f32s(&rt, &[3, 8], 6);
    let second = rt.graph_launch(0, g, &[x, w2]).unwrap();
    let want_first = body(&rt, &[x, f32s(&rt, &[3, 8], 5)]);
    let want_second = body(&rt, &[x, w2]);
    assert_eq!(bytes(&rt, first[1]), bytes(&rt, want_first[1]));
    assert_eq!(bytes(&rt, second[1]), bytes(&rt, want_second[1]));
    assert_ne!(bytes(&rt, first[1]), bytes(&rt, second[1]));
}

#[test]
fn a_launch_records_no_ops() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, _) = capture(&rt, &ins, body);
    rt.synchronize(0).unwrap();
    let before = rt.stats();
    let outs = rt.graph_launch(0, g, &ins).unwrap();
    rt.synchronize(0).unwrap();
    let after = rt.stats();
    assert_eq!(after.ops_recorded, before.ops_recorded);
    assert!(after.programs_run > before.programs_run, "{after:?}");
    assert_eq!(after.programs_compiled, before.programs_compiled);
    assert_eq!(outs.len(), 2);
}

#[test]
fn a_launch_with_the_wrong_input_count_is_refused_naming_the_graph() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, _) = capture(&rt, &ins, body);
    let e = rt.graph_launch(0, g, &ins[..1]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    let m = e.to_string();
    assert!(
        m.contains(&format!("graph {g:#x}")) && m.contains("expected 2 inputs"),
        "{m}"
    );
    assert!(m.contains("given 1"), "{m}");
}

#[test]
fn an_input_of_another_shape_is_refused_naming_the_slot_expected_and_given() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, _) = capture(&rt, &ins, body);
    let e = rt
        .graph_launch(0, g, &[ins[0], f32s(&rt, &[3, 5], 3)])
        .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("input 1") && m.contains("[2, 5]") && m.contains("[3, 5]"),
        "{m}"
    );
}

#[test]
fn an_input_of_another_dtype_is_refused_naming_the_slot() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, _) = capture(&rt, &ins, body);
    let x64 = tensor(&rt, DType::F64, &[2, 5], &[1.0; 10]);
    let m = rt
        .graph_launch(0, g, &[x64, ins[1]])
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("input 0") && m.contains("float32") && m.contains("float64"),
        "{m}"
    );
}

#[test]
fn two_inputs_on_one_buffer_are_refused_when_the_capture_had_two() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, _) = capture(&rt, &ins, body);
    let m = rt
        .graph_launch(0, g, &[ins[0], ins[0]])
        .unwrap_err()
        .to_string();
    assert!(m.contains("input 1") && m.contains("another does"), "{m}");
}

#[test]
fn a_destroyed_graph_handle_is_refused() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, _) = capture(&rt, &ins, body);
    rt.graph_destroy(g).unwrap();
    let e = rt.graph_launch(0, g, &ins).unwrap_err();
    assert_eq!(e.status(), Status::InvalidHandle);
    assert!(e.to_string().contains("graph_launch"), "{e}");
    assert_eq!(
        rt.graph_destroy(g).unwrap_err().status(),
        Status::InvalidHandle
    );
}

#[test]
fn a_graph_outlives_the_tensors_it_was_captured_on() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, outs) = capture(&rt, &ins, body);
    rt.synchronize(0).unwrap();
    // The graph keeps no handle of its own: only its capture's tensors are released here.
    let live = rt.live_tensors();
    for h in ins.iter().chain(&outs) {
        rt.release(*h).unwrap();
    }
    assert_eq!(rt.live_tensors(), live - 4);
    let ins = [f32s(&rt, &[2, 5], 3), f32s(&rt, &[2, 5], 4)];
    let launched = rt.graph_launch(0, g, &ins).unwrap();
    let eager = body(&rt, &ins);
    assert_eq!(bytes(&rt, launched[1]), bytes(&rt, eager[1]));
}

/// `w -= 0.5 * x`, in place, then `w * 2` as the output.
fn step(rt: &Runtime, ins: &[Handle]) -> Vec<Handle> {
    let upd = bin(rt, BinaryOp::Mul, tt(ins[0]), fs(0.5));
    rt.op(
        0,
        Op::Binary(BinaryOp::Sub),
        &[tt(ins[1]), tt(upd)],
        Some(ins[1]),
    )
    .unwrap();
    vec![bin(rt, BinaryOp::Mul, tt(ins[1]), fs(2.0))]
}

#[test]
fn a_launch_writes_in_place_into_its_inputs_as_eager_ops_do() {
    let rt = runtime(Mode::Defer);
    let (x, w) = (f32s(&rt, &[6], 1), f32s(&rt, &[6], 2));
    let (g, _) = capture(&rt, &[x, w], step);
    let (x2, w2, w_eager) = (f32s(&rt, &[6], 3), f32s(&rt, &[6], 4), f32s(&rt, &[6], 4));
    let out = rt.graph_launch(0, g, &[x2, w2]).unwrap();
    let want = step(&rt, &[x2, w_eager]);
    assert_eq!(bytes(&rt, w2), bytes(&rt, w_eager));
    assert_eq!(bytes(&rt, out[0]), bytes(&rt, want[0]));
}

#[test]
fn a_launch_runs_after_earlier_eager_ops_and_before_later_ones_in_every_mode() {
    for mode in [Mode::Strict, Mode::Debug, Mode::Defer] {
        let rt = runtime(Mode::Defer);
        let (x, w) = (f32s(&rt, &[6], 1), f32s(&rt, &[6], 2));
        let (g, _) = capture(&rt, &[x, w], step);
        rt.synchronize(0).unwrap();
        rt.set_mode(mode);
        let (x2, w2) = (f32s(&rt, &[6], 3), f32s(&rt, &[6], 4));
        let (xe, we) = (f32s(&rt, &[6], 3), f32s(&rt, &[6], 4));
        // An eager op writes an input before the launch, another reads an output after it,
        // and one writes the mutated input after it.
        let mut after = vec![];
        for (h, graph) in [((x2, w2), true), ((xe, we), false)] {
            rt.op(0, Op::Unary(UnaryOp::Neg), &[tt(h.0)], Some(h.0))
                .unwrap();
            let out = if graph {
                rt.graph_launch(0, g, &[h.0, h.1]).unwrap()[0]
            } else {
                step(&rt, &[h.0, h.1])[0]
            };
            after.push(bin(&rt, BinaryOp::Add, tt(out), fs(1.0)));
            rt.op(0, Op::Binary(BinaryOp::Mul), &[tt(h.1), fs(3.0)], Some(h.1))
                .unwrap();
        }
        assert_eq!(bytes(&rt, after[0]), bytes(&rt, after[1]), "{mode:?}");
        assert_eq!(bytes(&rt, w2), bytes(&rt, we), "{mode:?}");
        assert_eq!(bytes(&rt, x2), bytes(&rt, xe), "{mode:?}");
    }
}

#[test]
fn a_later_eager_op_reads_a_launch_s_output_after_it_is_written() {
    for mode in [Mode::Strict, Mode::Debug, Mode::Defer] {
        let rt = runtime(Mode::Defer);
        let ins = [f32s(&rt, &[3, 4], 1), f32s(&rt, &[3, 4], 2)];
        let (g, _) = capture(&rt, &ins, body);
        rt.synchronize(0).unwrap();
        rt.set_mode(mode);
        let out = rt.graph_launch(0, g, &ins).unwrap();
        let got = bin(&rt, BinaryOp::Mul, tt(out[1]), fs(2.0));
        let want = bin(&rt, BinaryOp::Mul, tt(body(&rt, &ins)[1]), fs(2.0));
        assert_eq!(bytes(&rt, got), bytes(&rt, want), "{mode:?}");
    }
}

#[test]
fn a_capture_with_a_host_read_is_refused_and_its_ops_still_run() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    rt.graph_capture_begin(0).unwrap();
    let outs = body(&rt, &ins);
    let read = bytes(&rt, outs[1]);
    let e = rt.graph_capture_end(0, &ins, &outs).unwrap_err();
    assert_eq!(e.status(), Status::NotCapturable);
    assert!(e.to_string().contains("host read"), "{e}");
    assert_eq!(read, bytes(&rt, body(&rt, &ins)[1]));
}

#[test]
fn a_capture_with_a_random_op_is_refused_naming_it() {
    let rt = runtime(Mode::Defer);
    rt.graph_capture_begin(0).unwrap();
    let op = Op::Kernel(KernelOp::Random {
        dist: RandomDist::Uniform,
        sizes: [4usize].as_slice().into(),
        dtype: DType::F32,
    });
    let r = run(&rt, op, &[is(1), is(0)]);
    let e = rt.graph_capture_end(0, &[], &[r]).unwrap_err();
    assert!(matches!(e, Error::NotCapturable(_)), "{e}");
    assert!(e.to_string().contains("rand"), "{e}");
    assert_eq!(download(&rt, r).data.len(), 4);
}

#[test]
fn a_capture_ended_twice_is_refused_naming_the_stream() {
    let rt = runtime(Mode::Defer);
    rt.graph_capture_begin(0).unwrap();
    rt.graph_capture_end(0, &[], &[]).unwrap();
    let m = rt.graph_capture_end(0, &[], &[]).unwrap_err().to_string();
    assert!(m.contains("no capture begun"), "{m}");
    rt.graph_capture_begin(0).unwrap();
    let m = rt.graph_capture_begin(0).unwrap_err().to_string();
    assert!(m.contains("already capturing"), "{m}");
    rt.graph_capture_abort(0).unwrap();
}

#[test]
fn a_tensor_the_graph_holds_is_read_at_each_launch() {
    let rt = runtime(Mode::Defer);
    let held = tensor(&rt, DType::F32, &[3], &[1.0, 2.0, 3.0]);
    let x = f32s(&rt, &[3], 1);
    let add_held =
        |rt: &Runtime, ins: &[Handle]| vec![bin(rt, BinaryOp::Add, tt(ins[0]), tt(held))];
    let (g, _) = capture(&rt, &[x], add_held);
    rt.op(
        0,
        Op::Binary(BinaryOp::Mul),
        &[tt(held), fs(10.0)],
        Some(held),
    )
    .unwrap();
    let out = rt.graph_launch(0, g, &[x]).unwrap()[0];
    assert_eq!(bytes(&rt, out), bytes(&rt, add_held(&rt, &[x])[0]));
}

#[test]
fn a_launch_waits_for_another_stream_s_pending_write_of_its_input() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[3, 4], 1), f32s(&rt, &[3, 4], 2)];
    let (g, _) = capture(&rt, &ins, body);
    let (x, x_eager) = (f32s(&rt, &[3, 4], 3), f32s(&rt, &[3, 4], 3));
    let side = rt.create_stream().unwrap();
    for h in [x, x_eager] {
        rt.op(side, Op::Unary(UnaryOp::Exp), &[tt(h)], Some(h))
            .unwrap();
    }
    // x's write is still pending on the other stream when the launch reads it.
    let out = rt.graph_launch(0, g, &[x, ins[1]]).unwrap();
    let want = body(&rt, &[x_eager, ins[1]]);
    assert_eq!(bytes(&rt, out[1]), bytes(&rt, want[1]));
}

#[test]
fn a_capture_longer_than_the_pending_limit_is_not_cut_by_it() {
    let rt = Runtime::new(deferfuse::Config {
        mode: Some(Mode::Defer),
        max_pending_ops: 2,
        ..Default::default()
    })
    .unwrap();
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, _) = capture(&rt, &ins, body);
    let out = rt.graph_launch(0, g, &ins).unwrap();
    assert_eq!(bytes(&rt, out[1]), bytes(&rt, body(&rt, &ins)[1]));
}

/// A matmul, an elementwise epilogue and a row sum (`[4, 8] @ [8, 6]`, then `exp(.) + 1`,
/// summed over rows): on the CPU JIT a matmul region and a reduction region.
fn matmul_body(rt: &Runtime, ins: &[Handle]) -> Vec<Handle> {
    let m = run(rt, Op::Matmul, &[tt(ins[0]), tt(ins[1])]);
    let e = bin(rt, BinaryOp::Add, tt(un(rt, UnaryOp::Exp, m)), fs(1.0));
    vec![run(rt, red(ReduceOp::Sum, &[1], false), &[tt(e)])]
}

/// Programs run by `f` and a synchronize.
fn programs_run(rt: &Runtime, f: impl FnOnce() -> Vec<Handle>) -> (u64, Vec<Handle>) {
    rt.synchronize(0).unwrap();
    let before = rt.stats().programs_run;
    let out = f();
    rt.synchronize(0).unwrap();
    (rt.stats().programs_run - before, out)
}

#[test]
fn a_launch_runs_the_programs_its_flush_would_one_on_a_backend_that_fuses_whole_programs() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[4, 8], 1), f32s(&rt, &[8, 6], 2)];
    let (g, _) = capture(&rt, &ins, matmul_body);
    let (launched, out) = programs_run(&rt, || rt.graph_launch(0, g, &ins).unwrap());
    let (flushed, want) = programs_run(&rt, || matmul_body(&rt, &ins));
    assert_eq!(launched, flushed);
    // PJRT plans the capture as it plans a flush: one StableHLO module for the whole graph.
    if rt.backend_name() == "pjrt" {
        assert_eq!(launched, 1);
    } else {
        assert_eq!(launched, 2);
    }
    assert_eq!(bytes(&rt, out[0]), bytes(&rt, want[0]));
}

#[test]
fn a_small_graph_launched_on_an_idle_stream_has_run_when_the_launch_returns() {
    let rt = runtime(Mode::Defer);
    let ins = [f32s(&rt, &[2, 5], 1), f32s(&rt, &[2, 5], 2)];
    let (g, _) = capture(&rt, &ins, body);
    rt.synchronize(0).unwrap();
    // Run on the launching thread (no hand-off to the stream's worker), as a small strict op.
    let out = rt.graph_launch(0, g, &ins).unwrap();
    for h in &out {
        assert_eq!(rt.state(*h).unwrap(), deferfuse::BufferState::Materialized);
    }
    assert_eq!(bytes(&rt, out[1]), bytes(&rt, body(&rt, &ins)[1]));
}
