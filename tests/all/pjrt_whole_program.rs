//! Whole-program regions on the real XLA plugin: a deferred training step is a handful of XLA
//! programs, compiled once, with its parameters and optimizer state updated in place on the
//! device. Tests read `DEFERFUSE_PJRT_PLUGIN` and skip with a message when it is not set.

/// The bench workloads; `pjrt_buckets` runs the MLP's step too.
#[path = "../../benches/workloads.rs"]
#[allow(dead_code)]
pub(crate) mod workloads;

use crate::harness::plugin;
use deferfuse::{
    BackendKind, BinaryOp, Config, DType, Handle, Input, Mode, Op, ReduceOp, Runtime, Scalar,
    Stats, UnaryOp, View,
};
use std::path::PathBuf;
use workloads::Workload;

/// The MLP: 784-256-256-10, batch 64, AdamW.
const WIDTHS: [usize; 4] = [784, 256, 256, 10];
const BATCH: usize = 64;

/// A runtime on `backend` (the PJRT suites share it).
pub(crate) fn runtime(backend: BackendKind, plugin: Option<PathBuf>, mode: Mode) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        backend: Some(backend),
        pjrt_plugin: plugin,
        ..Default::default()
    })
    .expect("runtime")
}

/// The f32 values of `h`, read back to the host.
pub(crate) fn read_f32(rt: &Runtime, h: Handle) -> Vec<f32> {
    let n: usize = rt.sizes(h).expect("sizes").iter().product();
    let mut b = vec![0u8; n * 4];
    rt.to_host(h, &mut b).expect("to_host");
    b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// One training step: records it, reads the loss (the step's sync point), waits for the
/// optimizer's updates. Returns the loss.
fn step(rt: &Runtime, w: &Workload) -> f32 {
    let loss = w.record(rt);
    let v = read_f32(rt, loss)[0];
    rt.synchronize(0).expect("sync");
    rt.release(loss).expect("release");
    v
}

/// The MLP workload, its setup (the optimizer state made non-negative) already run, so every
/// step flushes the same trace.
fn mlp(rt: &Runtime, widths: [usize; 4], batch: usize) -> Workload {
    let w = Workload::mlp_sized(rt, widths, batch);
    rt.synchronize(0).expect("sync");
    w
}

fn delta(a: &Stats, b: &Stats) -> (u64, u64) {
    (
        b.programs_run - a.programs_run,
        b.programs_compiled - a.programs_compiled,
    )
}

fn assert_close(what: &str, cpu: &[f32], pjrt: &[f32], tol: f32) {
    assert_eq!(cpu.len(), pjrt.len(), "{what}: lengths");
    for (i, (c, p)) in cpu.iter().zip(pjrt).enumerate() {
        assert!(
            (c - p).abs() <= tol * (1.0 + c.abs()),
            "{what}[{i}]: cpu {c}, pjrt {p}"
        );
    }
}

#[test]
fn an_mlp_training_step_is_at_most_three_xla_programs_and_matches_the_cpu_backend() {
    let Some(p) = plugin() else { return };
    let cpu = runtime(BackendKind::Cpu, None, Mode::Defer);
    let pj = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let wc = mlp(&cpu, WIDTHS, BATCH);
    let wp = mlp(&pj, WIDTHS, BATCH);
    for k in 0..4 {
        let before = pj.stats();
        let (lc, lp) = (step(&cpu, &wc), step(&pj, &wp));
        let (programs, _) = delta(&before, &pj.stats());
        assert!(
            (lc - lp).abs() <= 1e-4 * (1.0 + lc.abs()),
            "step {k}: cpu loss {lc}, pjrt loss {lp}"
        );
        assert!(programs <= 3, "step {k}: {programs} XLA programs");
    }
    // The parameters after four AdamW steps agree too.
    for k in 2..8 {
        let (c, p) = (
            read_f32(&cpu, wc.inputs()[k]),
            read_f32(&pj, wp.inputs()[k]),
        );
        assert_close(&format!("parameter {k}"), &c, &p, 1e-4);
    }
}

#[test]
fn a_training_loop_compiles_its_step_once() {
    let Some(p) = plugin() else { return };
    let pj = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let w = mlp(&pj, WIDTHS, BATCH);
    step(&pj, &w);
    let warm = pj.stats();
    for _ in 0..3 {
        step(&pj, &w);
    }
    let (_, compiled) = delta(&warm, &pj.stats());
    assert_eq!(compiled, 0, "a repeated step compiles nothing");
    assert!(pj.stats().plans_reused >= 3);
}

#[test]
fn parameters_and_optimizer_state_stay_on_the_device_and_are_updated_in_place() {
    let Some(p) = plugin() else { return };
    let pj = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let w = mlp(&pj, WIDTHS, BATCH);
    step(&pj, &w);
    step(&pj, &w);
    let a = pj.stats();
    step(&pj, &w);
    step(&pj, &w);
    let b = pj.stats();
    // Nothing is uploaded again: weights, optimizer state and inputs are device copies.
    assert_eq!(b.backend.device_uploads, a.backend.device_uploads);
    // Only the loss comes back.
    assert_eq!(b.backend.device_downloads - a.backend.device_downloads, 2);
    // Donated updates: the device holds the same bytes after two more steps.
    assert_eq!(
        b.backend.device_resident_bytes,
        a.backend.device_resident_bytes
    );
}

#[test]
fn compile_counters_count_the_real_xla_compiles() {
    let Some(p) = plugin() else { return };
    let pj = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let before = pj.stats();
    // Widths no other test uses, so this process has not compiled the step yet.
    let w = mlp(&pj, [100, 48, 40, 7], 12);
    step(&pj, &w);
    let s = pj.stats();
    let compiled = s.programs_compiled - before.programs_compiled;
    assert!(compiled >= 1, "the step's module was compiled");
    assert_eq!(s.programs_compiled, s.backend.shape_compiles);
    // An XLA compile of a training step takes milliseconds, not the microseconds of wrapping
    // a region.
    let ns = s.compile_ns - before.compile_ns;
    assert!(ns >= compiled * 1_000_000, "{compiled} compiles in {ns} ns");
}

#[test]
fn each_batch_size_compiles_one_module_and_a_repeated_size_none() {
    let Some(p) = plugin() else { return };
    let pj = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let small = mlp(&pj, [60, 32, 32, 5], 8);
    let large = mlp(&pj, [60, 32, 32, 5], 24);
    let s0 = pj.stats();
    step(&pj, &small);
    step(&pj, &large);
    let s1 = pj.stats();
    step(&pj, &small);
    step(&pj, &large);
    let s2 = pj.stats();
    assert!(s1.programs_compiled - s0.programs_compiled >= 2);
    assert_eq!(s2.programs_compiled, s1.programs_compiled);
}

/// A transformer-like block: layer norm, multi-head attention (batched matmuls over permuted
/// views, softmax), a GELU MLP, residuals, a mean-square loss; then every weight decays in
/// place, as an optimizer step would. Sizes: batch 2 (or `batch`), sequence 16, width 32, 4
/// heads, MLP 64.
pub(crate) struct Block {
    batch: usize,
    x: Handle,
    /// ln weight, wq, wk, wv, wo, w1, w2.
    pub(crate) weights: Vec<Handle>,
}

const B: usize = 2;
const T: usize = 16;
const C: usize = 32;
const H: usize = 4;
const FF: usize = 64;

impl Block {
    fn new(rt: &Runtime) -> Block {
        Block::sized(rt, B)
    }

    /// The block at batch `batch`.
    pub(crate) fn sized(rt: &Runtime, batch: usize) -> Block {
        let input = |sizes: &[usize], seed: u64, scale: f32| {
            let n: usize = sizes.iter().product();
            let bytes: Vec<u8> = workloads::data(n, seed)
                .chunks(4)
                .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * scale).to_le_bytes())
                .collect();
            rt.from_host(&bytes, DType::F32, sizes).expect("input")
        };
        let s = 1.0 / (C as f32).sqrt();
        Block {
            batch,
            x: input(&[batch * T, C], 1, 1.0),
            weights: vec![
                input(&[C], 2, 0.5),
                input(&[C, C], 3, s),
                input(&[C, C], 4, s),
                input(&[C, C], 5, s),
                input(&[C, C], 6, s),
                input(&[FF, C], 7, s),
                input(&[C, FF], 8, 1.0 / (FF as f32).sqrt()),
            ],
        }
    }

    /// Records one step; returns the loss.
    fn record(&self, rt: &Runtime) -> Handle {
        let mut live: Vec<Handle> = Vec::new();
        let mut op = |o: Op, ins: &[Input]| {
            let h = rt.op(0, o, ins, None).expect("op");
            live.push(h);
            h
        };
        let t = Input::Tensor;
        let f = |v: f64| Input::Scalar(Scalar::Float(v));
        let bin = Op::Binary;
        let red = |r, dims: &[usize], keepdim| Op::Reduce {
            op: r,
            dims: dims.iter().copied().collect(),
            keepdim,
        };
        let mut views: Vec<Handle> = Vec::new();
        let mut view = |h: Handle, v: View| {
            let r = rt.view(0, h, &v).expect("view");
            views.push(r);
            r
        };
        let w = &self.weights;
        let x = self.x;
        let mu = op(red(ReduceOp::Mean, &[1], true), &[t(x)]);
        let d = op(bin(BinaryOp::Sub), &[t(x), t(mu)]);
        let d2 = op(bin(BinaryOp::Mul), &[t(d), t(d)]);
        let var = op(red(ReduceOp::Mean, &[1], true), &[t(d2)]);
        let var = op(bin(BinaryOp::Add), &[t(var), f(1e-5)]);
        let r = op(Op::Unary(UnaryOp::Rsqrt), &[t(var)]);
        let h = op(bin(BinaryOp::Mul), &[t(d), t(r)]);
        let h = op(bin(BinaryOp::Mul), &[t(h), t(w[0])]);
        let mut proj = |a: Handle, wt: Handle| {
            let wt = view(wt, View::Transpose(0, 1));
            (wt, op(Op::Matmul, &[t(a), t(wt)]))
        };
        let (_, q) = proj(h, w[1]);
        let (_, k) = proj(h, w[2]);
        let (_, v) = proj(h, w[3]);
        let heads = |h: Handle, perm: Vec<i64>, view: &mut dyn FnMut(Handle, View) -> Handle| {
            let r = view(
                h,
                View::Reshape(vec![self.batch as i64, T as i64, H as i64, -1]),
            );
            view(r, View::Permute(perm))
        };
        let q4 = heads(q, vec![0, 2, 1, 3], &mut view);
        let kt = heads(k, vec![0, 2, 3, 1], &mut view);
        let v4 = heads(v, vec![0, 2, 1, 3], &mut view);
        let s = op(Op::Matmul, &[t(q4), t(kt)]);
        let s = op(
            bin(BinaryOp::Mul),
            &[t(s), f(1.0 / ((C / H) as f64).sqrt())],
        );
        let m = op(red(ReduceOp::Amax, &[3], true), &[t(s)]);
        let e = op(bin(BinaryOp::Sub), &[t(s), t(m)]);
        let e = op(Op::Unary(UnaryOp::Exp), &[t(e)]);
        let z = op(red(ReduceOp::Sum, &[3], true), &[t(e)]);
        let a = op(bin(BinaryOp::Div), &[t(e), t(z)]);
        let o = op(Op::Matmul, &[t(a), t(v4)]);
        let o = view(o, View::Permute(vec![0, 2, 1, 3]));
        let o = op(Op::Copy, &[t(o)]);
        let o = view(o, View::Reshape(vec![(self.batch * T) as i64, C as i64]));
        let wo = view(w[4], View::Transpose(0, 1));
        let o = op(Op::Matmul, &[t(o), t(wo)]);
        let y = op(bin(BinaryOp::Add), &[t(x), t(o)]);
        let w1 = view(w[5], View::Transpose(0, 1));
        let g = op(Op::Matmul, &[t(y), t(w1)]);
        let g = op(Op::Unary(UnaryOp::GeluTanh), &[t(g)]);
        let w2 = view(w[6], View::Transpose(0, 1));
        let g = op(Op::Matmul, &[t(g), t(w2)]);
        let out = op(bin(BinaryOp::Add), &[t(y), t(g)]);
        let sq = op(bin(BinaryOp::Mul), &[t(out), t(out)]);
        let loss = op(red(ReduceOp::Mean, &[], false), &[t(sq)]);
        for &p in w {
            // Weight decay in place: the step's parameters are inputs and outputs.
            rt.op(0, bin(BinaryOp::Mul), &[t(p), f(0.99)], Some(p))
                .expect("decay");
        }
        for h in live.into_iter().chain(views).filter(|&h| h != loss) {
            rt.release(h).expect("release");
        }
        loss
    }
}

