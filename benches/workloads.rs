//! The benchmark workloads of shared/notes/workloads.md, written against the runtime's Rust API
//! so the bench binary and the criterion benches run the very same op sequences.

use deferfuse::{BinaryOp, DType, Handle, Input, Op, ReduceOp, Runtime, Scalar, UnaryOp};
use std::time::Instant;

/// A workload's inputs and how to run one iteration of it.
pub struct Workload {
    pub name: &'static str,
    /// Elements (for elementwise) or rows x cols (for row workloads), as printed.
    pub size_label: String,
    /// Bytes an ideal single pass reads and writes (each input and output counted once).
    pub bytes: usize,
    inputs: Vec<Handle>,
    kind: Kind,
}

enum Kind {
    Chain10,
    Gelu,
    Softmax,
    LayerNorm,
    AdamW,
    Tiny,
}

fn t(h: Handle) -> Input {
    Input::Tensor(h)
}
fn f(v: f64) -> Input {
    Input::Scalar(Scalar::Float(v))
}

/// Deterministic pseudo-random f32 data in [-2, 2).
pub fn data(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0).to_le_bytes()
        })
        .collect()
}

/// One add on 8 elements, run to completion: on a fresh runtime it measures one compile.
pub fn single_add(rt: &Runtime) -> Handle {
    let x = input(rt, &[8], 1);
    let y = rt
        .op(0, Op::Binary(BinaryOp::Add), &[t(x), t(x)], None)
        .expect("op");
    rt.synchronize(0).expect("sync");
    y
}

fn input(rt: &Runtime, sizes: &[usize], seed: u64) -> Handle {
    let n = sizes.iter().product();
    rt.from_host(&data(n, seed), DType::F32, sizes)
        .expect("input")
}

impl Workload {
    pub fn chain10(rt: &Runtime, n: usize) -> Workload {
        let inputs = (0..3).map(|i| input(rt, &[n], i)).collect();
        Workload {
            name: "chain10",
            size_label: label(n),
            bytes: 4 * n * 4,
            inputs,
            kind: Kind::Chain10,
        }
    }

    pub fn gelu(rt: &Runtime, n: usize) -> Workload {
        Workload {
            name: "gelu",
            size_label: label(n),
            bytes: 2 * n * 4,
            inputs: vec![input(rt, &[n], 7)],
            kind: Kind::Gelu,
        }
    }

    pub fn softmax(rt: &Runtime, rows: usize, cols: usize) -> Workload {
        let inputs = vec![input(rt, &[rows, cols], 3)];
        Workload {
            name: "softmax",
            size_label: format!("{rows}x{cols}"),
            bytes: 2 * rows * cols * 4,
            inputs,
            kind: Kind::Softmax,
        }
    }

    pub fn layernorm(rt: &Runtime, rows: usize, cols: usize) -> Workload {
        let inputs = vec![
            input(rt, &[rows, cols], 4),
            input(rt, &[cols], 5),
            input(rt, &[cols], 6),
        ];
        Workload {
            name: "layernorm",
            size_label: format!("{rows}x{cols}"),
            bytes: 2 * rows * cols * 4,
            inputs,
            kind: Kind::LayerNorm,
        }
    }

    /// One AdamW step over 100 parameters of 2^8..2^17 elements (10 of each): p, g, m, v each.
    pub fn adamw(rt: &Runtime) -> Workload {
        let mut inputs = Vec::new();
        let mut elems = 0;
        for k in 8..18 {
            for j in 0..10 {
                let n = 1usize << k;
                elems += n;
                for part in 0..4 {
                    inputs.push(input(rt, &[n], (k * 100 + j * 4 + part) as u64));
                }
            }
        }
        // One pass reads p, g, m, v and writes p, m, v.
        Workload {
            name: "adamw",
            size_label: "100 params".into(),
            bytes: elems * 4 * 7,
            inputs,
            kind: Kind::AdamW,
        }
    }

