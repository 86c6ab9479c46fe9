//! Criterion benches: record cost per op, single-op compile time, and chain10 at 1M in strict
//! and defer mode, measured side by side.

#[path = "workloads.rs"]
mod workloads;

use criterion::{criterion_group, criterion_main, Criterion};
use deferfuse::{BinaryOp, Config, DType, Input, Mode, Op, Runtime, Scalar};
use workloads::Workload;

fn rt(mode: Mode) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        max_pending_ops: 1 << 20,
        ..Default::default()
    })
    .expect("runtime")
}

fn record(c: &mut Criterion) {
    let rt = rt(Mode::Defer);
    let x = rt
        .from_host(&workloads::data(8, 1), DType::F32, &[8])
        .expect("x");
    c.bench_function("record_op_defer", |b| {
        b.iter(|| {
            let h = rt
                .op(
                    0,
                    Op::Binary(BinaryOp::Add),
                    &[Input::Tensor(x), Input::Scalar(Scalar::Float(1.0))],
                    None,
                )
                .expect("op");
            rt.release(h).expect("release");
        })
    });
    rt.synchronize(0).expect("sync");
}

fn compile(c: &mut Criterion) {
    c.bench_function("compile_single_op", |b| {
        b.iter(|| {
            let rt = rt(Mode::Strict);
            let x = rt
                .from_host(&workloads::data(8, 1), DType::F32, &[8])
                .expect("x");
            let y = rt
                .op(
                    0,
                    Op::Binary(BinaryOp::Add),
                    &[Input::Tensor(x), Input::Tensor(x)],
                    None,
                )
                .expect("op");
            rt.synchronize(0).expect("sync");
            y
        })
    });
}

fn chain10(c: &mut Criterion) {
    let mut g = c.benchmark_group("chain10_1M");
    g.sample_size(20);
    for mode in [Mode::Strict, Mode::Defer] {
        let r = rt(mode);
        let w = Workload::chain10(&r, 1 << 20);
        g.bench_function(mode.name(), |b| b.iter(|| w.run(&r)));
    }
    g.finish();
}

criterion_group!(benches, record, compile, chain10);
criterion_main!(benches);
