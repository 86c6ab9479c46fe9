//! The DeferAndFuse planner and program cache, specified by their observable effects: results
//! equal strict mode bit for bit (no reassociation happens in these graphs), and the stats show
//! what was fused, dropped, cut and compiled.

use deferfuse::fusion::plan::CutReason;
use deferfuse::*;
use std::sync::Arc;

fn rt(mode: Mode) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        ..Default::default()
    })
    .unwrap()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

/// An f32 vector of `n` values from `seed`, as an optimizer's parameter or state.
fn parameter(r: &Runtime, n: usize, seed: u32) -> Handle {
    r.from_host(&f32s(&data(n, seed)), DType::F32, &[n])
        .unwrap()
}

fn read(rt: &Runtime, h: Handle) -> Vec<u32> {
    let n: usize = rt.sizes(h).unwrap().iter().product();
    let mut b = vec![0u8; n * 4];
    rt.to_host(h, &mut b).unwrap();
    b.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn t(h: Handle) -> Input {
    Input::Tensor(h)
}
fn s(v: f64) -> Input {
    Input::Scalar(Scalar::Float(v))
}
fn bin(rt: &Runtime, b: BinaryOp, x: Input, y: Input) -> Handle {
    rt.op(0, Op::Binary(b), &[x, y], None).unwrap()
}

/// chain10 of shared/notes/workloads.md; intermediates released as PyTorch would.
fn chain10(rt: &Runtime, a: Handle, b: Handle, c: Handle) -> Handle {
    let mut tmp = vec![];
    let mut k = |h: Handle| {
        tmp.push(h);
        h
    };
    let x = k(bin(rt, BinaryOp::Mul, t(a), t(b)));
    let x = k(bin(rt, BinaryOp::Add, t(x), t(c)));
    let x = k(bin(rt, BinaryOp::Mul, t(x), s(0.5)));
    let x = k(bin(rt, BinaryOp::Sub, t(x), t(a)));
    let y = k(rt.op(0, Op::Unary(UnaryOp::Abs), &[t(b)], None).unwrap());
    let y = k(bin(rt, BinaryOp::Add, t(y), s(1.0)));
    let x = k(bin(rt, BinaryOp::Div, t(x), t(y)));
    let x = k(bin(rt, BinaryOp::Maximum, t(x), s(0.0)));
    let x = k(bin(rt, BinaryOp::Mul, t(x), t(c)));
    let z = k(bin(rt, BinaryOp::Mul, t(a), t(a)));
    let out = bin(rt, BinaryOp::Add, t(x), t(z));
    for h in tmp {
        rt.release(h).unwrap();
    }
    out
}

fn chain10_result(mode: Mode, n: usize) -> (Vec<u32>, Stats) {
    let r = rt(mode);
    let a = r.from_host(&f32s(&data(n, 1)), DType::F32, &[n]).unwrap();
    let b = r.from_host(&f32s(&data(n, 2)), DType::F32, &[n]).unwrap();
    let c = r.from_host(&f32s(&data(n, 3)), DType::F32, &[n]).unwrap();
    let before = r.stats();
    let out = chain10(&r, a, b, c);
    let v = read(&r, out);
    let mut st = r.stats();
    st.programs_run -= before.programs_run;
    st.bytes_allocated -= before.bytes_allocated;
    (v, st)
}

#[test]
fn elementwise_chain_runs_as_one_program_and_equals_strict() {
    let (strict, ss) = chain10_result(Mode::Strict, 1003);
    let (defer, ds) = chain10_result(Mode::Defer, 1003);
    assert_eq!(strict, defer, "defer must equal strict bit for bit");
    assert_eq!(ss.programs_run, 11);
    assert_eq!(ds.programs_run, 1);
}

#[test]
fn released_intermediates_are_never_materialized() {
    let (_, ds) = chain10_result(Mode::Defer, 1000);
    // Only the output buffer is allocated; the 10 intermediates live in registers.
    assert_eq!(ds.bytes_allocated, 1000 * 4);
    assert_eq!(ds.unmaterialized, 10);
}

#[test]
fn ops_nobody_can_observe_are_dropped() {
    let r = rt(Mode::Defer);
    let x = r.from_host(&f32s(&[1.0; 8]), DType::F32, &[8]).unwrap();
    let y = r.op(0, Op::Unary(UnaryOp::Exp), &[t(x)], None).unwrap();
    r.release(y).unwrap();
    r.synchronize(0).unwrap();
    let st = r.stats();
    assert_eq!((st.dead_nodes, st.programs_run), (1, 0));
}

#[test]
fn reduction_absorbs_its_elementwise_producers() {
    let r = rt(Mode::Defer);
    let x = r
        .from_host(&f32s(&data(64, 4)), DType::F32, &[4, 16])
        .unwrap();
    let sq = bin(&r, BinaryOp::Mul, t(x), t(x));
    let sum = r
        .op(
            0,
            Op::Reduce {
                op: ReduceOp::Sum,
                dims: [1usize].into_iter().collect(),
                keepdim: false,
            },
            &[t(sq)],
            None,
        )
        .unwrap();
    r.release(sq).unwrap();
    let got = read(&r, sum);
    assert_eq!(r.stats().programs_run, 1);
    let s2 = rt(Mode::Strict);
    let x2 = s2
        .from_host(&f32s(&data(64, 4)), DType::F32, &[4, 16])
        .unwrap();
    let sq2 = bin(&s2, BinaryOp::Mul, t(x2), t(x2));
    let sum2 = s2
        .op(
            0,
            Op::Reduce {
                op: ReduceOp::Sum,
                dims: [1usize].into_iter().collect(),
                keepdim: false,
            },
            &[t(sq2)],
            None,
        )
        .unwrap();
    assert_eq!(got, read(&s2, sum2));
}

/// `sqrt(sum(x * x, dims))` without keepdim, as `vector_norm` records it.
fn norm(r: &Runtime, x: Handle, dims: &[usize]) -> Handle {
    let sq = bin(r, BinaryOp::Mul, t(x), t(x));
    let reduce = Op::Reduce {
        op: ReduceOp::Sum,
        dims: dims.iter().copied().collect(),
        keepdim: false,
    };
    let s = r.op(0, reduce, &[t(sq)], None).unwrap();
    let n = r.op(0, Op::Unary(UnaryOp::Sqrt), &[t(s)], None).unwrap();
    r.release(sq).unwrap();
    r.release(s).unwrap();
    n
}

#[test]
fn an_op_on_a_full_reduction_result_runs_in_its_row_kernel_and_equals_strict() {
    // sqrt of a full sum ([] from [40]) is the row kernel's last op; it was a program of its
    // own on one element (one per parameter in clip_grad_norm_). Row sums ([8] from [8, 40])
    // keep their own loop for what follows.
    let mut results = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let v = parameter(&r, 40, 8);
        let m = r
            .from_host(&f32s(&data(320, 9)), DType::F32, &[8, 40])
            .unwrap();
        let before = r.stats().programs_run;
        let full = norm(&r, v, &[0]);
        let bits = read(&r, full);
        let full_programs = r.stats().programs_run - before;
        let rows = norm(&r, m, &[1]);
        results.push(((bits, read(&r, rows)), full_programs));
    }
    assert_eq!(results[0].0, results[1].0);
    assert_eq!(results[1].1, 1, "one program for the full norm");
}

