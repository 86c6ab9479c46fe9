//! The timeline (`DEFERFUSE_TRACE`, `Runtime::trace_start`/`trace_stop`), specified by the
//! file a small training step writes: valid Chrome trace JSON whose events show each flush,
//! plan lookup, compile and program run, in stream order.

use deferfuse::*;
use serde_json::Value;
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("dfuse-tl-{}-{name}.json", std::process::id()))
}

fn rt(trace: Option<PathBuf>, trace_events: usize) -> Runtime {
    Runtime::new(Config {
        mode: Some(Mode::Defer),
        trace,
        trace_events,
        ..Default::default()
    })
    .unwrap()
}

fn tensor(rt: &Runtime, v: &[f32], sizes: &[usize]) -> Handle {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    rt.from_host(&b, DType::F32, sizes).unwrap()
}

fn t(h: Handle) -> Input {
    Input::Tensor(h)
}

fn f(v: f64) -> Input {
    Input::Scalar(Scalar::Float(v))
}

/// One step of linear regression: loss = mean((x @ w - y)^2) read on the host (a sync
/// point), then w -= 0.1 * x^T @ (x @ w - y), in place, and a synchronize.
fn train_step(rt: &Runtime, x: Handle, xt: Handle, y: Handle, w: Handle) -> f32 {
    let p = rt.op(0, Op::Matmul, &[t(x), t(w)], None).unwrap();
    let err = rt
        .op(0, Op::Binary(BinaryOp::Sub), &[t(p), t(y)], None)
        .unwrap();
    let sq = rt
        .op(0, Op::Binary(BinaryOp::Mul), &[t(err), t(err)], None)
        .unwrap();
    let mean = Op::Reduce {
        op: ReduceOp::Mean,
        dims: Default::default(),
        keepdim: false,
    };
    let loss = rt.op(0, mean, &[t(sq)], None).unwrap();
    let mut b = [0u8; 4];
    rt.to_host(loss, &mut b).unwrap();
    let g = rt.op(0, Op::Matmul, &[t(xt), t(err)], None).unwrap();
    let step = rt
        .op(0, Op::Binary(BinaryOp::Mul), &[t(g), f(0.1)], None)
        .unwrap();
    rt.op(0, Op::Binary(BinaryOp::Sub), &[t(w), t(step)], Some(w))
        .unwrap();
    rt.synchronize(0).unwrap();
    for h in [p, err, sq, loss, g, step] {
        rt.release(h).unwrap();
    }
    f32::from_le_bytes(b)
}

/// The trace of two training steps, parsed.
fn traced_steps(steps: usize) -> Value {
    let path = tmp(&format!("steps{steps}"));
    let r = rt(None, 0);
    let xs: Vec<f32> = (0..32).map(|k| (k % 7) as f32 * 0.25).collect();
    let xts: Vec<f32> = (0..32).map(|k| xs[(k % 8) * 4 + k / 8]).collect();
    let x = tensor(&r, &xs, &[8, 4]);
    let xt = tensor(&r, &xts, &[4, 8]);
    let y = tensor(&r, &[1.0; 24], &[8, 3]);
    let w = tensor(&r, &[0.0; 12], &[4, 3]);
    r.trace_start(&path, 0).unwrap();
    for _ in 0..steps {
        train_step(&r, x, xt, y, w);
    }
    let s = r.trace_stop().unwrap();
    assert_eq!(s.dropped, 0);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .expect("the trace is valid JSON");
    let _ = std::fs::remove_file(path);
    v
}

/// The trace's complete ("X") events of category `cat`, in time order.
fn spans<'a>(v: &'a Value, cat: &str) -> Vec<&'a Value> {
    let mut e: Vec<&Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == cat && e["ph"] == "X")
        .collect();
    e.sort_by(|a, b| ts(a).total_cmp(&ts(b)));
    e
}

fn ts(e: &Value) -> f64 {
    e["ts"].as_f64().unwrap()
}

fn end(e: &Value) -> f64 {
    ts(e) + e["dur"].as_f64().unwrap()
}

