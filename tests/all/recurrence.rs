//! The recurrence kernel op (`KernelOp::Recurrence`), LSTM, GRU and plain RNN: its forward
//! against a float64 cell written out step by step, its backward against central differences
//! of that cell (so the gradient formulas are checked by nothing that shares them), both
//! directions, with and without the hidden bias, a strided weight, in strict, debug and defer
//! mode (which must agree bit for bit); and its record-time errors.

use crate::harness;

use deferfuse::fusion::ir::{Cell, KernelOp, Recurrence, RecurrencePart};
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
    cell: Cell,
    d: Dims,
    xg: Vec<f64>,
    /// `W_hh [G, H]`, row-major.
    w: Vec<f64>,
    h0: Vec<f64>,
    /// The LSTM's first cell state (empty for the GRU).
    c0: Vec<f64>,
    bias: Option<Vec<f64>>,
    reverse: bool,
    /// `W_hh` holds bfloat16 values and goes to the op as bfloat16: the steps' hidden products
    /// then read h rounded to bfloat16 (see `Case::bf16`).
    bf16: bool,
}

/// `x` rounded to bfloat16 (through f32, to nearest even).
fn round_bf16(x: f64) -> f64 {
    let b = (x as f32).to_bits();
    let r = (b.wrapping_add(0x7fff + ((b >> 16) & 1))) & 0xffff_0000;
    f32::from_bits(r) as f64
}

fn f32s(rng: &mut Rng, n: usize, r: f64) -> Vec<f64> {
    (0..n).map(|_| rng.float(r, false) as f32 as f64).collect()
}

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

impl Case {
    fn new(cell: Cell, d: Dims, seed: u64, bias: bool, reverse: bool) -> Case {
        let mut rng = Rng::new(seed);
        let lstm = cell == Cell::Lstm;
        let g = Case::gates_of(cell) * d.h;
        Case {
            cell,
            d,
            xg: f32s(&mut rng, d.t * d.b * g, 1.5),
            w: f32s(&mut rng, g * d.h, 0.6),
            h0: f32s(&mut rng, d.b * d.h, 1.0),
            c0: if lstm {
                f32s(&mut rng, d.b * d.h, 1.0)
            } else {
                vec![]
            },
            bias: bias.then(|| f32s(&mut rng, g, 0.5)),
            reverse,
            bf16: false,
        }
    }

    /// The case with its weight rounded to bfloat16 and given to the op as bfloat16 (a layer
    /// under bfloat16 autocast): the reference rounds each step's h to bfloat16 before the
    /// hidden product, as the op does.
    fn bf16(mut self) -> Case {
        self.w = self.w.iter().map(|&w| round_bf16(w)).collect();
        self.bf16 = true;
        self
    }

    fn gates_of(cell: Cell) -> usize {
        match cell {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::RnnTanh | Cell::RnnRelu => 1,
        }
    }

    fn gates(&self) -> usize {
        Case::gates_of(self.cell) * self.d.h
    }

    fn lstm(&self) -> bool {
        self.cell == Cell::Lstm
    }

    /// Floats per sample and step in the forward's result, and where `h` sits in them.
    fn kept(&self) -> (usize, usize) {
        let h = self.d.h;
        match self.cell {
            Cell::Lstm => (6 * h, 5 * h),
            Cell::Gru => (5 * h, 4 * h),
            Cell::RnnTanh | Cell::RnnRelu => (h, 0),
        }
    }

    fn part(&self, backward: bool) -> RecurrencePart {
        let forward = match self.cell {
            Cell::Lstm => RecurrencePart::LstmForward,
            Cell::Gru => RecurrencePart::GruForward,
            Cell::RnnTanh => RecurrencePart::RnnTanhForward,
            Cell::RnnRelu => RecurrencePart::RnnReluForward,
        };
        RecurrencePart::from_u32(forward as u32 + u32::from(backward)).unwrap()
    }