#[test]
fn ops_on_a_reduction_over_empty_rows_run_after_it() {
    // A row kernel computes ops on a reduced value in its last sweep over the row, which runs
    // no iteration over an empty row: log(sum(exp(x))) of a [3, 0] tensor gave 0, not -inf.
    for keepdim in [false, true] {
        let r = rt(Mode::Defer);
        let x = r.from_host(&[], DType::F32, &[3, 0]).unwrap();
        let e = r.op(0, Op::Unary(UnaryOp::Exp), &[t(x)], None).unwrap();
        let reduce = Op::Reduce {
            op: ReduceOp::Sum,
            dims: [1usize].into_iter().collect(),
            keepdim,
        };
        let s = r.op(0, reduce, &[t(e)], None).unwrap();
        let l = r.op(0, Op::Unary(UnaryOp::Log), &[t(s)], None).unwrap();
        let want = vec![f32::NEG_INFINITY.to_bits(); 3];
        assert_eq!(read(&r, l), want, "keepdim {keepdim}");
    }
}

fn softmax(r: &Runtime, x: Handle) -> Handle {
    let red = |op| Op::Reduce {
        op,
        dims: [1usize].into_iter().collect(),
        keepdim: true,
    };
    let m = r.op(0, red(ReduceOp::Amax), &[t(x)], None).unwrap();
    let d = bin(r, BinaryOp::Sub, t(x), t(m));
    let e = r.op(0, Op::Unary(UnaryOp::Exp), &[t(d)], None).unwrap();
    let sm = r.op(0, red(ReduceOp::Sum), &[t(e)], None).unwrap();
    let y = bin(r, BinaryOp::Div, t(e), t(sm));
    for h in [m, d, e, sm] {
        r.release(h).unwrap();
    }
    y
}