#[test]
fn a_training_step_traces_its_flushes_plan_lookups_compiles_and_runs() {
    let v = traced_steps(1);
    let flushes = spans(&v, "flush");
    let reasons: Vec<&str> = flushes
        .iter()
        .map(|e| e["args"]["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["host_read", "synchronize"]);
    assert_eq!(flushes[0]["args"]["ops"], 4, "matmul, sub, mul, mean");
    assert!(
        flushes[0]["args"]["steps"].as_u64().unwrap() >= 1,
        "{}",
        flushes[0]
    );
    assert_eq!(spans(&v, "plan").len(), 2);
    let compiles = spans(&v, "compile");
    assert!(!compiles.is_empty(), "a first step compiles");
    assert!(compiles[0]["args"]["fingerprint"].as_str().unwrap().len() == 32);
    let runs = spans(&v, "run");
    assert!(runs.len() >= 3, "{runs:?}");
    for r in &runs {
        let a = &r["args"];
        assert!(
            a["bytes"].as_u64().unwrap() > 0 && a["shapes"].as_str().is_some(),
            "{r}"
        );
        assert!(a["threads"].as_u64().unwrap() >= 1);
    }
    assert!(
        runs.iter()
            .any(|r| r["name"].as_str().unwrap().starts_with("matmul.float32")),
        "{runs:?}"
    );
    assert!(spans(&v, "copy")
        .iter()
        .any(|c| c["name"] == "copy to host" && c["args"]["bytes"] == 4));
    assert!(
        spans(&v, "wait").iter().any(|w| w["name"] == "synchronize"),
        "the step's synchronize waits for its stream"
    );
}

#[test]
fn programs_run_side_by_side_are_drawn_on_one_track_per_cpu_worker() {
    let path = tmp("workers");
    let r = Runtime::new(Config {
        mode: Some(Mode::Defer),
        num_threads: 2,
        ..Default::default()
    })
    .unwrap();
    r.trace_start(&path, 0).unwrap();
    let params = crate::threads::optimizer_step(&r);
    r.synchronize(0).unwrap();
    r.trace_stop().unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(path);
    let events = v["traceEvents"].as_array().unwrap();
    let workers: Vec<u64> = events
        .iter()
        .filter(|e| {
            e["name"] == "thread_name"
                && e["args"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("cpu worker "))
        })
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    assert!(!workers.is_empty(), "a named track per CPU worker");
    let runs = spans(&v, "run");
    let on_workers: Vec<&&Value> = runs
        .iter()
        .filter(|r| workers.contains(&r["tid"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        on_workers.len(),
        params.len(),
        "each update ran on a worker"
    );
    assert!(on_workers.iter().all(|r| r["args"]["threads"] == 1));
    assert!(
        !spans(&v, "wave").is_empty(),
        "the wave is drawn on the stream's track"
    );
    for p in params {
        r.release(p).unwrap();
    }
}

#[test]
fn a_streams_program_runs_follow_each_other_and_their_flush_in_stream_order() {
    let v = traced_steps(2);
    let flushes = spans(&v, "flush");
    let runs = spans(&v, "run");
    for pair in runs.windows(2) {
        assert!(ts(pair[1]) >= end(pair[0]), "runs overlap: {pair:?}");
    }
    // Each run starts after the flush that launched it began, and before the next began.
    let mut k = 0;
    for r in &runs {
        while k + 1 < flushes.len() && ts(flushes[k + 1]) <= ts(r) {
            k += 1;
        }
        assert!(ts(r) >= ts(flushes[k]), "{r} before {}", flushes[k]);
    }
    let tracks: Vec<u64> = runs.iter().map(|r| r["tid"].as_u64().unwrap()).collect();
    assert!(tracks.iter().all(|&t| t == tracks[0]), "one program track");
    assert_ne!(tracks[0], flushes[0]["tid"].as_u64().unwrap());
}

#[test]
fn the_second_step_hits_the_plan_cache_and_compiles_nothing() {
    let v = traced_steps(2);
    let plans = spans(&v, "plan");
    let hits: Vec<bool> = plans
        .iter()
        .map(|p| p["args"]["hit"].as_bool().unwrap())
        .collect();
    assert_eq!(hits, [false, false, true, true]);
    let second = ts(spans(&v, "flush")[2]);
    assert!(spans(&v, "compile").iter().all(|c| ts(c) < second));
}

#[test]
fn each_region_that_ran_is_listed_once_with_its_text_and_a_loop_with_its_graph() {
    let v = traced_steps(2);
    let regions = v["deferfuse_regions"].as_array().unwrap();
    let runs = spans(&v, "run");
    for r in &runs {
        let fp = r["args"]["region"].as_str().unwrap();
        let n = regions.iter().filter(|g| g["fingerprint"] == fp).count();
        assert_eq!(n, 1, "region {fp} listed once");
    }
    assert!(regions
        .iter()
        .any(|g| g["dot"].as_str().is_some_and(|d| d.starts_with("digraph"))));
    assert!(regions
        .iter()
        .all(|g| !g["text"].as_str().unwrap().is_empty()));
}

#[test]
fn each_cut_is_an_instant_naming_its_reason_and_the_op_that_started_the_new_region() {
    let v = traced_steps(1);
    let cuts: Vec<&Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "cut")
        .collect();
    assert!(!cuts.is_empty(), "a matmul after elementwise work is cut");
    for c in &cuts {
        assert_eq!(c["ph"], "i");
        assert!(c["name"].as_str().unwrap().starts_with("cut ("), "{c}");
        assert!(!c["args"]["op"].as_str().unwrap().is_empty(), "{c}");
    }
}

#[test]
fn a_cut_carries_the_tag_the_host_set_when_the_op_it_cut_at_was_recorded() {
    let path = tmp("cut-tag");
    let r = rt(None, 0);
    let x = tensor(&r, &[0.5; 16], &[4, 4]);
    r.trace_start(&path, 0).unwrap();
    r.profiler_tag(5 << 32);
    let e = r.op(0, Op::Unary(UnaryOp::Exp), &[t(x)], None).unwrap();
    r.profiler_tag(9 << 32);
    let m = r.op(0, Op::Matmul, &[t(e), t(x)], None).unwrap();
    r.profiler_tag(0);
    r.synchronize(0).unwrap();
    r.trace_stop().unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(path);
    let cut = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["cat"] == "cut")
        .expect("a matmul after elementwise work is cut");
    assert!(
        cut["args"]["op"].as_str().unwrap().contains("matmul"),
        "{cut}"
    );
    assert_eq!(cut["args"]["tag"], 9u64 << 32, "{cut}");
    for h in [x, e, m] {
        r.release(h).unwrap();
    }
}

#[test]
fn tracks_are_named_for_the_viewer() {
    let v = traced_steps(1);
    let names: Vec<&str> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    for want in ["host", "stream 0 (host)", "stream 0 (programs)"] {
        assert!(names.contains(&want), "{names:?}");
    }
}

#[test]
fn a_trace_beyond_its_event_budget_keeps_the_newest_and_counts_the_dropped() {
    let path = tmp("budget");
    let r = rt(None, 0);
    let x = tensor(&r, &[1.0; 4], &[4]);
    r.trace_start(&path, 3).unwrap();
    for _ in 0..10 {
        let y = r.op(0, Op::Unary(UnaryOp::Exp), &[t(x)], None).unwrap();
        r.synchronize(0).unwrap();
        r.release(y).unwrap();
    }
    let s = r.trace_stop().unwrap();
    assert_eq!(s.events, 3);
    assert!(s.dropped > 0);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["otherData"]["dropped_events"], s.dropped);
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_configured_trace_runs_from_creation_and_is_written_when_the_runtime_drops() {
    let path = tmp("configured");
    let r = rt(Some(path.clone()), 0);
    assert!(r.tracing());
    let x = tensor(&r, &[1.0; 4], &[4]);
    let y = r.op(0, Op::Unary(UnaryOp::Neg), &[t(x)], None).unwrap();
    let _ = y;
    drop(r);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        spans(&v, "flush").len(),
        1,
        "the drop's synchronize ran the pending op"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn an_unwritable_trace_path_fails_runtime_creation_naming_the_variable() {
    let e = Runtime::new(Config {
        trace: Some("/nonexistent-dir/t.json".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("DEFERFUSE_TRACE") && m.contains("/nonexistent-dir/t.json"),
        "{m}"
    );
}

#[test]
fn stopping_without_a_running_trace_is_an_error() {
    let r = rt(None, 0);
    assert!(!r.tracing());
    let e = r.trace_stop().unwrap_err().to_string();
    assert!(e.contains("no trace is running"), "{e}");
}