#[test]
fn a_transformer_block_step_is_two_xla_programs_split_at_its_loss_and_matches_the_cpu_backend() {
    let Some(p) = plugin() else { return };
    let cpu = runtime(BackendKind::Cpu, None, Mode::Defer);
    let pj = runtime(BackendKind::Pjrt, Some(p), Mode::Defer);
    let (bc, bp) = (Block::new(&cpu), Block::new(&pj));
    for k in 0..3 {
        let before = pj.stats();
        let (lc, lp) = (block_step(&cpu, &bc), block_step(&pj, &bp));
        let (programs, _) = delta(&before, &pj.stats());
        assert!(
            (lc - lp).abs() <= 1e-4 * (1.0 + lc.abs()),
            "step {k}: cpu loss {lc}, pjrt loss {lp}"
        );
        // The forward up to the loss the host reads, then the weight decay after it, which
        // runs while the host goes on (see `host_reads.rs`).
        assert_eq!(
            programs, 2,
            "step {k}: the block is its loss's program and the rest"
        );
    }
    for (k, (&c, &p)) in bc.weights.iter().zip(&bp.weights).enumerate() {
        assert_close(
            &format!("weight {k}"),
            &read_f32(&cpu, c),
            &read_f32(&pj, p),
            1e-5,
        );
    }
}

/// One block step on either backend: the loss read is the sync point.
pub(crate) fn block_step(rt: &Runtime, b: &Block) -> f32 {
    let loss = b.record(rt);
    let v = read_f32(rt, loss)[0];
    rt.synchronize(0).expect("sync");
    rt.release(loss).expect("release");
    v
}
