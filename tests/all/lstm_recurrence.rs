//! The LSTM recurrence kernel op (`KernelOp::Lstm`): its forward against a float64 cell
//! written out step by step, its backward against central differences of that cell (so the
//! gradient formulas are checked by nothing that shares them), both directions, with and
//! without the hidden bias, strided operands, in strict, debug and defer mode (which must agree
//! bit for bit); and its record-time errors.

use crate::harness;

use deferfuse::fusion::ir::{KernelOp, Lstm, LstmPart};
use deferfuse::{DType, Error, Handle, Mode, Op, Runtime, View};
use harness::*;

/// Sizes of one case: steps, batch, hidden.
#[derive(Clone, Copy)]
struct Dims {
    t: usize,
    b: usize,
    h: usize,
}

/// The operands of one case, as float64 values already rounded to float32.
struct Case {
    d: Dims,
    xg: Vec<f64>,
    /// `W_hh [4H, H]`, row-major.
    w: Vec<f64>,
    h0: Vec<f64>,
    c0: Vec<f64>,
    bias: Option<Vec<f64>>,
    reverse: bool,
}

fn f32s(rng: &mut Rng, n: usize, r: f64) -> Vec<f64> {
    (0..n).map(|_| rng.float(r, false) as f32 as f64).collect()
}

impl Case {
    fn new(d: Dims, seed: u64, bias: bool, reverse: bool) -> Case {
        let mut rng = Rng::new(seed);
        let g = 4 * d.h;
        Case {
            d,
            xg: f32s(&mut rng, d.t * d.b * g, 1.5),
            w: f32s(&mut rng, g * d.h, 0.6),
            h0: f32s(&mut rng, d.b * d.h, 1.0),
            c0: f32s(&mut rng, d.b * d.h, 1.0),
            bias: bias.then(|| f32s(&mut rng, g, 0.5)),
            reverse,
        }
    }

    /// The step order of the walk.
    fn order(&self) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.d.t).collect();
        if self.reverse {
            v.reverse();
        }
        v
    }

    /// The reference forward: per step `[i, f, g, o, c, h]` for every sample, `[T, B, 6H]`.
    fn forward(&self, xg: &[f64], h0: &[f64], c0: &[f64]) -> Vec<f64> {
        let Dims { t: tn, b: bn, h } = self.d;
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let mut y = vec![0.0; tn * bn * 6 * h];
        let (mut hs, mut cs) = (h0.to_vec(), c0.to_vec());
        for t in self.order() {
            for b in 0..bn {
                let mut gate = vec![0.0; 4 * h];
                for (r, v) in gate.iter_mut().enumerate() {
                    let dot: f64 = (0..h).map(|k| hs[b * h + k] * self.w[r * h + k]).sum();
                    let bias = self.bias.as_ref().map_or(0.0, |bv| bv[r]);
                    *v = dot + bias + xg[(t * bn + b) * 4 * h + r];
                }
                let out = &mut y[(t * bn + b) * 6 * h..][..6 * h];
                for j in 0..h {
                    let (i, f) = (sig(gate[j]), sig(gate[h + j]));
                    let (g, o) = (gate[2 * h + j].tanh(), sig(gate[3 * h + j]));
                    let c = f * cs[b * h + j] + i * g;
                    let hn = o * c.tanh();
                    for (k, v) in [i, f, g, o, c, hn].into_iter().enumerate() {
                        out[k * h + j] = v;
                    }
                }
            }
            for b in 0..bn {
                for j in 0..h {
                    cs[b * h + j] = y[(t * bn + b) * 6 * h + 4 * h + j];
                    hs[b * h + j] = y[(t * bn + b) * 6 * h + 5 * h + j];
                }
            }
        }
        y
    }

    /// `L = sum(dy * h_t) + sum(dh * h_last) + sum(dc * c_last)` of the reference forward.
    fn loss(&self, (xg, h0, c0): (&[f64], &[f64], &[f64]), grads: &Grads) -> f64 {
        let Dims { t: tn, b: bn, h } = self.d;
        let y = self.forward(xg, h0, c0);
        let last = *self.order().last().unwrap();
        let mut l = 0.0;
        for t in 0..tn {
            for b in 0..bn {
                for j in 0..h {
                    let at = (t * bn + b) * 6 * h;
                    l += grads.dy[(t * bn + b) * h + j] * y[at + 5 * h + j];
                    if t == last {
                        l += grads.dh[b * h + j] * y[at + 5 * h + j];
                        l += grads.dc[b * h + j] * y[at + 4 * h + j];
                    }
                }
            }
        }
        l
    }
}

/// The incoming gradients of a backward case.
struct Grads {
    dy: Vec<f64>,
    dh: Vec<f64>,
    dc: Vec<f64>,
}

fn lstm(part: LstmPart, reverse: bool) -> Op {
    Op::Kernel(KernelOp::Lstm(Lstm { part, reverse }))
}

/// `W_hh [4H, H]` uploaded, and as the forward takes it: transposed, a strided view.
fn weights(rt: &Runtime, c: &Case) -> (Handle, Handle) {
    let g = 4 * c.d.h;
    let w = tensor(rt, DType::F32, &[g, c.d.h], &c.w);
    (w, view(rt, w, View::Transpose(0, 1)))
}