#[test]
fn softmax_is_one_program_and_equals_strict() {
    let mut results = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let x = r
            .from_host(&f32s(&data(37 * 70, 5)), DType::F32, &[37, 70])
            .unwrap();
        let y = softmax(&r, x);
        results.push((read(&r, y), r.stats().programs_run));
    }
    assert_eq!(results[0].0, results[1].0);
    // One row kernel: amax, then exp(x - max) summed and stashed, then the division of the
    // stashed values.
    assert_eq!((results[0].1, results[1].1), (5, 1));
}

/// One AdamW-style update, written with in-place ops as an optimizer does.
fn adamw_step(r: &Runtime, p: Handle, g: Handle, m: Handle, v: Handle, lr: f64) {
    let inplace = |b, x: Input, y: Input, out: Handle| {
        r.op(0, Op::Binary(b), &[x, y], Some(out)).unwrap();
    };
    inplace(BinaryOp::Mul, t(p), s(1.0 - lr * 0.01), p);
    inplace(BinaryOp::Mul, t(m), s(0.9), m);
    let g1 = bin(r, BinaryOp::Mul, t(g), s(0.1));
    inplace(BinaryOp::Add, t(m), t(g1), m);
    inplace(BinaryOp::Mul, t(v), s(0.999), v);
    let g2 = bin(r, BinaryOp::Mul, t(g), t(g));
    let g2s = bin(r, BinaryOp::Mul, t(g2), s(0.001));
    inplace(BinaryOp::Add, t(v), t(g2s), v);
    let den = r.op(0, Op::Unary(UnaryOp::Sqrt), &[t(v)], None).unwrap();
    let den2 = bin(r, BinaryOp::Add, t(den), s(1e-8));
    let upd = bin(r, BinaryOp::Div, t(m), t(den2));
    let upd2 = bin(r, BinaryOp::Mul, t(upd), s(lr));
    inplace(BinaryOp::Sub, t(p), t(upd2), p);
    for h in [g1, g2, g2s, den, den2, upd, upd2] {
        r.release(h).unwrap();
    }
}

#[test]
fn in_place_optimizer_update_fuses_and_equals_strict() {
    let mut out = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let mk = |seed| parameter(&r, 301, seed);
        let (p, g, m, v) = (mk(6), mk(7), mk(8), mk(9));
        let v0 = r.op(0, Op::Unary(UnaryOp::Abs), &[t(v)], None).unwrap();
        for step in 0..3 {
            adamw_step(&r, p, g, m, v0, 1e-3 * (step + 1) as f64);
        }
        let before = r.stats().programs_run;
        adamw_step(&r, p, g, m, v0, 1e-3);
        let res = (read(&r, p), read(&r, m), read(&r, v0));
        out.push((res, r.stats().programs_run - before));
    }
    assert_eq!(out[0].0, out[1].0, "defer must equal strict bit for bit");
    assert_eq!(out[1].1, 1, "one AdamW step is one fused program");
}

