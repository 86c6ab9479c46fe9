//! What a PyTorch backend pays per op through the C ABI: recording one op in defer mode
//! (`dfuse_op` + `dfuse_tensor_release` of the previous value, as a front end would), and a
//! flush whose plan and program are cached (`dfuse_stream_synchronize` after N recorded ops,
//! record time excluded). Targets (issue 4): record <= 100 ns/op; a cache-hit flush <= 2 us
//! plus 30 ns per op. A strict op (`dfuse_op` runs its program before returning) is timed too:
//! issue 17's target is <= 2 us per strict op.

use criterion::{criterion_group, BenchmarkId, Criterion};
use dfuse_ffi::*;
use std::time::{Duration, Instant};

struct Rt(*mut DfuseRuntime);

impl Rt {
    fn defer() -> Rt {
        Rt::new(DfuseMode::Defer)
    }

    fn new(mode: DfuseMode) -> Rt {
        let mut cfg: DfuseConfig = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { dfuse_config_default(&mut cfg) }, DfuseStatus::Ok);
        cfg.mode = mode as u32;
        cfg.max_pending_ops = 1 << 20;
        cfg.num_threads = 1;
        let mut rt = std::ptr::null_mut();
        assert_eq!(
            unsafe { dfuse_runtime_create(&cfg, &mut rt) },
            DfuseStatus::Ok
        );
        Rt(rt)
    }

    fn input(&self) -> u64 {
        let v = [1.0f32; 8];
        let sizes = [8i64];
        let mut h = 0;
        let st = unsafe {
            dfuse_tensor_from_host(
                self.0,
                v.as_ptr().cast(),
                32,
                DfuseDtype::F32 as u32,
                sizes.as_ptr(),
                1,
                &mut h,
            )
        };
        assert_eq!(st, DfuseStatus::Ok);
        h
    }

    /// `x + 1.0` as a new tensor.
    fn add_one(&self, x: u64, attrs: &DfuseAttrs) -> u64 {
        let ins = [
            DfuseOperand {
                kind: DfuseOperandKind::Tensor as u32,
                tensor: x,
                f: 0.0,
                i: 0,
            },
            DfuseOperand {
                kind: DfuseOperandKind::Float as u32,
                tensor: 0,
                f: 1.0,
                i: 0,
            },
        ];
        let mut r = 0;
        let st = unsafe {
            dfuse_op(
                self.0,
                0,
                DfuseOpKind::Binary as u32,
                attrs,
                ins.as_ptr(),
                2,
                0,
                &mut r,
            )
        };
        assert_eq!(st, DfuseStatus::Ok);
        r
    }

    fn release(&self, h: u64) {
        assert_eq!(unsafe { dfuse_tensor_release(self.0, h) }, DfuseStatus::Ok);
    }

    fn sync(&self) {
        assert_eq!(
            unsafe { dfuse_stream_synchronize(self.0, 0) },
            DfuseStatus::Ok
        );
    }

    /// Records `n` dependent adds starting from `x`, releasing each input; returns the last.
    fn chain(&self, x: u64, n: usize, attrs: &DfuseAttrs) -> u64 {
        let mut cur = x;
        for _ in 0..n {
            let y = self.add_one(cur, attrs);
            self.release(cur);
            cur = y;
        }
        cur
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        unsafe { dfuse_runtime_destroy(self.0) };
    }
}

fn add_attrs() -> DfuseAttrs {
    let mut a: DfuseAttrs = unsafe { std::mem::zeroed() };
    a.sub_op = DfuseBinaryOp::Add as u32;
    a
}

/// Each measured batch records ops; the flush that follows is not timed. Batches of 64 keep
/// the plan cache hitting, as a training loop's steps would.
fn record(c: &mut Criterion) {
    let rt = Rt::defer();
    let attrs = add_attrs();
    let mut x = rt.input();
    c.bench_function("c_abi/record_op_defer", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(64);
                let t = Instant::now();
                x = rt.chain(x, n as usize, &attrs);
                total += t.elapsed();
                rt.sync();
                left -= n;
            }
            total
        })
    });
}

