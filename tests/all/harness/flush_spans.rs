//! The timeline's flush spans of a piece of work: what a test reads to see how a flush ran
//! (where its steps ran, what it cut) without timing anything.

use deferfuse::Runtime;
use serde_json::Value;

/// Runs `f` with the timeline on and returns its flush spans' arguments, in order.
pub fn flush_args(rt: &Runtime, f: impl FnOnce()) -> Vec<Value> {
    let path = std::env::temp_dir().join(format!(
        "dfuse-flush-spans-{}-{:?}.json",
        std::process::id(),
        std::thread::current().id()
    ));
    rt.trace_start(&path, 0).unwrap();
    f();
    rt.trace_stop().unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "flush" && e["ph"] == "X")
        .map(|e| e["args"].clone())
        .collect()
}