#[test]
fn independent_updates_of_one_shape_are_cut_by_their_memory_streams() {
    // Three parameters of one size: fused together, one loop would stream 12 arrays.
    let mut out = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let mk = |seed| parameter(&r, 301, seed);
        let params: Vec<[Handle; 4]> = (0..3)
            .map(|k| {
                let v = mk(40 + 4 * k);
                let v0 = r.op(0, Op::Unary(UnaryOp::Abs), &[t(v)], None).unwrap();
                [mk(41 + 4 * k), mk(42 + 4 * k), mk(43 + 4 * k), v0]
            })
            .collect();
        r.synchronize(0).unwrap();
        let before = r.stats();
        for &[p, g, m, v] in &params {
            adamw_step(&r, p, g, m, v, 1e-3);
        }
        r.synchronize(0).unwrap();
        let st = r.stats();
        let vals: Vec<Vec<u32>> = params.iter().map(|&[p, ..]| read(&r, p)).collect();
        let cuts = st.cuts[CutReason::MaxOps as usize] - before.cuts[CutReason::MaxOps as usize];
        out.push((vals, st.programs_run - before.programs_run, cuts));
    }
    assert_eq!(out[0].0, out[1].0, "defer must equal strict bit for bit");
    let (programs, cuts) = (out[1].1, out[1].2);
    assert_eq!(
        (programs, cuts),
        (2, 1),
        "at most {} loaded buffers per loop: two parameters per program",
        deferfuse::fusion::plan::MAX_LOADED_BUFFERS
    );
}

/// SGD with momentum and weight decay over `params` ([p, g, m] each), op-major as PyTorch's
/// foreach optimizers record it: every parameter's op before the next op.
fn sgd_step_op_major(r: &Runtime, params: &[[Handle; 3]], lr: f64) {
    let each = |f: &dyn Fn(&[Handle; 3]) -> Handle| params.iter().map(f).collect::<Vec<_>>();
    let decay = each(&|&[p, _, _]| bin(r, BinaryOp::Mul, t(p), s(5e-4)));
    let grads: Vec<Handle> = params
        .iter()
        .zip(&decay)
        .map(|(&[_, g, _], &d)| bin(r, BinaryOp::Add, t(g), t(d)))
        .collect();
    for &[_, _, m] in params {
        r.op(0, Op::Binary(BinaryOp::Mul), &[t(m), s(0.9)], Some(m))
            .unwrap();
    }
    for (&[_, _, m], &d) in params.iter().zip(&grads) {
        r.op(0, Op::Binary(BinaryOp::Add), &[t(m), t(d)], Some(m))
            .unwrap();
    }
    let steps = each(&|&[_, _, m]| bin(r, BinaryOp::Mul, t(m), s(lr)));
    for (&[p, _, _], &st) in params.iter().zip(&steps) {
        r.op(0, Op::Binary(BinaryOp::Sub), &[t(p), t(st)], Some(p))
            .unwrap();
    }
    for h in decay.into_iter().chain(grads).chain(steps) {
        r.release(h).unwrap();
    }
}