    /// The step order of the walk.
    fn order(&self) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.d.t).collect();
        if self.reverse {
            v.reverse();
        }
        v
    }

    /// The reference forward over operands `v` (xg, h0, c0, bias): per step and sample the
    /// LSTM's `[i, f, g, o, c, h]`, the GRU's `[r, z, n, hn, h]` or the plain RNN's `h`.
    fn forward(&self, v: &Vars) -> Vec<f64> {
        let Dims { t: tn, b: bn, h } = self.d;
        let (g_len, (row, h_at)) = (self.gates(), self.kept());
        let mut y = vec![0.0; tn * bn * row];
        let (mut hs, mut cs) = (v.h0.clone(), v.c0.clone());
        for t in self.order() {
            for b in 0..bn {
                let hidden: Vec<f64> = (0..g_len)
                    .map(|r| {
                        let h_of = |k: usize| {
                            let v = hs[b * h + k];
                            if self.bf16 {
                                round_bf16(v)
                            } else {
                                v
                            }
                        };
                        let dot: f64 = (0..h).map(|k| h_of(k) * self.w[r * h + k]).sum();
                        dot + v.bias.as_ref().map_or(0.0, |bv| bv[r])
                    })
                    .collect();
                let x = &v.xg[(t * bn + b) * g_len..][..g_len];
                let out = &mut y[(t * bn + b) * row..][..row];
                for j in 0..h {
                    let gate = |k: usize| hidden[k * h + j] + x[k * h + j];
                    let vals = match self.cell {
                        Cell::Lstm => {
                            let (i, f) = (sig(gate(0)), sig(gate(1)));
                            let (g, o) = (gate(2).tanh(), sig(gate(3)));
                            let c = f * cs[b * h + j] + i * g;
                            vec![i, f, g, o, c, o * c.tanh()]
                        }
                        Cell::Gru => {
                            let r = sig(gate(0));
                            let z = sig(gate(1));
                            let hn = hidden[2 * h + j];
                            let n = (x[2 * h + j] + hn * r).tanh();
                            vec![r, z, n, hn, (hs[b * h + j] - n) * z + n]
                        }
                        Cell::RnnTanh => vec![gate(0).tanh()],
                        Cell::RnnRelu => vec![gate(0).max(0.0)],
                    };
                    for (k, val) in vals.into_iter().enumerate() {
                        out[k * h + j] = val;
                    }
                }
            }
            for b in 0..bn {
                for j in 0..h {
                    let at = (t * bn + b) * row;
                    hs[b * h + j] = y[at + h_at + j];
                    if self.lstm() {
                        cs[b * h + j] = y[at + 4 * h + j];
                    }
                }
            }
        }
        y
    }

    /// `L = sum(dy * h_t) + sum(dh * h_last) (+ sum(dc * c_last))` of the reference forward.
    fn loss(&self, v: &Vars, grads: &Grads) -> f64 {
        let Dims { t: tn, b: bn, h } = self.d;
        let (row, h_at) = self.kept();
        let y = self.forward(v);
        let last = *self.order().last().unwrap();
        let mut l = 0.0;
        for t in 0..tn {
            for b in 0..bn {
                for j in 0..h {
                    let at = (t * bn + b) * row;
                    l += grads.dy[(t * bn + b) * h + j] * y[at + h_at + j];
                    if t == last {
                        l += grads.dh[b * h + j] * y[at + h_at + j];
                        if self.lstm() {
                            l += grads.dc[b * h + j] * y[at + 4 * h + j];
                        }
                    }
                }
            }
        }
        l
    }

    fn vars(&self) -> Vars {
        Vars {
            xg: self.xg.clone(),
            h0: self.h0.clone(),
            c0: self.c0.clone(),
            bias: self.bias.clone(),
        }
    }
}

/// What the finite differences move.
#[derive(Clone)]
struct Vars {
    xg: Vec<f64>,
    h0: Vec<f64>,
    c0: Vec<f64>,
    bias: Option<Vec<f64>>,
}

/// The incoming gradients of a backward case.
struct Grads {
    dy: Vec<f64>,
    dh: Vec<f64>,
    dc: Vec<f64>,
}

