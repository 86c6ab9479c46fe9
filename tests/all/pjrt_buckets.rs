//! Shape buckets for whole-flush modules on the real XLA plugin: a graph whose batch size
//! changes compiles at most one module per bucket of batch sizes, masks the padding out of
//! everything that reduces over the batch, and falls back to exact-size modules (saying why
//! in the log) where the batch is not the outermost dim of a buffer. Tests read
//! `DEFERFUSE_PJRT_PLUGIN` and skip with a message when it is not set.

use crate::harness::{gather, plugin};
use crate::pjrt_whole_program::workloads::Workload;
use crate::pjrt_whole_program::{block_step, read_f32, runtime, Block};
use deferfuse::{BackendKind, DType, Handle, Input, Mode, Op, ReduceOp, Runtime, UnaryOp, View};
use std::sync::{Mutex, OnceLock};

fn f32s(rt: &Runtime, v: &[f32], sizes: &[usize]) -> Handle {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    rt.from_host(&b, DType::F32, sizes).expect("from_host")
}

fn compiled(rt: &Runtime) -> u64 {
    rt.stats().programs_compiled
}

fn t(h: Handle) -> Input {
    Input::Tensor(h)
}

fn reduce(op: ReduceOp, dim: usize) -> Op {
    Op::Reduce {
        op,
        dims: [dim].into_iter().collect(),
        keepdim: false,
    }
}

fn assert_close(what: &str, want: &[f32], got: &[f32], tol: f32) {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert!(
            (w - g).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: want {w}, got {g}"
        );
    }
}

/// The runtime's log lines, from a process-wide subscriber installed on first use (`None`
/// when `DEFERFUSE_LOG` already installed its own, which prints to stderr instead).
fn log() -> Option<&'static Mutex<Vec<u8>>> {
    static LOG: OnceLock<Option<&'static Mutex<Vec<u8>>>> = OnceLock::new();
    *LOG.get_or_init(|| {
        let buf: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        struct W(&'static Mutex<Vec<u8>>);
        impl std::io::Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sub = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("deferfuse_runtime=info"))
            .with_writer(move || W(buf))
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(sub)
            .ok()
            .map(|_| buf)
    })
}

/// The step of an MLP workload at its batch: records it, reads the loss, waits.
fn step(rt: &Runtime, w: &Workload) -> f32 {
    let loss = w.record(rt);
    let v = read_f32(rt, loss)[0];
    rt.synchronize(0).expect("sync");
    rt.release(loss).expect("release");
    v
}

#[test]
fn an_mlp_step_whose_batch_changes_compiles_one_module_per_bucket_and_matches_the_cpu_backend() {
    let Some(p) = plugin() else { return };
    // A hidden width equal to the first batch: only the sizes that change are the batch.
    let widths = [64, 48, 64, 10];
    let (cpu, pj) = (
        runtime(BackendKind::Cpu, None, Mode::Defer),
        runtime(BackendKind::Pjrt, Some(p), Mode::Defer),
    );
    let mut workloads = Vec::new();
    for n in [64, 50, 33] {
        let (wc, wp) = (
            Workload::mlp_sized(&cpu, widths, n),
            Workload::mlp_sized(&pj, widths, n),
        );
        cpu.synchronize(0).expect("sync");
        pj.synchronize(0).expect("sync");
        workloads.push((n, wc, wp));
    }
    let (mut compiles, mut programs_per_step) = (Vec::new(), Vec::new());
    for (k, n) in [64, 50, 33, 64].into_iter().enumerate() {
        let (_, wc, wp) = workloads.iter().find(|w| w.0 == n).expect("workload");
        let (before, runs) = (compiled(&pj), pj.stats().programs_run);
        let (lc, lp) = (step(&cpu, wc), step(&pj, wp));
        compiles.push(compiled(&pj) - before);
        let programs = pj.stats().programs_run - runs;
        assert!(
            (lc - lp).abs() <= 1e-4 * (1.0 + lc.abs()),
            "step {k} (batch {n}): cpu loss {lc}, pjrt loss {lp}"
        );
        assert!(programs <= 3, "step {k}: {programs} XLA programs");
        programs_per_step.push(programs);
    }
    // 64 compiles its exact modules (the loss's program and the rest: the step reads its loss
    // on the host); 50 finds the batch and compiles bucket 64's, one per program; 33 is in
    // that bucket, and 64 has its modules already.
    assert!(
        compiles[1] <= programs_per_step[1],
        "batch 50 compiled {compiles:?}, programs per step {programs_per_step:?}"
    );
    assert_eq!(compiles[2..], [0, 0], "compiles per step: {compiles:?}");
    for (n, wc, wp) in &workloads {
        for k in 2..8 {
            let (c, p) = (
                read_f32(&cpu, wc.inputs()[k]),
                read_f32(&pj, wp.inputs()[k]),
            );
            assert_close(&format!("batch {n}, parameter {k}"), &c, &p, 1e-4);
        }
    }
}

