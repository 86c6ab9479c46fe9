//! Gather and scatter inside whole-program modules on the real XLA plugin: a step that picks a
//! loss's targets, looks up embeddings or accumulates their gradients stays one XLA program,
//! gives the CPU backend's values, and a bad index fails with the CPU backend's error at the
//! sync point, with no value computed from it reaching the host. Tests read
//! `DEFERFUSE_PJRT_PLUGIN` and skip with a message when it is not set.

use crate::harness::{gather, plugin, scatter};
use deferfuse::fusion::ir::ScatterReduce;
use deferfuse::{
    BackendKind, BinaryOp, DType, Error, Handle, Input, Mode, Op, ReduceOp, Runtime, Scalar, View,
};

use crate::pjrt_whole_program::runtime;

/// A CPU backend runtime and a PJRT one, both in defer mode.
fn both() -> Option<[Runtime; 2]> {
    let p = plugin()?;
    Some([
        runtime(BackendKind::Cpu, None, Mode::Defer),
        runtime(BackendKind::Pjrt, Some(p), Mode::Defer),
    ])
}

fn tensor(rt: &Runtime, dtype: DType, sizes: &[usize], vals: &[f64]) -> Handle {
    let bytes: Vec<u8> = match dtype {
        DType::F32 => vals
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect(),
        DType::I64 => vals
            .iter()
            .flat_map(|&v| (v as i64).to_le_bytes())
            .collect(),
        DType::I32 => vals
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect(),
        other => unreachable!("the tests use f32, i64 and i32, not {other}"),
    };
    rt.from_host(&bytes, dtype, sizes).expect("from_host")
}

fn op(rt: &Runtime, op: Op, ins: &[Input]) -> Handle {
    rt.op(0, op.clone(), ins, None)
        .unwrap_or_else(|e| panic!("{op}: {e}"))
}

fn read_f32(rt: &Runtime, h: Handle) -> Result<Vec<f32>, Error> {
    let n: usize = rt.sizes(h).expect("sizes").iter().product();
    let mut b = vec![0u8; n * 4];
    rt.to_host(h, &mut b)?;
    Ok(b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn t(h: Handle) -> Input {
    Input::Tensor(h)
}

fn f(v: f64) -> Input {
    Input::Scalar(Scalar::Float(v))
}

fn mul(rt: &Runtime, a: Input, b: Input) -> Handle {
    op(rt, Op::Binary(BinaryOp::Mul), &[a, b])
}

fn sum_all(rt: &Runtime, x: Handle) -> Handle {
    op(
        rt,
        Op::Reduce {
            op: ReduceOp::Sum,
            dims: Default::default(),
            keepdim: false,
        },
        &[t(x)],
    )
}

/// Runs `build` on both backends, reads what it returns, and checks the PJRT run was
/// `programs` XLA programs and its values are the CPU backend's.
fn same_values_in_programs(programs: u64, build: impl Fn(&Runtime) -> Vec<Handle>) {
    let Some([cpu, pj]) = both() else { return };
    let want: Vec<Vec<f32>> = build(&cpu)
        .into_iter()
        .map(|h| read_f32(&cpu, h).expect("cpu"))
        .collect();
    let outs = build(&pj);
    let before = pj.stats().programs_run;
    // One flush for all of it: a host read would end the first program at its value (see
    // `host_reads.rs`).
    pj.synchronize(0).expect("sync");
    let got: Vec<Vec<f32>> = outs
        .into_iter()
        .map(|h| read_f32(&pj, h).expect("pjrt"))
        .collect();
    assert_eq!(pj.stats().programs_run - before, programs, "XLA programs");
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.len(), g.len(), "result {k}: lengths");
        for (i, (a, b)) in w.iter().zip(g).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + a.abs()),
                "result {k}[{i}]: cpu {a}, pjrt {b}"
            );
        }
    }
}

#[test]
fn a_gather_between_elementwise_ops_is_part_of_one_program() {
    same_values_in_programs(1, |rt| {
        let x = tensor(
            rt,
            DType::F32,
            &[3, 4],
            &(0..12).map(f64::from).collect::<Vec<_>>(),
        );
        let idx = tensor(rt, DType::I64, &[3, 2], &[3.0, 0.0, 1.0, 1.0, 2.0, 3.0]);
        let y = mul(rt, t(x), f(2.0));
        let g = op(rt, gather(1), &[t(y), t(idx)]);
        let z = mul(rt, t(g), f(3.0));
        vec![z, sum_all(rt, z)]
    });
}

