//! Whole-program regions on the real XLA plugin: a deferred training step is a handful of XLA
//! programs, compiled once, with its parameters and optimizer state updated in place on the
//! device. Tests read `DEFERFUSE_PJRT_PLUGIN` and skip with a message when it is not set.

#[path = "../benches/workloads.rs"]
#[allow(dead_code)]
mod workloads;

use deferfuse::{BackendKind, Config, Handle, Mode, Runtime, Stats};
use std::path::PathBuf;
use workloads::Workload;

/// The MLP: 784-256-256-10, batch 64, AdamW.
const WIDTHS: [usize; 4] = [784, 256, 256, 10];
const BATCH: usize = 64;

fn plugin() -> Option<PathBuf> {
    match std::env::var_os("DEFERFUSE_PJRT_PLUGIN") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            eprintln!("skipped: DEFERFUSE_PJRT_PLUGIN is not set (pip install xla-cpu-pjrt)");
            None
        }
    }
}

fn runtime(backend: BackendKind, plugin: Option<PathBuf>, mode: Mode) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        backend: Some(backend),
        pjrt_plugin: plugin,
        ..Default::default()
    })
    .expect("runtime")
}

fn read_f32(rt: &Runtime, h: Handle) -> Vec<f32> {
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