    pub fn tiny(rt: &Runtime) -> Workload {
        Workload {
            name: "tiny",
            size_label: "1000 ops x 8".into(),
            bytes: 0,
            inputs: vec![input(rt, &[8], 9)],
            kind: Kind::Tiny,
        }
    }

    /// Records one iteration and returns its output handle (the caller reads or releases it).
    /// Intermediates are released as soon as they are consumed, as a PyTorch program would.
    pub fn record(&self, rt: &Runtime) -> Handle {
        let mut live: Vec<Handle> = Vec::new();
        let mut op = |o: Op, ins: &[Input]| {
            let h = rt.op(0, o, ins, None).expect("workload op");
            live.push(h);
            h
        };
        let bin = |b| Op::Binary(b);
        let un = |u| Op::Unary(u);
        let red = |r, keep| Op::Reduce {
            op: r,
            dims: [1usize].into_iter().collect(),
            keepdim: keep,
        };
        let out = match self.kind {
            Kind::Chain10 => {
                let (a, b, c) = (self.inputs[0], self.inputs[1], self.inputs[2]);
                // max(((a*b + c)*0.5 - a) / (abs(b) + 1), 0) * c + a*a
                let x = op(bin(BinaryOp::Mul), &[t(a), t(b)]);
                let x = op(bin(BinaryOp::Add), &[t(x), t(c)]);
                let x = op(bin(BinaryOp::Mul), &[t(x), f(0.5)]);
                let x = op(bin(BinaryOp::Sub), &[t(x), t(a)]);
                let y = op(un(UnaryOp::Abs), &[t(b)]);
                let y = op(bin(BinaryOp::Add), &[t(y), f(1.0)]);
                let x = op(bin(BinaryOp::Div), &[t(x), t(y)]);
                let x = op(bin(BinaryOp::Maximum), &[t(x), f(0.0)]);
                let x = op(bin(BinaryOp::Mul), &[t(x), t(c)]);
                let z = op(bin(BinaryOp::Mul), &[t(a), t(a)]);
                op(bin(BinaryOp::Add), &[t(x), t(z)])
            }
            Kind::Gelu => {
                let a = self.inputs[0];
                // 0.5*a*(1 + tanh(0.7978845608*(a + 0.044715*a^3)))
                let a3 = op(bin(BinaryOp::Mul), &[t(a), t(a)]);
                let a3 = op(bin(BinaryOp::Mul), &[t(a3), t(a)]);
                let x = op(bin(BinaryOp::Mul), &[t(a3), f(0.044715)]);
                let x = op(bin(BinaryOp::Add), &[t(a), t(x)]);
                let x = op(bin(BinaryOp::Mul), &[t(x), f(0.7978845608)]);
                let x = op(un(UnaryOp::Tanh), &[t(x)]);
                let x = op(bin(BinaryOp::Add), &[t(x), f(1.0)]);
                let h = op(bin(BinaryOp::Mul), &[t(a), f(0.5)]);
                op(bin(BinaryOp::Mul), &[t(h), t(x)])
            }
            Kind::Softmax => {
                let x = self.inputs[0];
                let m = op(red(ReduceOp::Amax, true), &[t(x)]);
                let e = op(bin(BinaryOp::Sub), &[t(x), t(m)]);
                let e = op(un(UnaryOp::Exp), &[t(e)]);
                let s = op(red(ReduceOp::Sum, true), &[t(e)]);
                op(bin(BinaryOp::Div), &[t(e), t(s)])
            }
            Kind::LayerNorm => {
                let (x, w, b) = (self.inputs[0], self.inputs[1], self.inputs[2]);
                let mu = op(red(ReduceOp::Mean, true), &[t(x)]);
                let d = op(bin(BinaryOp::Sub), &[t(x), t(mu)]);
                let d2 = op(bin(BinaryOp::Mul), &[t(d), t(d)]);
                let var = op(red(ReduceOp::Mean, true), &[t(d2)]);
                let v = op(bin(BinaryOp::Add), &[t(var), f(1e-5)]);
                let r = op(un(UnaryOp::Rsqrt), &[t(v)]);
                let y = op(bin(BinaryOp::Mul), &[t(d), t(r)]);
                let y = op(bin(BinaryOp::Mul), &[t(y), t(w)]);
                op(bin(BinaryOp::Add), &[t(y), t(b)])
            }
            Kind::AdamW => {
                let (lr, b1, b2, eps, wd) = (1e-3, 0.9, 0.999, 1e-8, 0.01);
                let inplace = |b, x: Input, y: Input, out: Handle| {
                    rt.op(0, Op::Binary(b), &[x, y], Some(out))
                        .expect("in-place op");
                };
                let mut last = 0;
                for q in self.inputs.chunks(4) {
                    let (p, g, m, v) = (q[0], q[1], q[2], q[3]);
                    inplace(BinaryOp::Mul, t(p), f(1.0 - lr * wd), p);
                    inplace(BinaryOp::Mul, t(m), f(b1), m);
                    let g1 = op(bin(BinaryOp::Mul), &[t(g), f(1.0 - b1)]);
                    inplace(BinaryOp::Add, t(m), t(g1), m);
                    inplace(BinaryOp::Mul, t(v), f(b2), v);
                    let g2 = op(bin(BinaryOp::Mul), &[t(g), t(g)]);
                    let g2 = op(bin(BinaryOp::Mul), &[t(g2), f(1.0 - b2)]);
                    inplace(BinaryOp::Add, t(v), t(g2), v);
                    let d = op(un(UnaryOp::Sqrt), &[t(v)]);
                    let d = op(bin(BinaryOp::Add), &[t(d), f(eps)]);
                    let u = op(bin(BinaryOp::Div), &[t(m), t(d)]);
                    let u = op(bin(BinaryOp::Mul), &[t(u), f(lr)]);
                    inplace(BinaryOp::Sub, t(p), t(u), p);
                    last = p;
                }
                rt.retain(last).expect("retain");
                last
            }
            Kind::Tiny => {
                let mut x = self.inputs[0];
                for _ in 0..1000 {
                    x = op(bin(BinaryOp::Add), &[t(x), f(1.0)]);
                }
                x
            }
        };
        for h in live {
            if h != out {
                rt.release(h).expect("release");
            }
        }
        out
    }