#[test]
fn an_index_select_through_a_broadcast_index_matches_the_cpu_backend() {
    // index_select's index is viewed with stride 0 along the other dims (no expanded copy).
    same_values_in_programs(1, |rt| {
        let w = tensor(
            rt,
            DType::F32,
            &[5, 3],
            &(0..15).map(f64::from).collect::<Vec<_>>(),
        );
        let ids = tensor(rt, DType::I32, &[4], &[4.0, 0.0, 4.0, 2.0]);
        let w2 = mul(rt, t(w), f(0.5));
        let ex = rt
            .view(
                0,
                ids,
                &View::AsStrided {
                    sizes: vec![4, 3],
                    strides: vec![1, 0],
                    offset: 0,
                },
            )
            .expect("view");
        let e = op(rt, gather(0), &[t(w2), t(ex)]);
        vec![mul(rt, t(e), f(1.0))]
    });
}

#[test]
fn scatter_sum_amax_and_amin_with_and_without_self_match_the_cpu_backend() {
    for reduce in [ScatterReduce::Sum, ScatterReduce::Amax, ScatterReduce::Amin] {
        for include_self in [true, false] {
            same_values_in_programs(1, |rt| {
                let base = tensor(rt, DType::F32, &[4, 3], &[1.0; 12]);
                let this = mul(rt, t(base), f(-2.0));
                // Duplicate targets combine; row 3 receives nothing and keeps its value.
                let idx = tensor(
                    rt,
                    DType::I64,
                    &[3, 3],
                    &[0., 1., 2., 0., 1., 0., 2., 2., 2.],
                );
                let src = tensor(
                    rt,
                    DType::F32,
                    &[3, 3],
                    &[5., -1., 3., 4., 7., -6., 2., 9., 0.5],
                );
                let s = mul(rt, t(src), f(1.5));
                let r = op(
                    rt,
                    scatter(0, reduce, include_self),
                    &[t(this), t(idx), t(s)],
                );
                vec![mul(rt, t(r), f(1.0))]
            });
        }
    }
}

#[test]
fn a_scatter_of_a_scalar_value_counts_like_the_cpu_backend() {
    // embedding's scale_grad_by_freq counts each index with a scalar scatter_add.
    same_values_in_programs(1, |rt| {
        let zeros = tensor(rt, DType::F32, &[6], &[0.0; 6]);
        let z = mul(rt, t(zeros), f(1.0));
        let idx = tensor(rt, DType::I64, &[5], &[1.0, 4.0, 1.0, 1.0, 0.0]);
        let c = op(
            rt,
            scatter(0, ScatterReduce::Sum, true),
            &[t(z), t(idx), f(1.0)],
        );
        vec![mul(rt, t(c), f(2.0))]
    });
}

fn assert_index_error(e: &Error, msg: &str) {
    assert!(matches!(e, Error::IndexOutOfBounds(_)), "{e:?}");
    assert_eq!(e.to_string(), msg);
}

/// A step whose gather reads `bad` in its second row: returns what the host may read.
fn step_with_index(rt: &Runtime, bad: f64) -> (Handle, Handle) {
    let x = tensor(rt, DType::F32, &[2, 5], &[1.0; 10]);
    let y = mul(rt, t(x), f(2.0));
    let idx = tensor(rt, DType::I64, &[2, 2], &[0.0, 4.0, bad, 9.0]);
    let g = op(rt, gather(1), &[t(y), t(idx)]);
    let loss = sum_all(rt, g);
    (g, loss)
}

#[test]
fn a_bad_index_in_a_program_fails_the_sync_point_with_the_cpu_backends_error() {
    let Some(rts) = both() else { return };
    for rt in &rts {
        let (g, loss) = step_with_index(rt, -3.0);
        // The first bad value in the host routine's order: -3 comes before 9.
        let msg = "gather: index -3 is out of bounds for dim 1 with size 5";
        assert_index_error(&read_f32(rt, loss).unwrap_err(), msg);
        assert_index_error(&read_f32(rt, g).unwrap_err(), msg);
        // The runtime stays usable and the error is not raised again by unrelated work.
        let (_, ok) = step_with_index(rt, 1.0);
        assert!(read_f32(rt, ok).is_err(), "9 is out of bounds too");
        let x = tensor(rt, DType::F32, &[2], &[1.0, 2.0]);
        assert_eq!(read_f32(rt, mul(rt, t(x), f(3.0))).unwrap(), [3.0, 6.0]);
    }
}