fn recurrence(part: RecurrencePart, reverse: bool) -> Op {
    Op::Kernel(KernelOp::Recurrence(Recurrence { part, reverse }))
}

/// `W_hh [G, H]` uploaded, and as the forward takes it: transposed, a strided view.
fn weights(rt: &Runtime, c: &Case) -> (Handle, Handle) {
    let dtype = if c.bf16 { DType::BF16 } else { DType::F32 };
    let w = tensor(rt, dtype, &[c.gates(), c.d.h], &c.w);
    (w, view(rt, w, View::Transpose(0, 1)))
}

/// Records the forward of `c`; returns its result.
fn record_forward(rt: &Runtime, c: &Case) -> Handle {
    let Dims { t, b, h } = c.d;
    let xg = tensor(rt, DType::F32, &[t, b, c.gates()], &c.xg);
    let (_, w_t) = weights(rt, c);
    let h0 = tensor(rt, DType::F32, &[b, h], &c.h0);
    let mut ins = vec![tt(xg), tt(w_t), tt(h0)];
    if c.lstm() {
        ins.push(tt(tensor(rt, DType::F32, &[b, h], &c.c0)));
    }
    if let Some(bias) = &c.bias {
        ins.push(tt(tensor(rt, DType::F32, &[c.gates()], bias)));
    }
    run(rt, recurrence(c.part(false), c.reverse), &ins)
}

fn check_forward(c: &Case, tol: f64) {
    let outs = run_in_every_mode(|rt| vec![("y".into(), record_forward(rt, c))]);
    let want = c.forward(&c.vars());
    let got = &outs[0].1.data;
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= tol, "y[{k}] = {g}, want {w}");
    }
}

fn lstm(d: Dims, seed: u64, bias: bool, reverse: bool) -> Case {
    Case::new(Cell::Lstm, d, seed, bias, reverse)
}

fn gru(d: Dims, seed: u64, bias: bool, reverse: bool) -> Case {
    Case::new(Cell::Gru, d, seed, bias, reverse)
}

fn rnn(relu: bool, d: Dims, seed: u64, bias: bool, reverse: bool) -> Case {
    let cell = if relu { Cell::RnnRelu } else { Cell::RnnTanh };
    Case::new(cell, d, seed, bias, reverse)
}

#[test]
fn the_lstm_forward_matches_a_float64_cell_step_by_step() {
    check_forward(&lstm(Dims { t: 5, b: 3, h: 4 }, 1, true, false), 2e-6);
}

#[test]
fn the_gru_forward_matches_a_float64_cell_step_by_step() {
    check_forward(&gru(Dims { t: 5, b: 3, h: 4 }, 11, true, false), 2e-6);
}

#[test]
fn the_plain_rnn_forward_matches_a_float64_cell_with_either_activation() {
    let d = Dims { t: 5, b: 3, h: 4 };
    check_forward(&rnn(false, d, 21, true, false), 2e-6);
    check_forward(&rnn(true, d, 22, true, true), 2e-6);
}

#[test]
fn a_forward_without_a_hidden_bias_adds_none() {
    let d = Dims { t: 4, b: 2, h: 3 };
    check_forward(&lstm(d, 2, false, false), 2e-6);
    check_forward(&gru(d, 12, false, false), 2e-6);
}

#[test]
fn a_reverse_direction_starts_from_the_last_step() {
    let d = Dims { t: 6, b: 2, h: 5 };
    check_forward(&lstm(d, 3, true, true), 2e-6);
    check_forward(&gru(d, 13, true, true), 2e-6);
}

#[test]
fn rows_longer_than_a_vector_take_the_vector_routines_whole() {
    // 40 hidden units: each gate a 16-lane body and a tail.
    let d = Dims { t: 3, b: 2, h: 40 };
    check_forward(&lstm(d, 4, true, false), 4e-6);
    check_forward(&gru(d, 14, true, false), 4e-6);
}

/// Checks the backward of `c` against central differences of the reference's loss with
/// respect to each step's input product (whose gradient is the gate gradient before the
/// activations), the first states, and (summed over steps and samples: the hidden product's
/// gate gradients) the hidden bias.
fn check_backward(c: &Case, seed: u64) {
    check_backward_within(c, seed, 2e-5)
}

