//! Criterion benches: every workload of shared/notes/workloads.md in strict and defer mode side
//! by side (criterion prints both; the bench binary prints their ratio), record cost per op,
//! and single-op compile time. Sizes are the small ones so `cargo bench` stays short; the bench
//! binary runs the full sizes.

#[path = "workloads.rs"]
#[allow(dead_code)] // the timing helpers serve the bench binaries; criterion times itself
mod workloads;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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

/// Recording cost only: each measured batch records `iters` ops; the flush that follows is not
/// timed (and keeps the trace from growing across criterion's iterations).
fn record(c: &mut Criterion) {
    let rt = rt(Mode::Defer);
    let x = rt
        .from_host(&workloads::data(8, 1), DType::F32, &[8])
        .expect("x");
    c.bench_function("record_op_defer", |b| {
        b.iter_custom(|iters| {
            let mut hs = Vec::with_capacity(iters as usize);
            let t = std::time::Instant::now();
            for _ in 0..iters {
                let h = rt
                    .op(
                        0,
                        Op::Binary(BinaryOp::Add),
                        &[Input::Tensor(x), Input::Scalar(Scalar::Float(1.0))],
                        None,
                    )
                    .expect("op");
                hs.push(h);
            }
            let elapsed = t.elapsed();
            for h in hs {
                rt.release(h).expect("release");
            }
            rt.synchronize(0).expect("sync");
            elapsed
        })
    });
}

fn compile(c: &mut Criterion) {
    c.bench_function("compile_single_op", |b| {
        b.iter(|| {
            let rt = rt(Mode::Strict);
            workloads::single_add(&rt)
        })
    });
}

type Make = fn(&Runtime) -> Workload;

fn workloads(c: &mut Criterion) {
    let makes: [Make; 6] = [
        |r| Workload::chain10(r, 1 << 20),
        |r| Workload::gelu(r, 1 << 20),
        |r| Workload::softmax(r, 512, 1024),
        |r| Workload::layernorm(r, 512, 1024),
        Workload::adamw,
        Workload::tiny,
    ];
    for make in makes {
        let probe = make(&rt(Mode::Strict));
        let mut g = c.benchmark_group(format!(
            "{}_{}",
            probe.name,
            probe.size_label.replace(' ', "_")
        ));
        g.sample_size(10);
        if probe.bytes > 0 {
            g.throughput(Throughput::Bytes(probe.bytes as u64));
        }
        for mode in [Mode::Strict, Mode::Defer] {
            let r = rt(mode);
            let w = make(&r);
            g.bench_function(mode.name(), |b| b.iter(|| w.run(&r)));
        }
        g.finish();
    }
}

criterion_group!(benches, record, compile, workloads);
criterion_main!(benches);
