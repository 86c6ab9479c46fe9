//! The PJRT backend: plugin errors, agreement with the CPU backend, shape buckets, and the disk
//! cache across processes. Tests that need a plugin read `DEFERFUSE_PJRT_PLUGIN` and skip with a
//! message when it is unset (CI sets it; see .ci/run).

use deferfuse_fusion::ir::{BinaryOp, DType, Op, ReduceOp, Scalar, UnaryOp};
use deferfuse_runtime::{BackendKind, Config, Error, Input, Mode, Runtime};
use std::path::{Path, PathBuf};
use std::process::Command;

fn plugin() -> Option<PathBuf> {
    match std::env::var_os("DEFERFUSE_PJRT_PLUGIN") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            eprintln!(
                "skipped: DEFERFUSE_PJRT_PLUGIN is not set (pip install --no-deps xla-cpu-pjrt)"
            );
            None
        }
    }
}

fn runtime(backend: BackendKind, plugin: Option<&Path>, mode: Mode) -> Result<Runtime, Error> {
    Runtime::new(Config {
        mode: Some(mode),
        backend: Some(backend),
        pjrt_plugin: plugin.map(Path::to_path_buf),
        ..Default::default()
    })
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn read_f32(rt: &Runtime, h: deferfuse_runtime::Handle, n: usize) -> Vec<f32> {
    let mut out = vec![0u8; 4 * n];
    rt.to_host(h, &mut out).expect("to_host");
    out.chunks(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_missing_plugin_file_is_a_configuration_error_naming_the_path() {
    let e = runtime(
        BackendKind::Pjrt,
        Some(Path::new("/nonexistent/plugin.so")),
        Mode::Strict,
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Config(_)), "{msg}");
    assert!(msg.contains("/nonexistent/plugin.so"), "{msg}");
    assert!(msg.contains("pip install --no-deps xla-cpu-pjrt"), "{msg}");
}

#[test]
fn a_library_that_is_not_a_plugin_is_rejected_by_name() {
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists());
    let Some(libm) = libm else {
        eprintln!("skipped: no libm.so.6 found to stand in for a non-plugin library");
        return;
    };
    let e = runtime(BackendKind::Pjrt, Some(libm), Mode::Strict).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("is not a PJRT plugin"), "{msg}");
    assert!(msg.contains("libm.so.6"), "{msg}");
}

#[test]
fn a_file_that_is_not_a_library_is_rejected_by_name() {
    let p = std::env::temp_dir().join(format!("deferfuse-not-a-lib-{}.so", std::process::id()));
    std::fs::write(&p, b"not an ELF file").unwrap();
    let e = runtime(BackendKind::Pjrt, Some(&p), Mode::Strict).unwrap_err();
    let _ = std::fs::remove_file(&p);
    let msg = e.to_string();
    assert!(
        msg.contains("cannot be loaded as a shared library"),
        "{msg}"
    );
}

/// `sum(relu(x * 2 - 1), dim=1)`, `x @ w`, and `gelu` on both backends: PJRT agrees with the
/// CPU backend within float rounding (XLA orders sums differently and has its own tanh/erf).
#[test]
fn pjrt_agrees_with_the_cpu_backend_on_elementwise_reduction_and_matmul() {
    let Some(p) = plugin() else { return };
    let x: Vec<f32> = (0..6 * 5).map(|i| (i as f32 * 0.37).sin()).collect();
    let w: Vec<f32> = (0..5 * 3).map(|i| (i as f32 * 0.11).cos()).collect();
    let run = |rt: &Runtime| {
        let xh = rt.from_host(&f32_bytes(&x), DType::F32, &[6, 5]).unwrap();
        let wh = rt.from_host(&f32_bytes(&w), DType::F32, &[5, 3]).unwrap();
        let s = |v: f64| Input::Scalar(Scalar::Float(v));
        let a = rt
            .op(
                0,
                Op::Binary(BinaryOp::Mul),
                &[Input::Tensor(xh), s(2.0)],
                None,
            )
            .unwrap();
        let b = rt
            .op(
                0,
                Op::Binary(BinaryOp::Sub),
                &[Input::Tensor(a), s(1.0)],
                None,
            )
            .unwrap();
        let c = rt
            .op(0, Op::Unary(UnaryOp::Relu), &[Input::Tensor(b)], None)
            .unwrap();
        let red = Op::Reduce {
            op: ReduceOp::Sum,
            dims: vec![1].into(),
            keepdim: false,
        };
        let r = rt.op(0, red, &[Input::Tensor(c)], None).unwrap();
        let m = rt
            .op(0, Op::Matmul, &[Input::Tensor(xh), Input::Tensor(wh)], None)
            .unwrap();
        let g = rt
            .op(0, Op::Unary(UnaryOp::GeluErf), &[Input::Tensor(m)], None)
            .unwrap();
        (read_f32(rt, r, 6), read_f32(rt, g, 18))
    };
    for mode in [Mode::Strict, Mode::Defer] {
        let cpu = run(&runtime(BackendKind::Cpu, None, mode).unwrap());
        let pj = run(&runtime(BackendKind::Pjrt, Some(&p), mode).unwrap());
        for (a, b) in cpu.0.iter().zip(&pj.0).chain(cpu.1.iter().zip(&pj.1)) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                "{mode:?}: cpu {a} vs pjrt {b}"
            );
        }
    }
}

