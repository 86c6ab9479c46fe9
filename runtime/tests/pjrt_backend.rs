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
    // Each region misses the program cache once; its executables are the shape compiles.
    let regions = st.cache_misses;
    assert!(regions >= 1);
    assert!(
        st.backend.shape_compiles <= 8 * regions,
        "{} executables for {} regions",
        st.backend.shape_compiles,
        regions
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
        s.backend.shape_compiles, s.backend.disk_cache_hits, s.backend.disk_cache_corrupt
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

/// A fresh directory, removed with its entries when the test ends.
fn fresh_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("deferfuse-pjrt-{name}-"))
        .tempdir()
        .unwrap()
}

#[test]
fn a_second_process_loads_executables_from_the_disk_cache() {
    let Some(p) = plugin() else { return };
    let dir = fresh_dir("cross-process");
    let (c1, h1, _) = stats_of(child(dir.path(), &p));
    assert!(
        c1 > 0 && h1 == 0,
        "first process compiles: {c1} compiles, {h1} hits"
    );
    let (c2, h2, _) = stats_of(child(dir.path(), &p));
    assert_eq!((c2, h2), (0, c1), "second process compiles nothing");
}

#[test]
fn a_corrupt_entry_is_removed_and_recompiled() {
    let Some(p) = plugin() else { return };
    let dir = fresh_dir("corrupt");
    let (c1, _, _) = stats_of(child(dir.path(), &p));
    for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
        let bytes = std::fs::read(e.path()).unwrap();
        std::fs::write(e.path(), &bytes[..bytes.len() / 2]).unwrap();
    }
    let (c2, h2, bad) = stats_of(child(dir.path(), &p));
    assert_eq!(
        (c2, h2, bad),
        (c1, 0, c1),
        "every truncated entry is detected and recompiled"
    );
    let (c3, h3, _) = stats_of(child(dir.path(), &p));
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
    let kids: Vec<_> = (0..4).map(|_| child(dir.path(), &p)).collect();
    for k in kids {
        let (_, _, bad) = stats_of(k);
        assert_eq!(bad, 0, "no process sees a partial entry");
    }
    let (c, h, _) = stats_of(child(dir.path(), &p));
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
        fresh_dir("dump-cache").path(),
        &p,
        &[("DEFERFUSE_DUMP_DIR", dump.path())],
    ));
    let modules: Vec<String> = std::fs::read_dir(dump.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "mlir"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        !modules.is_empty(),
        "no .mlir file in {}",
        dump.path().display()
    );
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

// ---- values stay on the device between programs ----

fn un(rt: &Runtime, u: UnaryOp, x: deferfuse_runtime::Handle) -> deferfuse_runtime::Handle {
    rt.op(0, Op::Unary(u), &[Input::Tensor(x)], None).unwrap()
}

fn bin_s(
    rt: &Runtime,
    b: BinaryOp,
    x: deferfuse_runtime::Handle,
    s: f64,
) -> deferfuse_runtime::Handle {
    rt.op(
        0,
        Op::Binary(b),
        &[Input::Tensor(x), Input::Scalar(Scalar::Float(s))],
        None,
    )
    .unwrap()
}

fn row_sum(rt: &Runtime, x: deferfuse_runtime::Handle, dim: usize) -> deferfuse_runtime::Handle {
    let red = Op::Reduce {
        op: ReduceOp::Sum,
        dims: vec![dim].into(),
        keepdim: false,
    };
    rt.op(0, red, &[Input::Tensor(x)], None).unwrap()
}

fn matmul(
    rt: &Runtime,
    a: deferfuse_runtime::Handle,
    b: deferfuse_runtime::Handle,
) -> deferfuse_runtime::Handle {
    rt.op(0, Op::Matmul, &[Input::Tensor(a), Input::Tensor(b)], None)
        .unwrap()
}

fn assert_close(what: &str, cpu: &[f32], pjrt: &[f32]) {
    assert_eq!(cpu.len(), pjrt.len(), "{what}");
    for (i, (a, b)) in cpu.iter().zip(pjrt).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
            "{what}[{i}]: cpu {a} vs pjrt {b}"
        );
    }
}

/// (uploads, downloads, resident hits) since `before`.
fn transfers(rt: &Runtime, before: deferfuse_runtime::Stats) -> (u64, u64, u64) {
    let s = rt.stats();
    (
        s.backend.device_uploads - before.backend.device_uploads,
        s.backend.device_downloads - before.backend.device_downloads,
        s.backend.device_resident_hits - before.backend.device_resident_hits,
    )
}