/// [`check_backward`] within `tol` (relative, plus as much absolute).
fn check_backward_within(c: &Case, seed: u64, tol: f64) {
    let Dims { t: tn, b: bn, h } = c.d;
    let g_len = c.gates();
    let mut rng = Rng::new(seed);
    let grads = Grads {
        dy: f32s(&mut rng, tn * bn * h, 1.0),
        dh: f32s(&mut rng, bn * h, 1.0),
        dc: f32s(&mut rng, bn * h, 1.0),
    };
    let outs = run_in_every_mode(|rt| {
        let y = record_forward(rt, c);
        let (w, _) = weights(rt, c);
        let mut ins = vec![tt(y)];
        match c.cell {
            Cell::Lstm => ins.push(tt(tensor(rt, DType::F32, &[bn, h], &c.c0))),
            Cell::Gru => ins.push(tt(tensor(rt, DType::F32, &[bn, h], &c.h0))),
            Cell::RnnTanh | Cell::RnnRelu => {}
        }
        let dy = tensor(rt, DType::F32, &[tn, bn, h], &grads.dy);
        let dh = tensor(rt, DType::F32, &[bn, h], &grads.dh);
        ins.extend([tt(w), tt(dy), tt(dh)]);
        if c.lstm() {
            ins.push(tt(tensor(rt, DType::F32, &[bn, h], &grads.dc)));
        }
        vec![(
            "r".into(),
            run(rt, recurrence(c.part(true), c.reverse), &ins),
        )]
    });
    let got = &outs[0].1.data;
    // Per step and sample: the input product's gate gradients, then (GRU) the hidden's.
    let out_row = if c.cell == Cell::Gru {
        2 * g_len
    } else {
        g_len
    };
    assert_eq!(got.len(), (tn + 1) * bn * out_row);
    let eps = 1e-6;
    // Differences of the cell without the bf16 rounding of h, a step function that has no
    // useful derivative (the op's backward passes gradients straight through it).
    let smooth = Case {
        cell: c.cell,
        d: c.d,
        xg: c.xg.clone(),
        w: c.w.clone(),
        h0: c.h0.clone(),
        c0: c.c0.clone(),
        bias: c.bias.clone(),
        reverse: c.reverse,
        bf16: false,
    };
    let numeric = |at: &dyn Fn(&mut Vars) -> &mut f64| {
        let mut v = smooth.vars();
        *at(&mut v) += eps;
        let up = smooth.loss(&v, &grads);
        *at(&mut v) -= 2.0 * eps;
        let down = smooth.loss(&v, &grads);
        (up - down) / (2.0 * eps)
    };
    let close = |g: f64, w: f64, what: String| {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what} = {g}, want {w}"
        );
    };
    for (k, got_row) in got[..tn * bn * out_row].chunks(out_row).enumerate() {
        for (r, &g) in got_row[..g_len].iter().enumerate() {
            let want = numeric(&|v: &mut Vars| &mut v.xg[k * g_len + r]);
            close(g, want, format!("input gate gradient {k}.{r}"));
        }
    }
    if c.bias.is_some() {
        let hidden = if c.cell == Cell::Gru { g_len } else { 0 };
        for r in 0..g_len {
            let sum: f64 = got[..tn * bn * out_row]
                .chunks(out_row)
                .map(|row| row[hidden + r])
                .sum();
            let want = numeric(&|v: &mut Vars| &mut v.bias.as_mut().unwrap()[r]);
            close(sum, want, format!("hidden gate gradients summed, gate {r}"));
        }
    }
    let last = &got[tn * bn * out_row..];
    for b in 0..bn {
        let row = &last[b * out_row..][..out_row];
        for j in 0..h {
            let want = numeric(&|v: &mut Vars| &mut v.h0[b * h + j]);
            close(row[j], want, format!("dh0[{b}][{j}]"));
            if c.lstm() {
                let want = numeric(&|v: &mut Vars| &mut v.c0[b * h + j]);
                close(row[h + j], want, format!("dc0[{b}][{j}]"));
            }
        }
        let zeros = if c.lstm() { 2 * h } else { h };
        assert!(
            row[zeros..].iter().all(|&z| z == 0.0),
            "row T past the states"
        );
    }
}