/// A flush whose plan and program are cached: N ops recorded (untimed), then the timed
/// synchronize plans (reused plan), launches and runs the fused program on 8 elements.
fn flush_hit(c: &mut Criterion) {
    let mut g = c.benchmark_group("c_abi/flush_cache_hit");
    for n in [10usize, 100] {
        let rt = Rt::defer();
        let attrs = add_attrs();
        let mut x = rt.input();
        x = rt.chain(x, n, &attrs);
        rt.sync();
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    x = rt.chain(x, n, &attrs);
                    let t = Instant::now();
                    rt.sync();
                    total += t.elapsed();
                }
                total
            })
        });
    }
    g.finish();
}

/// A strict op: recorded, its program found (or its plan reused) and run on 8 elements before
/// `dfuse_op` returns; the previous value is released as a front end would.
fn strict_op(c: &mut Criterion) {
    let rt = Rt::new(DfuseMode::Strict);
    let attrs = add_attrs();
    let mut x = rt.chain(rt.input(), 64, &attrs);
    c.bench_function("c_abi/strict_op", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            x = rt.chain(x, iters as usize, &attrs);
            let total = t.elapsed();
            rt.sync();
            total
        })
    });
}

/// `cat` of N 8-element tensors recorded in defer mode (then flushed, untimed), per input:
/// each input is one copy node, so the time per input must not grow with N (it grew as N
/// when each copy carried the whole op's buffer list: torch.stack of 1,600 tensors took 40-57
/// ms, clip_grad_norm_ stacks one norm per parameter).
fn cat_many(c: &mut Criterion) {
    let mut g = c.benchmark_group("c_abi/cat_per_input");
    for n in [16usize, 1600] {
        let rt = Rt::defer();
        let inputs: Vec<u64> = (0..n).map(|_| rt.input()).collect();
        let ins: Vec<DfuseOperand> = inputs
            .iter()
            .map(|&h| DfuseOperand {
                kind: DfuseOperandKind::Tensor as u32,
                tensor: h,
                f: 0.0,
                i: 0,
            })
            .collect();
        let attrs: DfuseAttrs = unsafe { std::mem::zeroed() };
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut r = 0;
                    let t = Instant::now();
                    let st = unsafe {
                        dfuse_op(
                            rt.0,
                            0,
                            DfuseOpKind::Cat as u32,
                            &attrs,
                            ins.as_ptr(),
                            ins.len(),
                            0,
                            &mut r,
                        )
                    };
                    total += t.elapsed();
                    assert_eq!(st, DfuseStatus::Ok);
                    rt.release(r);
                    rt.sync();
                }
                total / n as u32
            })
        });
    }
    g.finish();
}

criterion_group!(benches, record, flush_hit, strict_op, cat_many);

/// With `DFUSE_RECORD_OPS=N` set, records N ops (batches of 64, each flushed, as the criterion
/// bench does) and exits without criterion: a fixed amount of work to run under callgrind
/// (`--toggle-collect=dfuse_op --toggle-collect=dfuse_tensor_release`), whose instruction
/// counts are steady where wall times on a shared machine are not. With `DFUSE_RECORD_MODE=strict`
/// too, the N ops run in strict mode instead (each its own program, run before `dfuse_op`
/// returns).
fn main() {
    if let Some(n) = std::env::var("DFUSE_RECORD_OPS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let mode = match std::env::var("DFUSE_RECORD_MODE").as_deref() {
            Ok("strict") => DfuseMode::Strict,
            _ => DfuseMode::Defer,
        };
        let rt = Rt::new(mode);
        let attrs = add_attrs();
        let mut x = rt.input();
        for left in (0..n).step_by(64) {
            x = rt.chain(x, (n - left).min(64), &attrs);
            rt.sync();
        }
        rt.release(x);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