#[test]
fn only_values_computed_from_a_bad_index_fail() {
    let Some(rts) = both() else { return };
    for rt in &rts {
        let x = tensor(rt, DType::F32, &[2, 5], &[1.0; 10]);
        let y = mul(rt, t(x), f(2.0));
        let idx = tensor(rt, DType::I64, &[2, 1], &[0.0, 5.0]);
        let g = op(rt, gather(1), &[t(y), t(idx)]);
        let loss = sum_all(rt, g);
        // Recorded in the same flush, but not computed from the gather.
        let other = mul(rt, t(y), f(3.0));
        let msg = "gather: index 5 is out of bounds for dim 1 with size 5";
        assert_index_error(&read_f32(rt, loss).unwrap_err(), msg);
        assert_eq!(read_f32(rt, other).unwrap(), [6.0; 10]);
    }
}

#[test]
fn a_bad_scatter_index_fails_with_the_cpu_backends_error() {
    let Some(rts) = both() else { return };
    for rt in &rts {
        let this = tensor(rt, DType::F32, &[4], &[0.0; 4]);
        let z = mul(rt, t(this), f(1.0));
        let idx = tensor(rt, DType::I64, &[2], &[1.0, 4.0]);
        let r = op(
            rt,
            scatter(0, ScatterReduce::Sum, true),
            &[t(z), t(idx), f(1.0)],
        );
        let out = mul(rt, t(r), f(2.0));
        assert_index_error(
            &read_f32(rt, out).unwrap_err(),
            "scatter_reduce: index 4 is out of bounds for dim 0 with size 4",
        );
    }
}

/// Launches what is recorded and polls until it ran: the programs run, but no sync point
/// reads anything.
fn run_unread(rt: &Runtime) {
    while !rt.query_stream(0).expect("query") {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_programs_bounds_check_is_read_at_the_sync_point_that_needs_it_not_after_its_launch() {
    let Some(p) = plugin() else { return };
    let rt = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let x = tensor(&rt, DType::F32, &[2, 5], &[1.0; 10]);
    let idx = tensor(&rt, DType::I64, &[2, 1], &[0.0, 4.0]);
    let loss = sum_all(
        &rt,
        op(&rt, gather(1), &[t(mul(&rt, t(x), f(2.0))), t(idx)]),
    );
    let downloads = || rt.stats().backend.device_downloads;
    let before = downloads();
    run_unread(&rt);
    assert_eq!(downloads(), before, "the program ran and nothing came back");
    assert_eq!(read_f32(&rt, loss).unwrap(), [4.0]);
    assert_eq!(
        downloads() - before,
        2,
        "the check and the value, at the read"
    );
}

#[test]
fn a_value_computed_from_a_bad_index_before_a_sync_point_read_it_fails_where_it_is_read() {
    let Some(p) = plugin() else { return };
    let rt = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let (g, _) = step_with_index(&rt, 0.0);
    run_unread(&rt);
    // Recorded before any sync point read the check: it runs in a second program, and its
    // value carries the gather's error (the CPU backend refuses the op itself, its gather
    // having raised at launch; see the next test for what a sync point changes).
    let later = mul(&rt, t(g), f(2.0));
    let msg = "gather: index 9 is out of bounds for dim 1 with size 5";
    assert_index_error(&read_f32(&rt, later).unwrap_err(), msg);
}

#[test]
fn after_a_synchronize_an_op_on_a_value_from_a_bad_index_is_refused_as_on_the_cpu_backend() {
    let Some(rts) = both() else { return };
    for rt in &rts {
        let (g, _) = step_with_index(rt, 0.0);
        rt.synchronize(0)
            .expect("the failure is carried, not raised");
        let e = rt.op(0, Op::Binary(BinaryOp::Mul), &[t(g), f(2.0)], None);
        let msg = "gather: index 9 is out of bounds for dim 1 with size 5";
        assert_index_error(&e.unwrap_err(), msg);
    }
}