/// Per batch row `r` and column `c`: a negative value, so a padded zero row would win a max.
fn batch_values(n: usize) -> Vec<f32> {
    (0..n * 3)
        .map(|i| -1.0 - (i % 7) as f32 * 0.25 - (i / 3) as f32 * 0.01)
        .collect()
}

/// mean, sum and amax over the batch of exp(x) and of x, read back: (mean, sum, amax).
fn batch_reductions(rt: &Runtime, n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let x = f32s(rt, &batch_values(n), &[n, 3]);
    let e = rt
        .op(0, Op::Unary(UnaryOp::Exp), &[t(x)], None)
        .expect("exp");
    let mean = rt
        .op(0, reduce(ReduceOp::Mean, 0), &[t(e)], None)
        .expect("mean");
    let sum = rt
        .op(0, reduce(ReduceOp::Sum, 0), &[t(e)], None)
        .expect("sum");
    let max = rt
        .op(0, reduce(ReduceOp::Amax, 0), &[t(x)], None)
        .expect("amax");
    let out = (read_f32(rt, mean), read_f32(rt, sum), read_f32(rt, max));
    for h in [x, e, mean, sum, max] {
        rt.release(h).expect("release");
    }
    out
}

#[test]
fn reductions_over_the_batch_leave_the_padded_rows_out() {
    let Some(p) = plugin() else { return };
    let (cpu, pj) = (
        runtime(BackendKind::Cpu, None, Mode::Defer),
        runtime(BackendKind::Pjrt, Some(p), Mode::Defer),
    );
    let mut compiles = Vec::new();
    for n in [8, 5, 6, 7] {
        let before = compiled(&pj);
        let (want, got) = (batch_reductions(&cpu, n), batch_reductions(&pj, n));
        compiles.push(compiled(&pj) - before);
        assert_close(&format!("mean of {n} rows"), &want.0, &got.0, 1e-5);
        assert_close(&format!("sum of {n} rows"), &want.1, &got.1, 1e-5);
        assert_close(&format!("amax of {n} rows"), &want.2, &got.2, 0.0);
    }
    // 5 compiles bucket 8's module; 6 and 7 are in it.
    assert_eq!(compiles[2..], [0, 0], "compiles per batch: {compiles:?}");
}