/// exp(x / 2) | relu(. - 1) | row sums, one region each (a synchronize between them): the
/// input is uploaded once, each intermediate is taken from the device, and only the host read
/// of the result downloads anything. Dims 5 and 6 are padded (to 8), so this also runs through
/// the zeroed padding of every result.
#[test]
fn a_chain_of_regions_uploads_its_input_once_and_downloads_only_the_host_read() {
    let Some(p) = plugin() else { return };
    let x: Vec<f32> = (0..5 * 6).map(|i| (i as f32 * 0.29).sin() * 3.0).collect();
    let run = |rt: &Runtime| {
        let xh = rt.from_host(&f32_bytes(&x), DType::F32, &[5, 6]).unwrap();
        let before = rt.stats();
        let a = un(rt, UnaryOp::Exp, bin_s(rt, BinaryOp::Mul, xh, 0.5));
        rt.synchronize(0).unwrap();
        let b = un(rt, UnaryOp::Relu, bin_s(rt, BinaryOp::Sub, a, 1.0));
        rt.synchronize(0).unwrap();
        let c = row_sum(rt, b, 1);
        let runs = rt.stats().programs_run - before.programs_run;
        let got = read_f32(rt, c, 5);
        (got, transfers(rt, before), runs)
    };
    let (cpu, _, _) = run(&runtime(BackendKind::Cpu, None, Mode::Defer).unwrap());
    let rt = runtime(BackendKind::Pjrt, Some(&p), Mode::Defer).unwrap();
    let (pj, (up, down, hits), runs) = run(&rt);
    assert_close("row sums", &cpu, &pj);
    assert!(
        runs >= 2,
        "the synchronizes cut the chain ({runs} programs before the read)"
    );
    assert_eq!(
        (up, down, hits),
        (1, 1, 2),
        "(uploads, downloads, resident hits) of a 3-region chain"
    );
}

/// Strict mode runs every op as its own program; the values still stay on the device between
/// them, and reading one does not evict it: a later op takes it from the device again.
#[test]
fn strict_mode_keeps_values_on_the_device_between_ops() {
    let Some(p) = plugin() else { return };
    let x: Vec<f32> = (0..3 * 7).map(|i| i as f32 * 0.1 - 1.0).collect();
    let run = |rt: &Runtime| {
        let xh = rt.from_host(&f32_bytes(&x), DType::F32, &[3, 7]).unwrap();
        let before = rt.stats();
        let a = bin_s(rt, BinaryOp::Mul, xh, 3.0);
        let b = un(rt, UnaryOp::Tanh, a);
        let c = bin_s(rt, BinaryOp::Add, b, 0.25);
        let first = read_f32(rt, c, 21);
        let d = bin_s(rt, BinaryOp::Mul, c, 2.0);
        let second = read_f32(rt, d, 21);
        (first, second, transfers(rt, before))
    };
    let cpu = run(&runtime(BackendKind::Cpu, None, Mode::Strict).unwrap());
    let pj = run(&runtime(BackendKind::Pjrt, Some(&p), Mode::Strict).unwrap());
    assert_close("tanh chain", &cpu.0, &pj.0);
    assert_close("after the read", &cpu.1, &pj.1);
    assert_eq!(pj.2, (1, 2, 3), "(uploads, downloads, resident hits)");
}