/// Batch sizes 1..=100 fall in 8 power-of-two buckets, so each region compiles at most 8
/// executables, and the padded rows never leak into the (masked) row sums.
#[test]
fn a_hundred_batch_sizes_compile_at_most_eight_executables_per_region() {
    let Some(p) = plugin() else { return };
    let rt = runtime(BackendKind::Pjrt, Some(&p), Mode::Strict).unwrap();
    for b in 1..=100usize {
        let x: Vec<f32> = (0..b * 3).map(|i| i as f32).collect();
        let h = rt.from_host(&f32_bytes(&x), DType::F32, &[b, 3]).unwrap();
        let t = rt
            .op(
                0,
                Op::Binary(BinaryOp::Add),
                &[Input::Tensor(h), Input::Scalar(Scalar::Float(1.0))],
                None,
            )
            .unwrap();
        let red = Op::Reduce {
            op: ReduceOp::Sum,
            dims: vec![0].into(),
            keepdim: false,
        };
        let s = rt.op(0, red, &[Input::Tensor(t)], None).unwrap();
        let got = read_f32(&rt, s, 3);
        let want: Vec<f32> = (0..3)
            .map(|c| (0..b).map(|r| (r * 3 + c) as f32 + 1.0).sum())
            .collect();
        assert_eq!(got, want, "batch {b}");
        rt.release(h).unwrap();
        rt.release(t).unwrap();
        rt.release(s).unwrap();
    }
    let st = rt.stats();
    assert!(st.programs_compiled >= 1);
    assert!(
        st.shape_compiles <= 8 * st.programs_compiled,
        "{} executables for {} regions",
        st.shape_compiles,
        st.programs_compiled
    );
}

/// Runs one small program in this process (a child of the cache tests) and prints its stats.
#[test]
#[ignore = "run by the disk cache tests as a child process"]
fn child_runs_a_program_and_prints_stats() {
    let p = PathBuf::from(std::env::var_os("DEFERFUSE_PJRT_PLUGIN").expect("plugin"));
    let rt = runtime(BackendKind::Pjrt, Some(&p), Mode::Defer).unwrap();
    let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.5).collect();
    let h = rt.from_host(&f32_bytes(&x), DType::F32, &[8, 8]).unwrap();
    let t = rt
        .op(0, Op::Unary(UnaryOp::Exp), &[Input::Tensor(h)], None)
        .unwrap();
    let red = Op::Reduce {
        op: ReduceOp::Amax,
        dims: vec![1].into(),
        keepdim: false,
    };
    let m = rt.op(0, red, &[Input::Tensor(t)], None).unwrap();
    let got = read_f32(&rt, m, 8);
    for (r, g) in got.iter().enumerate() {
        let want = (x[r * 8 + 7]).exp();
        assert!((g - want).abs() <= 1e-5 * want, "row {r}: {g} vs {want}");
    }
    let s = rt.stats();
    println!(
        "CHILD-STATS compiles={} hits={} corrupt={}",
        s.shape_compiles, s.disk_cache_hits, s.disk_cache_corrupt
    );
}