/// Gathers along the batch dim of a [n, 4] source, at row `bad` for the last index.
fn gather_rows(rt: &Runtime, n: usize, bad: i64) -> Result<Vec<f32>, String> {
    let src: Vec<f32> = (0..n * 4).map(|i| i as f32).collect();
    let src = f32s(rt, &src, &[n, 4]);
    let mut rows: Vec<i64> = (0..n as i64).rev().collect();
    rows[n - 1] = bad;
    let b: Vec<u8> = rows.iter().flat_map(|x| x.to_le_bytes()).collect();
    let idx = rt.from_host(&b, DType::I64, &[n, 1]).expect("index");
    let idx = rt
        .view(0, idx, &View::Expand(vec![n as i64, 4]))
        .expect("expanded index");
    let s = rt
        .op(0, Op::Unary(UnaryOp::Neg), &[t(src)], None)
        .expect("neg");
    let g = rt.op(0, gather(0), &[t(s), t(idx)], None).expect("gather");
    let total = rt
        .op(0, reduce(ReduceOp::Sum, 1), &[t(g)], None)
        .expect("sum");
    let mut out = vec![0u8; n * 4];
    rt.to_host(total, &mut out).map_err(|e| e.to_string())?;
    Ok(out
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[test]
fn a_gather_over_the_batch_checks_indices_against_the_valid_rows() {
    let Some(p) = plugin() else { return };
    let (cpu, pj) = (
        runtime(BackendKind::Cpu, None, Mode::Defer),
        runtime(BackendKind::Pjrt, Some(p), Mode::Defer),
    );
    for n in [8, 5, 6] {
        let want = gather_rows(&cpu, n, 0).expect("cpu gather");
        assert_close(
            &format!("gather of {n} rows"),
            &want,
            &gather_rows(&pj, n, 0).unwrap(),
            0.0,
        );
    }
    let before = compiled(&pj);
    // Row 6 exists in bucket 8's padded source, but not in a batch of 6.
    let e = gather_rows(&pj, 6, 6).expect_err("an index past the valid rows");
    let cpu_e = gather_rows(&cpu, 6, 6).expect_err("cpu: an index past the valid rows");
    assert_eq!(e, cpu_e);
    assert!(e.contains("size 6"), "{e}");
    assert_eq!(compiled(&pj), before, "the bucket's module served it");
}

/// x (n x 3) transposed into a fresh [3, n] buffer, then summed over the batch: the [3, n]
/// buffer's row stride is the batch.
fn transposed_sum(rt: &Runtime, n: usize) -> Vec<f32> {
    let x = f32s(rt, &batch_values(n), &[n, 3]);
    let xt = rt.view(0, x, &View::Transpose(0, 1)).expect("transpose");
    let y = rt
        .op(0, Op::Unary(UnaryOp::Neg), &[t(xt)], None)
        .expect("neg");
    let s = rt
        .op(0, reduce(ReduceOp::Sum, 1), &[t(y)], None)
        .expect("sum");
    read_f32(rt, s)
}

#[test]
fn a_graph_whose_batch_is_not_outermost_compiles_per_size_and_says_why() {
    let Some(p) = plugin() else { return };
    let log = log();
    let (cpu, pj) = (
        runtime(BackendKind::Cpu, None, Mode::Defer),
        runtime(BackendKind::Pjrt, Some(p), Mode::Defer),
    );
    for n in [4, 3] {
        let before = compiled(&pj);
        let want = transposed_sum(&cpu, n);
        assert_close(
            &format!("sum of {n} rows"),
            &want,
            &transposed_sum(&pj, n),
            1e-6,
        );
        assert!(
            compiled(&pj) > before,
            "batch {n} compiled its exact module"
        );
    }
    let Some(log) = log else {
        eprintln!("log not checked: DEFERFUSE_LOG installed the process's subscriber");
        return;
    };
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(
        text.contains("compiled for exact sizes: no batch dim found")
            && text.contains("stride changed with the batch"),
        "log:\n{text}"
    );
}

/// exp(x) over x (n x 3), then its row sums: the exp runs over the flat [3 n] elements and the
/// sum over [n, 3] rows, so the exp's result is restaged on the device between the two.
fn restaged_row_sums(rt: &Runtime, n: usize) -> Vec<f32> {
    let x = f32s(rt, &batch_values(n), &[n, 3]);
    let e = rt
        .op(0, Op::Unary(UnaryOp::Exp), &[t(x)], None)
        .expect("exp");
    let s = rt
        .op(0, reduce(ReduceOp::Sum, 1), &[t(e)], None)
        .expect("sum");
    read_f32(rt, s)
}

#[test]
fn a_value_restaged_between_programs_keeps_its_rows_at_every_batch_size() {
    let Some(p) = plugin() else { return };
    let cpu = runtime(BackendKind::Cpu, None, Mode::Defer);
    let pj = runtime(BackendKind::Pjrt, Some(p), Mode::Strict);
    for n in [8, 5, 7, 3, 11] {
        let want = restaged_row_sums(&cpu, n);
        assert_close(
            &format!("{n} rows"),
            &want,
            &restaged_row_sums(&pj, n),
            1e-6,
        );
    }
    assert!(
        pj.stats().backend.device_resident_hits > 0,
        "the sums read the exp's device copy"
    );
}

#[test]
fn a_transformer_block_whose_batch_changes_compiles_one_module_per_bucket() {
    let Some(p) = plugin() else { return };
    let (cpu, pj) = (
        runtime(BackendKind::Cpu, None, Mode::Defer),
        runtime(BackendKind::Pjrt, Some(p), Mode::Defer),
    );
    let mut compiles = Vec::new();
    for n in [8, 5, 6, 7] {
        let (bc, bp) = (Block::sized(&cpu, n), Block::sized(&pj, n));
        let before = compiled(&pj);
        let (lc, lp) = (block_step(&cpu, &bc), block_step(&pj, &bp));
        compiles.push(compiled(&pj) - before);
        assert!(
            (lc - lp).abs() <= 1e-4 * (1.0 + lc.abs()),
            "batch {n}: cpu loss {lc}, pjrt loss {lp}"
        );
        for (k, (&c, &p)) in bc.weights.iter().zip(&bp.weights).enumerate() {
            let (c, p) = (read_f32(&cpu, c), read_f32(&pj, p));
            assert_close(&format!("batch {n}, weight {k}"), &c, &p, 1e-5);
        }
    }
    // Attention's permuted views and batched matmuls over the padded batch: 5 compiles bucket
    // 8's module, 6 and 7 run it.
    assert_eq!(compiles[2..], [0, 0], "compiles per batch: {compiles:?}");
}