#[test]
fn the_lstm_backward_matches_central_differences_of_the_cell() {
    check_backward(&lstm(Dims { t: 4, b: 2, h: 3 }, 5, true, false), 6);
}

#[test]
fn the_gru_backward_matches_central_differences_of_the_cell() {
    check_backward(&gru(Dims { t: 4, b: 2, h: 3 }, 15, true, false), 16);
}

/// 11 hidden units: the backward's per-unit arithmetic takes them as one whole group of 8 lanes
/// (copied at a constant length) and a tail of 3 (copied at a variable one).
#[test]
fn the_lstm_backward_matches_central_differences_over_a_whole_lane_group_and_a_tail() {
    check_backward(&lstm(Dims { t: 3, b: 2, h: 11 }, 7, true, false), 8);
}

#[test]
fn the_gru_backward_matches_central_differences_over_a_whole_lane_group_and_a_tail() {
    check_backward(&gru(Dims { t: 3, b: 2, h: 11 }, 17, true, false), 18);
}

#[test]
fn the_plain_rnn_backward_matches_central_differences_of_the_cell() {
    // relu's kink: the reference's differences are taken 1e-6 away from every pre-activation
    // (with these values none lies that close to 0).
    let d = Dims { t: 4, b: 2, h: 3 };
    check_backward(&rnn(false, d, 23, true, false), 24);
    check_backward(&rnn(true, d, 25, true, true), 26);
}

#[test]
fn the_backward_of_a_reverse_direction_walks_from_its_first_step() {
    let d = Dims { t: 5, b: 3, h: 2 };
    check_backward(&lstm(d, 7, false, true), 8);
    check_backward(&gru(d, 17, true, true), 18);
}

#[test]
fn a_bfloat16_weight_makes_the_forwards_hidden_products_read_h_rounded_to_bfloat16() {
    // 40 hidden units and 5 samples: the bf16 kernel's whole and short tiles.
    let d = Dims { t: 4, b: 5, h: 40 };
    check_forward(&lstm(d, 31, true, false).bf16(), 2e-5);
    check_forward(&gru(d, 32, true, true).bf16(), 2e-5);
    check_forward(&rnn(false, d, 33, true, false).bf16(), 2e-5);
}

#[test]
fn a_bfloat16_weights_backward_matches_central_differences_within_the_rounding() {
    // The walk's dh products read the gate gradients rounded to bfloat16 (~2^-9 of each), which
    // the float64 reference does not: within 1% of its gradients.
    let d = Dims { t: 4, b: 2, h: 3 };
    check_backward_within(&lstm(d, 35, true, false).bf16(), 36, 1e-2);
    check_backward_within(&gru(d, 37, true, true).bf16(), 38, 1e-2);
    check_backward_within(&rnn(true, d, 39, true, false).bf16(), 40, 1e-2);
}

#[test]
fn a_hidden_weight_of_the_wrong_shape_fails_at_record_time() {
    let rt = runtime(Mode::Strict);
    let xg = tensor(&rt, DType::F32, &[2, 1, 6], &[0.5; 12]);
    let w = tensor(&rt, DType::F32, &[6, 2], &[0.1; 12]);
    let h0 = tensor(&rt, DType::F32, &[1, 2], &[0.0; 2]);
    let ins = [tt(xg), tt(w), tt(h0)];
    match rt.op(0, recurrence(RecurrencePart::GruForward, false), &ins, None) {
        Err(e @ Error::Op(_)) => {
            let m = e.to_string();
            assert!(m.contains("gru_recurrence") && m.contains("w_hh_t"), "{m}");
            assert!(m.contains("[2, 6]"), "{m}");
        }
        other => panic!("expected a record-time error, got {other:?}"),
    }
}

mod packed;