    /// One full iteration: record, run, wait for the output (a host read of one element would
    /// also work; synchronize avoids timing a copy).
    pub fn run(&self, rt: &Runtime) {
        let out = self.record(rt);
        let n: usize = rt.sizes(out).expect("sizes").iter().product();
        if n <= 8 {
            let mut buf = vec![0u8; n * 4];
            rt.to_host(out, &mut buf).expect("read");
        } else {
            rt.synchronize(0).expect("sync");
        }
        rt.release(out).expect("release");
    }
}

fn label(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{}M", n >> 20)
    } else {
        format!("{}K", n >> 10)
    }
}

/// The median of `v` (the upper one for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

impl Workload {
    /// Median milliseconds of one iteration over `reps`, after one warm-up (which compiles).
    pub fn median_ms(&self, rt: &Runtime, reps: usize) -> f64 {
        self.run(rt);
        median((0..reps).map(|_| self.time_ms(rt)).collect())
    }

    /// Milliseconds of one iteration.
    pub fn time_ms(&self, rt: &Runtime) -> f64 {
        let t = Instant::now();
        self.run(rt);
        t.elapsed().as_secs_f64() * 1e3
    }
}

/// Median milliseconds of `a` on `ra` and of `b` on `rb` over `reps` iterations each, run in
/// turn (a, b, a, b, ...) after one warm-up each, so that load from other processes hits both
/// alike and their ratio means something on a shared machine.
pub fn interleaved_ms(
    (a, ra): (&Workload, &Runtime),
    (b, rb): (&Workload, &Runtime),
    reps: usize,
) -> (f64, f64) {
    a.run(ra);
    b.run(rb);
    let (ta, tb): (Vec<f64>, Vec<f64>) = (0..reps).map(|_| (a.time_ms(ra), b.time_ms(rb))).unzip();
    (median(ta), median(tb))
}
