//! `dfuse_runtime_destroy` while many threads record on many streams through the C ABI, in
//! strict and defer mode, with events between the streams: no crash, no deadlock, destroy
//! reports success, and every other call either succeeds with correct values or reports that
//! the runtime is gone.

use deferfuse::*;
use std::ffi::CStr;
use std::sync::mpsc;
use std::time::Duration;

const THREADS: usize = 8;
const STREAMS: usize = 4;

fn last_error() -> String {
    // SAFETY: dfuse_last_error returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(dfuse_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Ok, or the runtime was destroyed under the call (`false`); anything else fails the test.
fn alive(s: DfuseStatus, what: &str) -> bool {
    match s {
        DfuseStatus::Ok => true,
        DfuseStatus::InvalidHandle if last_error().contains("is not live") => false,
        other => panic!("{what}: {other:?}: {}", last_error()),
    }
}

fn operand(t: u64) -> DfuseOperand {
    DfuseOperand {
        kind: DfuseOperandKind::Tensor as u32,
        tensor: t,
        f: 0.0,
        i: 0,
    }
}

/// Records `x + 1` on streams in turn (ordered by an event) until the runtime goes away;
/// returns how many ops succeeded.
fn worker(rt: usize, streams: Vec<u64>, t: usize) -> usize {
    let rt = rt as *const DfuseRuntime;
    let mut attrs: DfuseAttrs = unsafe { std::mem::zeroed() };
    attrs.sub_op = DfuseBinaryOp::Add as u32;
    let mode = [DfuseMode::Strict, DfuseMode::Defer][t % 2] as u32;
    let (mut ev, mut x, mut n) = (0u64, 0u64, 0usize);
    let v = [0f32; 16];
    let sizes = [16i64];
    // SAFETY: every pointer is valid for the access the call documents; `rt` is only looked up.
    unsafe {
        if !alive(dfuse_mode_set(rt, mode), "mode_set")
            || !alive(dfuse_event_create(rt, &mut ev), "event_create")
            || !alive(
                dfuse_tensor_from_host(rt, v.as_ptr().cast(), 64, 0, sizes.as_ptr(), 1, &mut x),
                "from_host",
            )
        {
            return 0;
        }
        let one = DfuseOperand {
            kind: DfuseOperandKind::Float as u32,
            tensor: 0,
            f: 1.0,
            i: 0,
        };
        for k in 0.. {
            let (s, prev) = (streams[(t + k) % STREAMS], streams[(t + k + 3) % STREAMS]);
            let mut r = 0;
            let ok = alive(dfuse_event_record(rt, ev, prev), "event_record")
                && alive(dfuse_event_wait(rt, s, ev), "event_wait")
                && alive(
                    dfuse_op(rt, s, 1, &attrs, [operand(x), one].as_ptr(), 2, x, &mut r),
                    "op",
                );
            if !ok {
                return n;
            }
            n += 1;
            if k % 16 == 15 {
                let mut out = [0f32; 16];
                if !alive(
                    dfuse_tensor_to_host(rt, x, out.as_mut_ptr().cast(), 64),
                    "to_host",
                ) {
                    return n;
                }
                assert_eq!(out, [n as f32; 16], "thread {t}: a write was lost");
            }
        }
    }
    n
}

#[test]
fn destroy_while_threads_record_on_many_streams() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut rt = std::ptr::null_mut();
        let mut streams = vec![0u64; STREAMS];
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(
                dfuse_runtime_create(std::ptr::null(), &mut rt),
                DfuseStatus::Ok
            );
            for s in streams.iter_mut().skip(1) {
                assert_eq!(dfuse_stream_create(rt, s), DfuseStatus::Ok);
            }
        }
        let addr = rt as usize;
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let streams = streams.clone();
                std::thread::spawn(move || worker(addr, streams, t))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: `rt` came from dfuse_runtime_create.
        let destroyed = unsafe { dfuse_runtime_destroy(rt) };
        let ops: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        tx.send((destroyed, ops, last_error())).unwrap();
    });
    let (destroyed, ops, msg) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("destroy and the recording threads did not finish within 60 s: a deadlock");
    assert_eq!(destroyed, DfuseStatus::Ok, "{msg}");
    assert!(ops > THREADS, "the threads hardly ran ({ops} ops)");
    println!("{THREADS} threads x {STREAMS} streams: {ops} ops before and during destroy");
}
