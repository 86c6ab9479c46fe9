//! PJRT backend numbers: cold compile vs warm start from the disk cache, and the workloads on
//! PJRT vs the CPU backend (defer mode, medians). Needs `DEFERFUSE_PJRT_PLUGIN`.
//!
//! `cargo run --release --bin deferfuse-pjrt-bench [-- --quick]`

#[path = "workloads.rs"]
#[allow(dead_code)]
mod workloads;

use deferfuse::{BackendKind, Config, Mode, Runtime};
use std::path::PathBuf;
use std::time::Instant;
use workloads::Workload;

fn runtime(backend: BackendKind) -> Runtime {
    Runtime::new(Config {
        mode: Some(Mode::Defer),
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
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

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::var_os("DEFERFUSE_PJRT_PLUGIN").is_none() {
        eprintln!(
            "set DEFERFUSE_PJRT_PLUGIN to a PJRT plugin (pip install --no-deps xla-cpu-pjrt)"
        );
        std::process::exit(2);
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
    drop(cold);
    let t = Instant::now();
    let warm = runtime(BackendKind::Pjrt);
    let warm_create_ms = t.elapsed().as_secs_f64() * 1e3;
    let warm_runs = first_runs(&warm, quick);
    let ws = warm.stats();
    println!("runtime creation: cold {create_ms:.1} ms (plugin load, client, plugin hash), warm {warm_create_ms:.1} ms");
    println!(
        "executables: cold compiled {} (disk hits {}), warm compiled {} (disk hits {})",
        cs.shape_compiles, cs.disk_cache_hits, ws.shape_compiles, ws.disk_cache_hits
    );
    println!(
        "{:<10} {:>14} {:>16}",
        "workload", "cold 1st ms", "warm-disk 1st ms"
    );
    for ((name, c), (_, w)) in cold_runs.iter().zip(&warm_runs) {
        println!("{name:<10} {c:>14.2} {w:>16.2}");
    }

    let cpu = runtime(BackendKind::Cpu);
    println!(
        "{:<10} {:>10} {:>10} {:>8}",
        "workload", "cpu ms", "pjrt ms", "pjrt/cpu"
    );
    let reps = if quick { 5 } else { 15 };
    let wc = workloads(&cpu, quick);
    let wp = workloads(&warm, quick);
    for (a, b) in wc.iter().zip(&wp) {
        let time = |rt: &Runtime, w: &Workload| {
            w.run(rt);
            median(
                (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        w.run(rt);
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .collect(),
            )
        };
        let (c, p) = (time(&cpu, a), time(&warm, b));
        println!(
            "{:<10} {c:>10.3} {p:>10.3} {:>8.2}  ({})",
            a.name,
            p / c,
            a.size_label
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
