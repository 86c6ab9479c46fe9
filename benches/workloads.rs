//! The benchmark workloads of shared/notes/workloads.md, written against the runtime's Rust API
//! so the bench binary and the criterion benches run the very same op sequences.

use deferfuse::{BinaryOp, DType, Handle, Input, Op, ReduceOp, Runtime, Scalar, UnaryOp, View};
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
    /// A training step on this batch size.
    Mlp {
        batch: usize,
    },
    Tiny,
}

/// The mlp workload's layer widths (input, hidden, hidden, classes) and batch.
const MLP_WIDTHS: [usize; 4] = [784, 1024, 1024, 10];
const MLP_BATCH: usize = 64;

/// AdamW's hyperparameters (workloads.md): lr, beta1, beta2, eps, weight decay.
const ADAMW: (f64, f64, f64, f64, f64) = (1e-3, 0.9, 0.999, 1e-8, 0.01);

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
    scaled_input(rt, sizes, seed, 1.0)
}

/// An input of `data` times `scale` (weights small enough that activations stay finite).
fn scaled_input(rt: &Runtime, sizes: &[usize], seed: u64, scale: f32) -> Handle {
    let n = sizes.iter().product();
    let bytes: Vec<u8> = data(n, seed)
        .chunks(4)
        .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * scale).to_le_bytes())
        .collect();
    rt.from_host(&bytes, DType::F32, sizes).expect("input")
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

    /// One training step of a 784-1024-1024-10 MLP on a batch of 64: forward, softmax
    /// cross-entropy, backward (as PyTorch's autograd records it: weights are [out, in] and
    /// used transposed), and AdamW on the six parameters. Inputs: x, the one-hot targets, then
    /// (weight, bias) per layer, then their AdamW (m, v) per parameter.
    pub fn mlp(rt: &Runtime) -> Workload {
        Workload::mlp_sized(rt, MLP_WIDTHS, MLP_BATCH)
    }

    /// [`Workload::mlp`] with other layer widths (input, hidden, hidden, classes) and batch.
    pub fn mlp_sized(rt: &Runtime, widths: [usize; 4], batch: usize) -> Workload {
        let [d0, d1, d2, d3] = widths;
        let mut inputs = vec![input(rt, &[batch, d0], 11)];
        let hot: Vec<u8> = (0..batch * d3)
            .flat_map(|i| (((i / d3) * 7 % d3 == i % d3) as u8 as f32).to_le_bytes())
            .collect();
        inputs.push(
            rt.from_host(&hot, DType::F32, &[batch, d3])
                .expect("targets"),
        );
        let shapes = [[d1, d0], [d2, d1], [d3, d2]];
        let mut state = Vec::new();
        for (l, &[o, i]) in shapes.iter().enumerate() {
            let scale = 1.0 / (i as f32).sqrt();
            inputs.push(scaled_input(rt, &[o, i], 20 + l as u64, scale));
            inputs.push(scaled_input(rt, &[o], 30 + l as u64, scale));
            for (k, sizes) in [vec![o, i], vec![o]].into_iter().enumerate() {
                for part in 0..2 {
                    // m and v start small and non-negative (v feeds a square root).
                    state.push(scaled_input(
                        rt,
                        &sizes,
                        40 + (l * 4 + k * 2 + part) as u64,
                        1e-3,
                    ));
                }
            }
        }
        for h in &state {
            let v = rt
                .op(0, Op::Unary(UnaryOp::Abs), &[t(*h)], Some(*h))
                .expect("abs");
            debug_assert_eq!(v, *h);
        }
        inputs.extend(state);
        Workload {
            name: "mlp",
            size_label: "batch 64".into(),
            bytes: 0,
            inputs,
            kind: Kind::Mlp { batch },
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

    /// The workload's input tensors (the mlp's: x, targets, parameters, optimizer state).
    pub fn inputs(&self) -> &[Handle] {
        &self.inputs
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
                let mut last = 0;
                for q in self.inputs.chunks(4) {
                    adamw_update(rt, &mut op, [q[0], q[1], q[2], q[3]]);
                    last = q[0];
                }
                rt.retain(last).expect("retain");
                last
            }
            Kind::Mlp { batch } => self.mlp_step(rt, batch, &mut op),
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

    /// One full iteration: record, run, wait for the output (a small output is read, as a
    /// loop reading its loss would; a host read of one element would also do for the large
    /// ones, but synchronize avoids timing a copy), then for everything else the iteration
    /// recorded (mlp's optimizer step comes after its loss): work left running would be timed
    /// as part of whatever runs next.
    pub fn run(&self, rt: &Runtime) {
        let out = self.record(rt);
        let n: usize = rt.sizes(out).expect("sizes").iter().product();
        if n <= 8 {
            let mut buf = vec![0u8; n * 4];
            rt.to_host(out, &mut buf).expect("read");
        }
        rt.synchronize(0).expect("sync");
        rt.release(out).expect("release");
    }
}

/// One AdamW update of parameter `p` with gradient `g` and state `m`, `v`, in place, as
/// `torch.optim.AdamW` records it (without bias correction); `op` records a new tensor.
fn adamw_update(
    rt: &Runtime,
    op: &mut impl FnMut(Op, &[Input]) -> Handle,
    [p, g, m, v]: [Handle; 4],
) {
    let (lr, b1, b2, eps, wd) = ADAMW;
    let inplace = |b, x: Input, y: Input, out: Handle| {
        rt.op(0, Op::Binary(b), &[x, y], Some(out))
            .expect("in-place op");
    };
    let bin = Op::Binary;
    inplace(BinaryOp::Mul, t(p), f(1.0 - lr * wd), p);
    inplace(BinaryOp::Mul, t(m), f(b1), m);
    let g1 = op(bin(BinaryOp::Mul), &[t(g), f(1.0 - b1)]);
    inplace(BinaryOp::Add, t(m), t(g1), m);
    inplace(BinaryOp::Mul, t(v), f(b2), v);
    let g2 = op(bin(BinaryOp::Mul), &[t(g), t(g)]);
    let g2 = op(bin(BinaryOp::Mul), &[t(g2), f(1.0 - b2)]);
    inplace(BinaryOp::Add, t(v), t(g2), v);
    let d = op(Op::Unary(UnaryOp::Sqrt), &[t(v)]);
    let d = op(bin(BinaryOp::Add), &[t(d), f(eps)]);
    let u = op(bin(BinaryOp::Div), &[t(m), t(d)]);
    let u = op(bin(BinaryOp::Mul), &[t(u), f(lr)]);
    inplace(BinaryOp::Sub, t(p), t(u), p);
}

impl Workload {
    /// The mlp workload's step (see [`Workload::mlp`]); returns the loss, a 0-d tensor.
    fn mlp_step(
        &self,
        rt: &Runtime,
        batch: usize,
        op: &mut impl FnMut(Op, &[Input]) -> Handle,
    ) -> Handle {
        let bin = Op::Binary;
        let red = |r, dim: usize, keepdim| Op::Reduce {
            op: r,
            dims: [dim].into_iter().collect(),
            keepdim,
        };
        let (x, hot) = (self.inputs[0], self.inputs[1]);
        let params = &self.inputs[2..8];
        let state = &self.inputs[8..];
        // Views are handles too: released with the step's other intermediates.
        let mut views = Vec::new();
        let mut transposed = |h: Handle| {
            let v = rt.view(0, h, &View::Transpose(0, 1)).expect("transpose");
            views.push(v);
            v
        };
        // Forward: z = a @ W.t() + b, relu between layers.
        let mut acts = vec![x]; // the input of each layer
        let mut pre = Vec::new(); // each hidden layer's z, for relu's backward
        let mut a = x;
        for l in 0..3 {
            let (w, b) = (params[2 * l], params[2 * l + 1]);
            let wt = transposed(w);
            let z = op(Op::Matmul, &[t(a), t(wt)]);
            let z = op(bin(BinaryOp::Add), &[t(z), t(b)]);
            if l < 2 {
                pre.push(z);
                a = op(Op::Unary(UnaryOp::Relu), &[t(z)]);
                acts.push(a);
            } else {
                a = z;
            }
        }
        // Softmax cross-entropy, mean over the batch.
        let m = op(red(ReduceOp::Amax, 1, true), &[t(a)]);
        let s = op(bin(BinaryOp::Sub), &[t(a), t(m)]);
        let e = op(Op::Unary(UnaryOp::Exp), &[t(s)]);
        let se = op(red(ReduceOp::Sum, 1, true), &[t(e)]);
        let lse = op(Op::Unary(UnaryOp::Log), &[t(se)]);
        let logp = op(bin(BinaryOp::Sub), &[t(s), t(lse)]);
        let picked = op(bin(BinaryOp::Mul), &[t(logp), t(hot)]);
        let total = op(
            Op::Reduce {
                op: ReduceOp::Sum,
                dims: [0usize, 1].into_iter().collect(),
                keepdim: false,
            },
            &[t(picked)],
        );
        let loss = op(bin(BinaryOp::Mul), &[t(total), f(-1.0 / batch as f64)]);
        // Backward: d logits = (softmax - onehot) / batch.
        let p = op(bin(BinaryOp::Div), &[t(e), t(se)]);
        let dz = op(bin(BinaryOp::Sub), &[t(p), t(hot)]);
        let mut dz = op(bin(BinaryOp::Mul), &[t(dz), f(1.0 / batch as f64)]);
        let mut grads = [0; 6];
        for l in (0..3).rev() {
            let dzt = transposed(dz);
            grads[2 * l] = op(Op::Matmul, &[t(dzt), t(acts[l])]);
            grads[2 * l + 1] = op(red(ReduceOp::Sum, 0, false), &[t(dz)]);
            if l > 0 {
                let dh = op(Op::Matmul, &[t(dz), t(params[2 * l])]);
                let on = op(bin(BinaryOp::Gt), &[t(pre[l - 1]), f(0.0)]);
                dz = op(Op::Where, &[t(on), t(dh), f(0.0)]);
            }
        }
        for (k, &g) in grads.iter().enumerate() {
            adamw_update(rt, op, [params[k], g, state[2 * k], state[2 * k + 1]]);
        }
        for v in views {
            rt.release(v).expect("release view");
        }
        loss
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