/// Results on the device carry zero padding, like an upload: a matmul contracting over a
/// padded k (3, bucketed to 4) of two resident exp() results would add exp(0) * exp(0) = 1 per
/// padded term, and one of a resident log() result would add log(0) * 0 = NaN. (Adding a row
/// vector keeps each loop 2-D, so its result is staged with the matmul's own dims and passed
/// as is.)
#[test]
fn resident_results_are_zero_padded_for_matmuls_over_a_padded_inner_dim() {
    let Some(p) = plugin() else { return };
    let x: Vec<f32> = (0..5 * 3)
        .map(|i| 0.5 + (i as f32 * 0.7).sin().abs())
        .collect();
    let y: Vec<f32> = (0..3 * 7).map(|i| (i as f32 * 0.3).cos() * 0.5).collect();
    let run = |rt: &Runtime| {
        let xh = rt.from_host(&f32_bytes(&x), DType::F32, &[5, 3]).unwrap();
        let yh = rt.from_host(&f32_bytes(&y), DType::F32, &[3, 7]).unwrap();
        let r3 = rt
            .from_host(&f32_bytes(&[0.0, 0.1, 0.2]), DType::F32, &[3])
            .unwrap();
        let r7 = rt
            .from_host(&f32_bytes(&[0.0; 7]), DType::F32, &[7])
            .unwrap();
        let add = |a, b| {
            rt.op(
                0,
                Op::Binary(BinaryOp::Add),
                &[Input::Tensor(a), Input::Tensor(b)],
                None,
            )
            .unwrap()
        };
        let ex = un(rt, UnaryOp::Exp, add(xh, r3));
        let ey = un(rt, UnaryOp::Exp, add(yh, r7));
        let lx = un(rt, UnaryOp::Log, add(xh, r3));
        rt.synchronize(0).unwrap();
        let before = rt.stats();
        let m1 = matmul(rt, ex, ey);
        let m2 = matmul(rt, lx, yh);
        let s = row_sum(rt, ex, 0);
        rt.synchronize(0).unwrap();
        let hits = rt.stats().backend.device_resident_hits - before.backend.device_resident_hits;
        (
            read_f32(rt, m1, 35),
            read_f32(rt, m2, 35),
            read_f32(rt, s, 3),
            hits,
        )
    };
    let cpu = run(&runtime(BackendKind::Cpu, None, Mode::Defer).unwrap());
    let pj = run(&runtime(BackendKind::Pjrt, Some(&p), Mode::Defer).unwrap());
    assert_close("exp(x + r) @ exp(y + r)", &cpu.0, &pj.0);
    assert_close("log(x + r) @ y", &cpu.1, &pj.1);
    assert_close("column sums of exp(x + r)", &cpu.2, &pj.2);
    assert!(
        pj.3 >= 4,
        "the matmuls took their operands from the device ({} hits)",
        pj.3
    );
}

/// A copy into a strided slice of a buffer whose value lives on the device: the rest of the
/// buffer is written back first, so the host then holds both parts; a transposed read of the
/// result (not a dense view: gathered on the host) and a dense one agree.
#[test]
fn a_write_through_a_partial_view_of_a_resident_buffer_keeps_the_rest() {
    let Some(p) = plugin() else { return };
    let x: Vec<f32> = (0..4 * 6).map(|i| i as f32 * 0.05).collect();
    let run = |rt: &Runtime| {
        let xh = rt.from_host(&f32_bytes(&x), DType::F32, &[4, 6]).unwrap();
        let a = un(rt, UnaryOp::Exp, xh);
        rt.synchronize(0).unwrap();
        let cols = rt
            .view(
                0,
                a,
                &deferfuse_runtime::View::Slice {
                    dim: 1,
                    start: 1,
                    end: 6,
                    step: 2,
                },
            )
            .unwrap();
        let src = rt
            .from_host(&f32_bytes(&[-1.0; 12]), DType::F32, &[4, 3])
            .unwrap();
        rt.op(0, Op::Copy, &[Input::Tensor(src)], Some(cols))
            .unwrap();
        let t = rt
            .view(0, a, &deferfuse_runtime::View::Transpose(0, 1))
            .unwrap();
        let tt = bin_s(rt, BinaryOp::Add, t, 1.0);
        let d = bin_s(rt, BinaryOp::Mul, a, 2.0);
        (
            read_f32(rt, a, 24),
            read_f32(rt, tt, 24),
            read_f32(rt, d, 24),
        )
    };
    let cpu = run(&runtime(BackendKind::Cpu, None, Mode::Defer).unwrap());
    let pj = run(&runtime(BackendKind::Pjrt, Some(&p), Mode::Defer).unwrap());
    assert_eq!(cpu.0[1], -1.0);
    assert_close("a after the partial copy", &cpu.0, &pj.0);
    assert_close("a.T + 1", &cpu.1, &pj.1);
    assert_close("a * 2", &cpu.2, &pj.2);
}

/// Data from the host copied over a buffer whose value lives on the device replaces it, and
/// the buffer reads back as the copied data, on the host and in the next program.
#[test]
fn a_host_copy_into_a_resident_buffer_replaces_its_value() {
    let Some(p) = plugin() else { return };
    for mode in [Mode::Strict, Mode::Defer] {
        let rt = runtime(BackendKind::Pjrt, Some(&p), mode).unwrap();
        let x: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let xh = rt.from_host(&f32_bytes(&x), DType::F32, &[10]).unwrap();
        let a = bin_s(&rt, BinaryOp::Add, xh, 100.0);
        assert_eq!(read_f32(&rt, a, 10)[3], 103.0, "{mode:?}");
        let fresh: Vec<f32> = (0..10).map(|i| -(i as f32)).collect();
        let h = rt.from_host(&f32_bytes(&fresh), DType::F32, &[10]).unwrap();
        rt.op(0, Op::Copy, &[Input::Tensor(h)], Some(a)).unwrap();
        assert_eq!(read_f32(&rt, a, 10), fresh, "{mode:?}");
        let b = bin_s(&rt, BinaryOp::Mul, a, 2.0);
        let want: Vec<f32> = fresh.iter().map(|v| v * 2.0).collect();
        assert_eq!(read_f32(&rt, b, 10), want, "{mode:?}");
    }
}

