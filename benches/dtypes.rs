//! Criterion bench: one fused elementwise chain, `max(a * b + c, a) - b * k`, on 1M elements in
//! defer mode with one thread, per dtype (f32, f64, i32, i64). It shows what computing each
//! dtype in vector registers (or not) costs the CPU backend's loops.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deferfuse::{BinaryOp, Config, DType, Input, Mode, Op, Runtime, Scalar};

const N: usize = 1 << 20;

fn rt() -> Runtime {
    Runtime::new(Config {
        mode: Some(Mode::Defer),
        num_threads: 1,
        max_pending_ops: 1 << 20,
        ..Default::default()
    })
    .expect("runtime")
}

/// `n` values in [-2, 2) (whole numbers for the integer dtypes), little-endian.
fn data(d: DType, n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n * d.size());
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let x = ((s >> 40) as f64 / (1u64 << 24) as f64) * 4.0 - 2.0;
        match d {
            DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
            DType::I32 => out.extend_from_slice(&((x * 1000.0) as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&((x * 1000.0) as i64).to_le_bytes()),
            other => unreachable!("{other:?} is not benched"),
        }
    }
    out
}

fn chain(c: &mut Criterion) {
    let mut g = c.benchmark_group("chain_max_mul_add_1M");
    g.sample_size(20);
    for d in [DType::F32, DType::F64, DType::I32, DType::I64] {
        let r = rt();
        let [a, b, cc] =
            [1, 2, 3].map(|seed| r.from_host(&data(d, N, seed), d, &[N]).expect("input"));
        let k = if d.is_float() {
            Scalar::Float(0.5)
        } else {
            Scalar::Int(3)
        };
        let t = Input::Tensor;
        let op =
            |o: BinaryOp, x: Input, y: Input| r.op(0, Op::Binary(o), &[x, y], None).expect("op");
        // Bytes moved: three inputs read, one output written.
        g.throughput(Throughput::Bytes((4 * N * d.size()) as u64));
        g.bench_function(format!("{d:?}").to_lowercase(), |bch| {
            bch.iter(|| {
                let ab = op(BinaryOp::Mul, t(a), t(b));
                let abc = op(BinaryOp::Add, t(ab), t(cc));
                r.release(ab).expect("release");
                let m = op(BinaryOp::Maximum, t(abc), t(a));
                r.release(abc).expect("release");
                let bk = op(BinaryOp::Mul, t(b), Input::Scalar(k));
                let y = op(BinaryOp::Sub, t(m), t(bk));
                r.release(m).expect("release");
                r.release(bk).expect("release");
                r.synchronize(0).expect("sync");
                r.release(y).expect("release");
            })
        });
    }
    g.finish();
}

criterion_group!(benches, chain);
criterion_main!(benches);