/// Records the forward of `c`; returns its result.
fn record_forward(rt: &Runtime, c: &Case) -> Handle {
    let Dims { t, b, h } = c.d;
    let xg = tensor(rt, DType::F32, &[t, b, 4 * h], &c.xg);
    let (_, w_t) = weights(rt, c);
    let h0 = tensor(rt, DType::F32, &[b, h], &c.h0);
    let c0 = tensor(rt, DType::F32, &[b, h], &c.c0);
    let mut ins = vec![tt(xg), tt(w_t), tt(h0), tt(c0)];
    if let Some(bias) = &c.bias {
        ins.push(tt(tensor(rt, DType::F32, &[4 * h], bias)));
    }
    run(rt, lstm(LstmPart::Forward, c.reverse), &ins)
}

fn check_forward(c: &Case, tol: f64) {
    let outs = run_in_every_mode(|rt| vec![("y".into(), record_forward(rt, c))]);
    let want = c.forward(&c.xg, &c.h0, &c.c0);
    let got = &outs[0].1.data;
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= tol, "y[{k}] = {g}, want {w}");
    }
}

#[test]
fn the_forward_matches_a_float64_cell_step_by_step() {
    let d = Dims { t: 5, b: 3, h: 4 };
    check_forward(&Case::new(d, 1, true, false), 2e-6);
}

#[test]
fn the_forward_without_a_hidden_bias_adds_none() {
    let d = Dims { t: 4, b: 2, h: 3 };
    check_forward(&Case::new(d, 2, false, false), 2e-6);
}

#[test]
fn a_reverse_direction_starts_from_the_last_step() {
    let d = Dims { t: 6, b: 2, h: 5 };
    check_forward(&Case::new(d, 3, true, true), 2e-6);
}

#[test]
fn rows_longer_than_a_vector_take_the_vector_routines_whole() {
    // 40 hidden units: each gate a 16-lane body and a tail.
    let d = Dims { t: 3, b: 2, h: 40 };
    check_forward(&Case::new(d, 4, true, false), 4e-6);
}

/// Checks the backward of `c` against central differences of the reference's loss with
/// respect to each step's input product (whose gradient is the gate gradient before the
/// activations), `h0` and `c0`.
fn check_backward(c: &Case, seed: u64) {
    let Dims { t: tn, b: bn, h } = c.d;
    let mut rng = Rng::new(seed);
    let grads = Grads {
        dy: f32s(&mut rng, tn * bn * h, 1.0),
        dh: f32s(&mut rng, bn * h, 1.0),
        dc: f32s(&mut rng, bn * h, 1.0),
    };
    let outs = run_in_every_mode(|rt| {
        let y = record_forward(rt, c);
        let (w, _) = weights(rt, c);
        let c0 = tensor(rt, DType::F32, &[bn, h], &c.c0);
        let dy = tensor(rt, DType::F32, &[tn, bn, h], &grads.dy);
        let dh = tensor(rt, DType::F32, &[bn, h], &grads.dh);
        let dc = tensor(rt, DType::F32, &[bn, h], &grads.dc);
        let ins = [tt(y), tt(c0), tt(w), tt(dy), tt(dh), tt(dc)];
        vec![(
            "r".into(),
            run(rt, lstm(LstmPart::Backward, c.reverse), &ins),
        )]
    });
    let got = &outs[0].1.data;
    assert_eq!(got.len(), (tn + 1) * bn * 4 * h);
    let eps = 1e-6;
    let numeric = |which: usize, k: usize| {
        let mut v = [c.xg.clone(), c.h0.clone(), c.c0.clone()];
        v[which][k] += eps;
        let up = c.loss((&v[0], &v[1], &v[2]), &grads);
        v[which][k] -= 2.0 * eps;
        let down = c.loss((&v[0], &v[1], &v[2]), &grads);
        (up - down) / (2.0 * eps)
    };
    let close = |g: f64, w: f64, what: String| {
        assert!(
            (g - w).abs() <= 2e-5 * (1.0 + w.abs()),
            "{what} = {g}, want {w}"
        );
    };
    for (k, &g) in got[..tn * bn * 4 * h].iter().enumerate() {
        close(g, numeric(0, k), format!("gate gradient {k}"));
    }
    let last = tn * bn * 4 * h;
    for b in 0..bn {
        for j in 0..h {
            let row = last + b * 4 * h;
            close(
                got[row + j],
                numeric(1, b * h + j),
                format!("dh0[{b}][{j}]"),
            );
            close(
                got[row + h + j],
                numeric(2, b * h + j),
                format!("dc0[{b}][{j}]"),
            );
            for z in 2 * h..4 * h {
                assert_eq!(got[row + z], 0.0, "row T past the first states' gradients");
            }
        }
    }
}

#[test]
fn the_backward_matches_central_differences_of_the_cell() {
    check_backward(&Case::new(Dims { t: 4, b: 2, h: 3 }, 5, true, false), 6);
}

#[test]
fn the_backward_of_a_reverse_direction_walks_from_its_first_step() {
    check_backward(&Case::new(Dims { t: 5, b: 3, h: 2 }, 7, false, true), 8);
}

#[test]
fn a_hidden_weight_of_the_wrong_shape_fails_at_record_time() {
    let rt = runtime(Mode::Strict);
    let xg = tensor(&rt, DType::F32, &[2, 1, 8], &[0.5; 16]);
    let w = tensor(&rt, DType::F32, &[8, 2], &[0.1; 16]);
    let h0 = tensor(&rt, DType::F32, &[1, 2], &[0.0; 2]);
    let ins = [tt(xg), tt(w), tt(h0), tt(h0)];
    match rt.op(0, lstm(LstmPart::Forward, false), &ins, None) {
        Err(e @ Error::Op(_)) => {
            let m = e.to_string();
            assert!(m.contains("lstm_recurrence") && m.contains("w_hh_t"), "{m}");
            assert!(m.contains("[2, 8]"), "{m}");
        }
        other => panic!("expected a record-time error, got {other:?}"),
    }
}