#[test]
fn op_major_updates_of_one_shape_fuse_parameter_by_parameter_and_equal_strict() {
    let mut out = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let mk = |seed| parameter(&r, 301, seed);
        let params: Vec<[Handle; 3]> = (0..3)
            .map(|k| [mk(60 + 3 * k), mk(61 + 3 * k), mk(62 + 3 * k)])
            .collect();
        r.synchronize(0).unwrap();
        let before = r.stats().programs_run;
        sgd_step_op_major(&r, &params, 1e-3);
        r.synchronize(0).unwrap();
        let programs = r.stats().programs_run - before;
        let vals: Vec<(Vec<u32>, Vec<u32>)> = params
            .iter()
            .map(|&[p, _, m]| (read(&r, p), read(&r, m)))
            .collect();
        out.push((vals, programs));
    }
    assert_eq!(out[0].0, out[1].0, "defer must equal strict bit for bit");
    // Chain by chain, two parameters' updates (p, g, m each) and the start of the third fill
    // one loop's buffer bound; op-major, the momenta and decayed gradients were split over
    // three loops.
    assert_eq!(out[1].1, 2);
}

#[test]
fn changing_scalars_and_batch_sizes_compile_nothing_after_the_first_iteration() {
    let r = rt(Mode::Defer);
    let w = r
        .from_host(&f32s(&data(16, 10)), DType::F32, &[16])
        .unwrap();
    let mut compiled_after_first = None;
    for (i, batch) in [8usize, 13, 64, 1000, 3, 77].into_iter().enumerate() {
        let x = r
            .from_host(&f32s(&data(batch * 16, i as u32)), DType::F32, &[batch, 16])
            .unwrap();
        let y = bin(&r, BinaryOp::Mul, t(x), t(w));
        let y2 = bin(&r, BinaryOp::Add, t(y), s(0.1 * i as f64));
        let act = r.op(0, Op::Unary(UnaryOp::Tanh), &[t(y2)], None).unwrap();
        let loss = r
            .op(
                0,
                Op::Reduce {
                    op: ReduceOp::Mean,
                    dims: Default::default(),
                    keepdim: false,
                },
                &[t(act)],
                None,
            )
            .unwrap();
        read(&r, loss);
        for h in [x, y, y2, act, loss] {
            r.release(h).unwrap();
        }
        let c = r.stats().programs_compiled;
        match compiled_after_first {
            None => compiled_after_first = Some(c),
            Some(c0) => assert_eq!(
                c, c0,
                "iteration {i} (batch {batch}) compiled a new program"
            ),
        }
    }
}

#[test]
fn loop_carried_chain_does_not_grow() {
    let r = rt(Mode::Defer);
    let mut x = r.from_host(&f32s(&[0.0; 4]), DType::F32, &[4]).unwrap();
    let mut runs = vec![];
    for _ in 0..20 {
        let before = r.stats();
        let y = bin(&r, BinaryOp::Mul, t(x), s(0.5));
        let z = bin(&r, BinaryOp::Add, t(y), s(1.0));
        r.release(y).unwrap();
        r.release(x).unwrap();
        x = z;
        read(&r, x);
        let after = r.stats();
        runs.push((
            after.programs_run - before.programs_run,
            after.ops_recorded - before.ops_recorded,
        ));
    }
    // Each iteration records 2 ops and runs 1 program: executed values are inputs, never
    // recomputed.
    assert!(runs.iter().all(|&r| r == (1, 2)), "{runs:?}");
    let v = f32::from_bits(read(&r, x)[0]);
    assert!((v - 2.0).abs() < 1e-4, "x converges to 2, got {v}");
}

#[test]
fn max_ops_per_region_cuts_long_chains() {
    let r = Runtime::new(Config {
        mode: Some(Mode::Defer),
        max_ops_per_region: 4,
        ..Default::default()
    })
    .unwrap();
    let mut x = r.from_host(&f32s(&[1.0; 8]), DType::F32, &[8]).unwrap();
    for _ in 0..10 {
        let y = bin(&r, BinaryOp::Add, t(x), s(1.0));
        r.release(x).unwrap();
        x = y;
    }
    assert_eq!(
        read(&r, x)
            .iter()
            .map(|&b| f32::from_bits(b))
            .collect::<Vec<_>>(),
        vec![11.0; 8]
    );
    let st = r.stats();
    assert_eq!(st.cuts[CutReason::MaxOps as usize], 2);
    assert_eq!(st.programs_run, 3);
}