/// A host read of any view (here every third row, transposed) of a value that lives on the
/// device writes the whole buffer back first; the device copy stays valid for the next program.
#[test]
fn a_host_read_of_a_view_of_a_resident_value_writes_it_back_first() {
    let Some(p) = plugin() else { return };
    let rt = runtime(BackendKind::Pjrt, Some(&p), Mode::Defer).unwrap();
    let x: Vec<f32> = (0..9 * 4).map(|i| i as f32).collect();
    let xh = rt.from_host(&f32_bytes(&x), DType::F32, &[9, 4]).unwrap();
    let a = bin_s(&rt, BinaryOp::Add, xh, 0.5);
    let rows = rt
        .view(
            0,
            a,
            &deferfuse_runtime::View::Slice {
                dim: 0,
                start: 1,
                end: 9,
                step: 3,
            },
        )
        .unwrap();
    let v = rt
        .view(0, rows, &deferfuse_runtime::View::Transpose(0, 1))
        .unwrap();
    let want: Vec<f32> = (0..4)
        .flat_map(|c| [1, 4, 7].map(|r| x[r * 4 + c] + 0.5))
        .collect();
    assert_eq!(read_f32(&rt, v, 12), want);
    let before = rt.stats();
    let b = bin_s(&rt, BinaryOp::Mul, a, 2.0);
    rt.synchronize(0).unwrap();
    assert_eq!(
        transfers(&rt, before),
        (0, 0, 1),
        "a is still on the device"
    );
    assert_eq!(read_f32(&rt, b, 36)[5], (5.0 + 0.5) * 2.0);
}

/// A buffer's device copy is freed with the buffer: once every handle is released and the
/// work that used them has run, no device memory holds a value.
#[test]
fn releasing_every_tensor_frees_their_device_copies() {
    let Some(p) = plugin() else { return };
    let rt = runtime(BackendKind::Pjrt, Some(&p), Mode::Defer).unwrap();
    let x: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let xh = rt
        .from_host(&f32_bytes(&x), DType::F32, &[10, 100])
        .unwrap();
    let a = un(&rt, UnaryOp::Sqrt, xh);
    let s = row_sum(&rt, a, 1);
    assert_eq!(read_f32(&rt, s, 10).len(), 10);
    assert!(rt.stats().backend.device_resident_bytes >= 4 * 1000);
    for h in [xh, a, s] {
        rt.release(h).unwrap();
    }
    rt.synchronize(0).unwrap();
    assert_eq!(rt.stats().backend.device_resident_bytes, 0);
}

/// A matmul into a fresh tensor (beta 0) never reads the output's old contents, so nothing of
/// it is uploaded; with its operands on the device, repeating it uploads nothing at all.
#[test]
fn a_repeated_matmul_uploads_nothing_after_its_first_launch() {
    let Some(p) = plugin() else { return };
    let rt = runtime(BackendKind::Pjrt, Some(&p), Mode::Defer).unwrap();
    let a: Vec<f32> = (0..6 * 5).map(|i| (i as f32 * 0.2).sin()).collect();
    let b: Vec<f32> = (0..5 * 3).map(|i| (i as f32 * 0.4).cos()).collect();
    let ah = rt.from_host(&f32_bytes(&a), DType::F32, &[6, 5]).unwrap();
    let bh = rt.from_host(&f32_bytes(&b), DType::F32, &[5, 3]).unwrap();
    let want: Vec<f32> = (0..6 * 3)
        .map(|i| (0..5).map(|k| a[i / 3 * 5 + k] * b[k * 3 + i % 3]).sum())
        .collect();
    for round in 0..3 {
        let before = rt.stats();
        let m = matmul(&rt, ah, bh);
        rt.synchronize(0).unwrap();
        let (up, _, _) = transfers(&rt, before);
        if round > 0 {
            assert_eq!(up, 0, "round {round} uploaded {up} arrays");
        }
        assert_close("a @ b", &want, &read_f32(&rt, m, 18));
        rt.release(m).unwrap();
    }
}
