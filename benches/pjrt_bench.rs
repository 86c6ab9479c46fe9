//! PJRT backend numbers: cold compile vs warm start from the disk cache, and the workloads on
//! PJRT vs the CPU backend (defer mode, medians). Needs `DEFERFUSE_PJRT_PLUGIN`.
//!
//! `cargo run --release --bin deferfuse-pjrt-bench [-- --quick] [-- --mlp]` (`--mlp`: only the
//! MLP training step table).

#[path = "workloads.rs"]
#[allow(dead_code)]
mod workloads;

use deferfuse::{BackendKind, Config, Mode, Runtime};
use std::path::PathBuf;
use std::time::Instant;
use workloads::Workload;

fn runtime(backend: BackendKind) -> Runtime {
    runtime_in(backend, Mode::Defer)
}

fn runtime_in(backend: BackendKind, mode: Mode) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        backend: Some(backend),
        ..Default::default()
    })
    .unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    })
}

fn workloads(rt: &Runtime, quick: bool) -> Vec<Workload> {
    let (n, rows) = if quick {
        (1 << 16, 256)
    } else {
        (1 << 20, 1024)
    };
    vec![
        Workload::chain10(rt, n),
        Workload::gelu(rt, n),
        Workload::softmax(rt, rows, 1024),
        Workload::layernorm(rt, rows, 1024),
    ]
}

/// Milliseconds of each workload's first iteration (compile or cache load included).
fn first_runs(rt: &Runtime, quick: bool) -> Vec<(&'static str, f64)> {
    workloads(rt, quick)
        .iter()
        .map(|w| {
            let t = Instant::now();
            w.run(rt);
            (w.name, t.elapsed().as_secs_f64() * 1e3)
        })
        .collect()
}

/// The warm start, measured in a fresh process (this binary with `--warm-child`) so neither the
/// plugin nor the process-wide executable memo is already loaded: only the disk cache is warm.
fn warm_child(quick: bool) {
    let t = Instant::now();
    let rt = runtime(BackendKind::Pjrt);
    println!("create {:.3}", t.elapsed().as_secs_f64() * 1e3);
    for (name, ms) in first_runs(&rt, quick) {
        println!("run {name} {ms:.3}");
    }
    let s = rt.stats();
    println!(
        "stats {} {}",
        s.backend.shape_compiles, s.backend.disk_cache_hits
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::var_os("DEFERFUSE_PJRT_PLUGIN").is_none() {
        eprintln!(
            "set DEFERFUSE_PJRT_PLUGIN to a PJRT plugin (pip install --no-deps xla-cpu-pjrt)"
        );
        std::process::exit(2);
    }
    if std::env::args().any(|a| a == "--warm-child") {
        warm_child(quick);
        return;
    }
    if std::env::args().any(|a| a == "--mlp") {
        mlp_table(quick);
        return;
    }
    let dir: PathBuf =
        std::env::temp_dir().join(format!("deferfuse-pjrt-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("DEFERFUSE_CACHE_DIR", &dir);

    let t = Instant::now();
    let cold = runtime(BackendKind::Pjrt);
    let create_ms = t.elapsed().as_secs_f64() * 1e3;
    let cold_runs = first_runs(&cold, quick);
    let cs = cold.stats();
    let mut child = std::process::Command::new(std::env::current_exe().expect("own path"));
    child.arg("--warm-child");
    if quick {
        child.arg("--quick");
    }
    let out = child.output().expect("run the warm child");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |prefix: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
            .collect()
    };
    let warm_create = field("create ").first().cloned().unwrap_or_default();
    let warm_runs: Vec<String> = field("run ");
    let warm_stats = field("stats ").first().cloned().unwrap_or_default();
    println!("runtime creation (plugin load, client, plugin file hash): cold {create_ms:.1} ms, warm process {warm_create} ms");
    println!(
        "executables: cold compiled {} (disk hits {}); warm process compiled/disk hits: {warm_stats}",
        cs.backend.shape_compiles, cs.backend.disk_cache_hits
    );
    println!(
        "{:<10} {:>14} {:>22}",
        "workload", "cold 1st ms", "warm process 1st ms"
    );
    for ((name, c), w) in cold_runs.iter().zip(&warm_runs) {
        let w = w.split_whitespace().nth(1).unwrap_or("?");
        println!("{name:<10} {c:>14.2} {w:>22}");
    }
    let warm = cold;

    let cpu = runtime(BackendKind::Cpu);
    println!(
        "{:<10} {:>10} {:>10} {:>8}",
        "workload", "cpu ms", "pjrt ms", "pjrt/cpu"
    );
    let reps = if quick { 5 } else { 15 };
    let wc = workloads(&cpu, quick);
    let wp = workloads(&warm, quick);
    for (a, b) in wc.iter().zip(&wp) {
        let (c, p) = (a.median_ms(&cpu, reps), b.median_ms(&warm, reps));
        println!(
            "{:<10} {c:>10.3} {p:>10.3} {:>8.2}  ({})",
            a.name,
            p / c,
            a.size_label
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    mlp_table(quick);
}

/// The MLP training step (784-256-256-10, batch 64, AdamW) per backend and mode: median
/// ms per step, XLA programs (or CPU programs) per step, and compiles after the first step.
fn mlp_table(quick: bool) {
    println!("\nmlp 784-256-256-10, batch 64, AdamW: one training step (loss read, synchronize)");
    println!(
        "{:<32} {:>10} {:>14} {:>16} {:>12}",
        "backend / mode", "ms/step", "programs/step", "compiles (1st)", "compile ms"
    );
    let reps = if quick { 5 } else { 20 };
    let rows: [(&str, BackendKind, Mode, &str); 5] = [
        ("cpu defer", BackendKind::Cpu, Mode::Defer, "1"),
        ("cpu strict", BackendKind::Cpu, Mode::Strict, "1"),
        (
            "pjrt defer, whole flush",
            BackendKind::Pjrt,
            Mode::Defer,
            "1",
        ),
        (
            "pjrt defer, loop regions",
            BackendKind::Pjrt,
            Mode::Defer,
            "0",
        ),
        (
            "pjrt strict (one op per program)",
            BackendKind::Pjrt,
            Mode::Strict,
            "1",
        ),
    ];
    for (label, backend, mode, whole) in rows {
        std::env::set_var("DEFERFUSE_PJRT_WHOLE_FLUSH", whole);
        let rt = runtime_in(backend, mode);
        let w = Workload::mlp_sized(&rt, [784, 256, 256, 10], 64);
        rt.synchronize(0).expect("sync");
        let s0 = rt.stats();
        w.run(&rt);
        let s1 = rt.stats();
        let ms = w.median_ms(&rt, reps);
        let s2 = rt.stats();
        let steps = reps as u64 + 1;
        println!(
            "{label:<32} {ms:>10.3} {:>14.1} {:>16} {:>12.1}",
            (s2.programs_run - s1.programs_run) as f64 / steps as f64,
            s1.programs_compiled - s0.programs_compiled,
            (s1.compile_ns - s0.compile_ns) as f64 / 1e6,
        );
    }
    std::env::remove_var("DEFERFUSE_PJRT_WHOLE_FLUSH");
}