#[test]
fn memory_bound_forces_a_flush() {
    let r = Runtime::new(Config {
        mode: Some(Mode::Defer),
        max_pending_bytes: 1000,
        ..Default::default()
    })
    .unwrap();
    let x = r.from_host(&f32s(&[1.0; 128]), DType::F32, &[128]).unwrap();
    let mut keep = vec![];
    for _ in 0..3 {
        keep.push(bin(&r, BinaryOp::Add, t(x), s(1.0)));
    }
    let st = r.stats();
    assert_eq!(st.sync_points[SyncReason::MemoryBound as usize], 1);
    assert_ne!(r.state(keep[0]).unwrap(), BufferState::Deferred);
}

#[test]
fn two_threads_missing_the_same_program_compile_it_once() {
    let r = Arc::new(rt(Mode::Strict));
    let x = r.from_host(&f32s(&[1.0; 8]), DType::F32, &[8]).unwrap();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let r = r.clone();
            std::thread::spawn(move || {
                let y = r.op(0, Op::Unary(UnaryOp::Sin), &[t(x)], None).unwrap();
                r.synchronize(0).unwrap();
                y
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(r.stats().programs_compiled, 1);
}

#[test]
fn dump_dir_gets_region_text_and_graphviz() {
    let dir = std::env::temp_dir().join(format!("deferfuse-dump-{}", std::process::id()));
    // Through the config, not the environment: other suites create runtimes in this process.
    let r = Runtime::new(Config {
        mode: Some(Mode::Defer),
        dump_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    let x = r.from_host(&f32s(&[1.0; 8]), DType::F32, &[8]).unwrap();
    let y = bin(&r, BinaryOp::Mul, t(x), s(3.0));
    read(&r, y);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let txt = names
        .iter()
        .find(|n| n.ends_with(".txt"))
        .expect("a .txt dump");
    assert!(names.iter().any(|n| n.ends_with(".dot")));
    let body = std::fs::read_to_string(dir.join(txt)).unwrap();
    assert!(body.contains("mul") && body.contains("function"), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn layernorm(r: &Runtime, x: Handle, w: Handle, b: Handle) -> Handle {
    let mean = |h| {
        r.op(
            0,
            Op::Reduce {
                op: ReduceOp::Mean,
                dims: [1usize].into_iter().collect(),
                keepdim: true,
            },
            &[t(h)],
            None,
        )
        .unwrap()
    };
    let mu = mean(x);
    let d = bin(r, BinaryOp::Sub, t(x), t(mu));
    let d2 = bin(r, BinaryOp::Mul, t(d), t(d));
    let var = mean(d2);
    let ve = bin(r, BinaryOp::Add, t(var), s(1e-5));
    let rs = r.op(0, Op::Unary(UnaryOp::Rsqrt), &[t(ve)], None).unwrap();
    let y = bin(r, BinaryOp::Mul, t(d), t(rs));
    let yw = bin(r, BinaryOp::Mul, t(y), t(w));
    let out = bin(r, BinaryOp::Add, t(yw), t(b));
    for h in [mu, d, d2, var, ve, rs, y, yw] {
        r.release(h).unwrap();
    }
    out
}

#[test]
fn layernorm_is_one_row_kernel_and_equals_strict() {
    let mut results = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let x = r
            .from_host(&f32s(&data(33 * 64, 11)), DType::F32, &[33, 64])
            .unwrap();
        let w = r
            .from_host(&f32s(&data(64, 12)), DType::F32, &[64])
            .unwrap();
        let b = r
            .from_host(&f32s(&data(64, 13)), DType::F32, &[64])
            .unwrap();
        let before = r.stats().programs_run;
        let y = layernorm(&r, x, w, b);
        results.push((read(&r, y), r.stats().programs_run - before));
    }
    assert_eq!(results[0].0, results[1].0);
    // Strict: 9 programs. Defer: one row kernel sweeping each row three times (mean, variance,
    // normalize + scale + shift); x - mean is recomputed in registers, never stored.
    assert_eq!((results[0].1, results[1].1), (9, 1));
}

#[test]
fn steady_state_loop_reuses_its_plan_with_new_scalars_and_buffers() {
    let mut results = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let mk = |seed| parameter(&r, 64, seed);
        let (p, g, m, v) = (mk(20), mk(21), mk(22), mk(23));
        let v = r.op(0, Op::Unary(UnaryOp::Abs), &[t(v)], None).unwrap();
        read(&r, v);
        for step in 0..6 {
            // A fresh gradient buffer each step, like a real training loop.
            let g2 = bin(&r, BinaryOp::Mul, t(g), s(1.0 + step as f64));
            adamw_step(&r, p, g2, m, v, 1e-3 / (step + 1) as f64);
            r.release(g2).unwrap();
            read(&r, p);
        }
        results.push((read(&r, p), read(&r, m), r.stats().plans_reused));
    }
    assert_eq!(
        results[0].0, results[1].0,
        "reused plans must bind this step's scalars and buffers"
    );
    assert_eq!(results[0].1, results[1].1);
    // The first step plans; each later one reuses that plan.
    assert_eq!(results[1].2, 5);
}

#[test]
fn reused_plans_give_the_same_results_as_fresh_ones() {
    // Copy-then-reduce (a lowered-and-fused mix), softmax and layernorm, each run three times on
    // one runtime: the second and third runs reuse the first run's plan.
    let run = |mode: Mode| {
        let r = rt(mode);
        let x = r
            .from_host(&f32s(&data(24 * 40, 30)), DType::F32, &[24, 40])
            .unwrap();
        let x3 = r.view(0, x, &View::Reshape(vec![6, 4, 40])).unwrap();
        let w = r
            .from_host(&f32s(&data(40, 31)), DType::F32, &[40])
            .unwrap();
        let b = r
            .from_host(&f32s(&data(40, 32)), DType::F32, &[40])
            .unwrap();
        let mut out = vec![];
        for _ in 0..3 {
            let dims = [2usize, 0].into_iter().collect();
            let s = r
                .op(
                    0,
                    Op::Reduce {
                        op: ReduceOp::Sum,
                        dims,
                        keepdim: true,
                    },
                    &[t(x3)],
                    None,
                )
                .unwrap();
            out.push(read(&r, s));
            let y = softmax(&r, x);
            out.push(read(&r, y));
            let z = layernorm(&r, x, w, b);
            out.push(read(&r, z));
            for h in [s, y, z] {
                r.release(h).unwrap();
            }
        }
        (out, r.stats().plans_reused)
    };
    let (strict, _) = run(Mode::Strict);
    let (defer, reused) = run(Mode::Defer);
    assert_eq!(strict, defer);
    assert!(reused >= 6, "the last two rounds reuse plans, got {reused}");
}

/// relu(x @ w + b), then the same through addmm, three times (the last two reuse plans).
fn linear_relu(r: &Runtime, x: Handle, w: Handle, b: Handle) -> (Handle, Handle) {
    let mm = r.op(0, Op::Matmul, &[t(x), t(w)], None).unwrap();
    let z = bin(r, BinaryOp::Add, t(mm), t(b));
    let y = r.op(0, Op::Unary(UnaryOp::Relu), &[t(z)], None).unwrap();
    let am = r
        .op(0, Op::Addmm, &[t(b), t(x), t(w), s(1.0), s(0.5)], None)
        .unwrap();
    let y2 = r
        .op(0, Op::Unary(UnaryOp::GeluTanh), &[t(am)], None)
        .unwrap();
    for h in [mm, z, am] {
        r.release(h).unwrap();
    }
    (y, y2)
}

#[test]
fn matmul_epilogue_runs_inside_the_matmul_program_and_equals_strict() {
    // 300 x 100 outputs: several blocks of rows, the last one partial.
    let (m, k, n) = (300, 37, 100);
    let mut results = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let x = r
            .from_host(&f32s(&data(m * k, 40)), DType::F32, &[m, k])
            .unwrap();
        let w = r
            .from_host(&f32s(&data(k * n, 41)), DType::F32, &[k, n])
            .unwrap();
        let b = r.from_host(&f32s(&data(n, 42)), DType::F32, &[n]).unwrap();
        let mut out = vec![];
        let mut runs = vec![];
        for _ in 0..3 {
            let before = r.stats().programs_run;
            let (y, y2) = linear_relu(&r, x, w, b);
            out.push((read(&r, y), read(&r, y2)));
            runs.push(r.stats().programs_run - before);
        }
        results.push((out, runs, r.stats().plans_reused));
    }
    assert_eq!(
        results[0].0, results[1].0,
        "defer must equal strict bit for bit"
    );
    // Strict: matmul, add, relu, then addmm's bias copy and GEMM, gelu = 6 programs.
    // Defer: GEMM+add+relu, then the bias copy and GEMM+gelu = 3 programs.
    assert_eq!(results[0].1, vec![6, 6, 6]);
    assert_eq!(results[1].1, vec![3, 3, 3]);
    assert!(results[1].2 >= 2);
}

/// `stack([x * k + 1 for k in 0..8])` of x [4, 64], written as a device's `stack` does: each
/// piece computed, copied into its slice of the result, released; then rows 0 and 7 added
/// (read back through the first and last piece's views).
fn stack_of_pieces(r: &Runtime, x: Handle) -> (Handle, Handle) {
    let out = r.empty(DType::F32, &[8, 4, 64]).unwrap();
    for k in 0..8 {
        let scaled = bin(r, BinaryOp::Mul, t(x), s(k as f64));
        let piece = bin(r, BinaryOp::Add, t(scaled), s(1.0));
        let slot = r.view(0, out, &View::Select { dim: 0, index: k }).unwrap();
        r.op(0, Op::Copy, &[t(piece)], Some(slot)).unwrap();
        for h in [scaled, piece, slot] {
            r.release(h).unwrap();
        }
    }
    let first = r.view(0, out, &View::Select { dim: 0, index: 0 }).unwrap();
    let last = r.view(0, out, &View::Select { dim: 0, index: 7 }).unwrap();
    let sum = bin(r, BinaryOp::Add, t(first), t(last));
    for h in [first, last] {
        r.release(h).unwrap();
    }
    (out, sum)
}

#[test]
fn the_pieces_of_a_stack_are_written_by_one_program_and_equal_strict() {
    let mut results = vec![];
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let x = r
            .from_host(&f32s(&data(4 * 64, 11)), DType::F32, &[4, 64])
            .unwrap();
        let before = r.stats();
        let (out, sum) = stack_of_pieces(&r, x);
        let vals = (read(&r, out), read(&r, sum));
        let st = r.stats();
        let layout_cuts =
            st.cuts[CutReason::Layout as usize] - before.cuts[CutReason::Layout as usize];
        results.push((vals, st.programs_run - before.programs_run, layout_cuts));
    }
    let x = data(4 * 64, 11);
    let want: Vec<u32> = (0..8)
        .flat_map(|k| x.iter().map(move |v| (v * k as f32 + 1.0).to_bits()))
        .collect();
    assert_eq!(results[0].0 .0, want);
    assert_eq!(
        results[1].0, results[0].0,
        "defer must equal strict bit for bit"
    );
    // The 8 pieces load one buffer (x): one loop writes every slice, and the sum of two of
    // them takes the values it just stored (the same views). Before slices of one buffer
    // could share a loop, each piece was a program of its own.
    assert_eq!((results[1].1, results[1].2), (1, 0));
}