/// One child run sharing the cache directory `dir` (read its stats with `stats_of`).
fn child(dir: &Path, plugin: &Path) -> std::process::Child {
    child_with(dir, plugin, &[])
}

fn child_with(dir: &Path, plugin: &Path, env: &[(&str, &Path)]) -> std::process::Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    for (k, v) in env {
        c.env(k, v);
    }
    c.args([
        "--exact",
        "child_runs_a_program_and_prints_stats",
        "--ignored",
        "--nocapture",
    ])
    .env("DEFERFUSE_CACHE_DIR", dir)
    .env("DEFERFUSE_PJRT_PLUGIN", plugin)
    .env_remove("DEFERFUSE_BACKEND")
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("spawn the test binary")
}

fn stats_of(c: std::process::Child) -> (u64, u64, u64) {
    let out = c.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("CHILD-STATS"))
        .expect("stats line");
    let num = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .expect("a counter")
    };
    (num("compiles="), num("hits="), num("corrupt="))
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("deferfuse-pjrt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_second_process_loads_executables_from_the_disk_cache() {
    let Some(p) = plugin() else { return };
    let dir = fresh_dir("cross-process");
    let (c1, h1, _) = stats_of(child(&dir, &p));
    assert!(
        c1 > 0 && h1 == 0,
        "first process compiles: {c1} compiles, {h1} hits"
    );
    let (c2, h2, _) = stats_of(child(&dir, &p));
    assert_eq!((c2, h2), (0, c1), "second process compiles nothing");
}

#[test]
fn a_corrupt_entry_is_removed_and_recompiled() {
    let Some(p) = plugin() else { return };
    let dir = fresh_dir("corrupt");
    let (c1, _, _) = stats_of(child(&dir, &p));
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let bytes = std::fs::read(e.path()).unwrap();
        std::fs::write(e.path(), &bytes[..bytes.len() / 2]).unwrap();
    }
    let (c2, h2, bad) = stats_of(child(&dir, &p));
    assert_eq!(
        (c2, h2, bad),
        (c1, 0, c1),
        "every truncated entry is detected and recompiled"
    );
    let (c3, h3, _) = stats_of(child(&dir, &p));
    assert_eq!(
        (c3, h3),
        (0, c1),
        "the recompiled entries were written back whole"
    );
}

#[test]
fn concurrent_processes_share_one_cache_directory() {
    let Some(p) = plugin() else { return };
    let dir = fresh_dir("concurrent");
    let kids: Vec<_> = (0..4).map(|_| child(&dir, &p)).collect();
    for k in kids {
        let (_, _, bad) = stats_of(k);
        assert_eq!(bad, 0, "no process sees a partial entry");
    }
    let (c, h, _) = stats_of(child(&dir, &p));
    assert_eq!(
        c, 0,
        "after the race every executable is on disk ({h} hits)"
    );
}

#[test]
fn the_dump_dir_receives_each_compiled_module_as_stablehlo_text() {
    let Some(p) = plugin() else { return };
    let dump = fresh_dir("dump");
    stats_of(child_with(
        &fresh_dir("dump-cache"),
        &p,
        &[("DEFERFUSE_DUMP_DIR", &dump)],
    ));
    let modules: Vec<String> = std::fs::read_dir(&dump)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "mlir"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(!modules.is_empty(), "no .mlir file in {}", dump.display());
    assert!(modules.iter().all(|m| m.contains("func.func @main(")));
    assert!(modules.iter().any(|m| m.contains("stablehlo.reduce")));
}

/// A matmul over k = 0 writes zeros (an empty sum), in every mode, even into fresh memory.
#[test]
fn a_matmul_with_an_empty_inner_dim_writes_zeros() {
    let Some(p) = plugin() else { return };
    for mode in [Mode::Strict, Mode::Debug, Mode::Defer] {
        let rt = runtime(BackendKind::Pjrt, Some(&p), mode).unwrap();
        let a = rt.from_host(&[], DType::F32, &[3, 0]).unwrap();
        let b = rt.from_host(&[], DType::F32, &[0, 4]).unwrap();
        let m = rt
            .op(0, Op::Matmul, &[Input::Tensor(a), Input::Tensor(b)], None)
            .unwrap();
        assert_eq!(read_f32(&rt, m, 12), vec![0.0; 12], "{mode:?}");
    }
}
