//! Packed steps (a `PackedSequence`: sentences of different lengths, longest first, step `t`
//! holding its first `batch_sizes[t]` samples): the forward against the dense walk of the same
//! samples bit for bit (each sample's steps where the dense walk computes them from the same
//! first states: from step 0, or walking in reverse, shifted to end at the last step), the
//! backward against central differences of each sample's float64 cell over its own steps; in
//! every mode; and batch sizes that describe no packing.

use super::*;

/// A packed case: the samples (lengths `lens`, longest first) as batch-1 cases over their own
/// steps, sharing `W_hh` and the hidden bias.
struct Packed {
    lens: Vec<usize>,
    h: usize,
    samples: Vec<Case>,
}

impl Packed {
    fn new(cell: Cell, lens: &[usize], h: usize, seed: u64, reverse: bool) -> Packed {
        let (t, b) = (lens[0], lens.len());
        let all = Case::new(cell, Dims { t, b, h }, seed, true, reverse);
        let g = all.gates();
        let samples = (0..b)
            .map(|s| Case {
                cell,
                d: Dims {
                    t: lens[s],
                    b: 1,
                    h,
                },
                xg: (0..lens[s])
                    .flat_map(|k| all.xg[(k * b + s) * g..][..g].iter().copied())
                    .collect(),
                w: all.w.clone(),
                h0: all.h0[s * h..][..h].to_vec(),
                c0: if all.lstm() {
                    all.c0[s * h..][..h].to_vec()
                } else {
                    vec![]
                },
                bias: all.bias.clone(),
                reverse,
                bf16: false,
            })
            .collect();
        Packed {
            lens: lens.to_vec(),
            h,
            samples,
        }
    }

    fn first(&self) -> &Case {
        &self.samples[0]
    }

    /// How many samples each step holds.
    fn batch_sizes(&self) -> Vec<usize> {
        (0..self.lens[0])
            .map(|t| self.lens.iter().filter(|&&l| l > t).count())
            .collect()
    }

    /// The row where step `t`'s samples begin.
    fn start(&self, t: usize) -> usize {
        self.batch_sizes()[..t].iter().sum()
    }

    fn rows(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Each sample's `width` floats a step (`of` gives a sample's, time-major), packed: step by
    /// step, the samples it holds.
    fn pack(&self, width: usize, of: impl Fn(usize) -> Vec<f64>) -> Vec<f64> {
        let per: Vec<Vec<f64>> = (0..self.lens.len()).map(of).collect();
        let mut out = vec![];
        for (t, &n) in self.batch_sizes().iter().enumerate() {
            for p in &per[..n] {
                out.extend_from_slice(&p[t * width..][..width]);
            }
        }
        out
    }

    /// The batch's first states (`c0` when `cell_state`), sample after sample.
    fn states(&self, cell_state: bool) -> Vec<f64> {
        let pick = |c: &Case| {
            if cell_state {
                c.c0.clone()
            } else {
                c.h0.clone()
            }
        };
        self.samples.iter().flat_map(pick).collect()
    }

    /// Records the packed forward; returns its result.
    fn record_forward(&self, rt: &Runtime) -> Handle {
        let c = self.first();
        let (b, h, g) = (self.lens.len(), self.h, c.gates());
        let xg = self.pack(g, |s| self.samples[s].xg.clone());
        let xg = tensor(rt, DType::F32, &[self.rows(), g], &xg);
        let (_, w_t) = weights(rt, c);
        let mut ins = vec![tt(xg), tt(w_t)];
        ins.push(tt(tensor(rt, DType::F32, &[b, h], &self.states(false))));
        if c.lstm() {
            ins.push(tt(tensor(rt, DType::F32, &[b, h], &self.states(true))));
        }
        ins.push(tt(tensor(rt, DType::F32, &[g], c.bias.as_ref().unwrap())));
        ins.push(tt(self.sizes_tensor(rt)));
        run(rt, recurrence(c.part(false), c.reverse), &ins)
    }

    fn sizes_tensor(&self, rt: &Runtime) -> Handle {
        let sizes: Vec<f64> = self.batch_sizes().iter().map(|&n| n as f64).collect();
        tensor(rt, DType::I64, &[sizes.len()], &sizes)
    }

    /// The same samples as one dense batch over the longest's steps, each sample's steps
    /// placed where the dense walk computes them from its first states: from step 0, or
    /// walking in reverse, ending at the last step. Returns the case and each sample's shift.
    fn dense(&self) -> (Case, Vec<usize>) {
        let c = self.first();
        let (t, b, g) = (self.lens[0], self.lens.len(), c.gates());
        let shift: Vec<usize> = self
            .lens
            .iter()
            .map(|&l| if c.reverse { t - l } else { 0 })
            .collect();
        let mut xg = vec![0.0; t * b * g];
        for (s, sample) in self.samples.iter().enumerate() {
            for k in 0..self.lens[s] {
                xg[((k + shift[s]) * b + s) * g..][..g].copy_from_slice(&sample.xg[k * g..][..g]);
            }
        }
        let dense = Case {
            cell: c.cell,
            d: Dims { t, b, h: self.h },
            xg,
            w: c.w.clone(),
            h0: self.states(false),
            c0: if c.lstm() { self.states(true) } else { vec![] },
            bias: c.bias.clone(),
            reverse: c.reverse,
            bf16: c.bf16,
        };
        (dense, shift)
    }
}

/// Checks the packed forward of `p` against the dense walk of the same samples, bit for bit.
fn check_forward_packed(p: &Packed) {
    let (dense, shift) = p.dense();
    let outs = run_in_every_mode(|rt| {
        vec![
            ("packed".into(), p.record_forward(rt)),
            ("dense".into(), record_forward(rt, &dense)),
        ]
    });
    let (got, want) = (&outs[0].1.data, &outs[1].1.data);
    let (row, b) = (dense.kept().0, p.lens.len());
    assert_eq!(got.len(), p.rows() * row);
    for (s, &len) in p.lens.iter().enumerate() {
        for t in 0..len {
            let g = &got[(p.start(t) + s) * row..][..row];
            let w = &want[((t + shift[s]) * b + s) * row..][..row];
            assert_eq!(g, w, "sample {s}, step {t}");
        }
    }
}

/// Lengths with a tie and a sample of one step.
const LENS: [usize; 4] = [5, 3, 3, 1];

#[test]
fn packed_forward_of_every_cell_equals_the_dense_walk_of_its_samples_bit_for_bit() {
    for cell in [Cell::Lstm, Cell::Gru, Cell::RnnTanh, Cell::RnnRelu] {
        check_forward_packed(&Packed::new(cell, &LENS, 11, 31, false));
    }
}

#[test]
fn a_packed_reverse_direction_starts_each_sample_at_its_own_last_step() {
    for cell in [Cell::Lstm, Cell::Gru, Cell::RnnTanh] {
        check_forward_packed(&Packed::new(cell, &LENS, 11, 33, true));
    }
}

/// Checks the packed backward of `p` against central differences of the samples' float64
/// cells over their own steps (the loss: each output's gradient, and the last states' at each
/// sample's own last step), as `check_backward` does for a dense batch.
fn check_backward_packed(p: &Packed, seed: u64) {
    let c = p.first();
    let (b, h, g_len) = (p.lens.len(), p.h, c.gates());
    let mut rng = Rng::new(seed);
    let grads: Vec<Grads> = p
        .lens
        .iter()
        .map(|&l| Grads {
            dy: f32s(&mut rng, l * h, 1.0),
            dh: f32s(&mut rng, h, 1.0),
            dc: f32s(&mut rng, h, 1.0),
        })
        .collect();
    let outs = run_in_every_mode(|rt| {
        let y = p.record_forward(rt);
        let (w, _) = weights(rt, c);
        let mut ins = vec![tt(y)];
        match c.cell {
            Cell::Lstm => ins.push(tt(tensor(rt, DType::F32, &[b, h], &p.states(true)))),
            Cell::Gru => ins.push(tt(tensor(rt, DType::F32, &[b, h], &p.states(false)))),
            Cell::RnnTanh | Cell::RnnRelu => {}
        }
        let dy = p.pack(h, |s| grads[s].dy.clone());
        let last = |f: &dyn Fn(&Grads) -> &Vec<f64>| -> Vec<f64> {
            grads.iter().flat_map(|g| f(g).clone()).collect()
        };
        ins.push(tt(w));
        ins.push(tt(tensor(rt, DType::F32, &[p.rows(), h], &dy)));
        ins.push(tt(tensor(rt, DType::F32, &[b, h], &last(&|g| &g.dh))));
        if c.lstm() {
            ins.push(tt(tensor(rt, DType::F32, &[b, h], &last(&|g| &g.dc))));
        }
        ins.push(tt(p.sizes_tensor(rt)));
        vec![(
            "r".into(),
            run(rt, recurrence(c.part(true), c.reverse), &ins),
        )]
    });
    let got = &outs[0].1.data;
    let out_row = if c.cell == Cell::Gru {
        2 * g_len
    } else {
        g_len
    };
    assert_eq!(got.len(), (p.rows() + b) * out_row);
    let eps = 1e-6;
    // The derivative of sample `s`'s loss by what `at` picks of its operands.
    let numeric = |s: usize, at: &dyn Fn(&mut Vars) -> &mut f64| {
        let sample = &p.samples[s];
        let mut v = sample.vars();
        *at(&mut v) += eps;
        let up = sample.loss(&v, &grads[s]);
        *at(&mut v) -= 2.0 * eps;
        let down = sample.loss(&v, &grads[s]);
        (up - down) / (2.0 * eps)
    };
    let close = |g: f64, w: f64, what: String| {
        assert!(
            (g - w).abs() <= 2e-5 * (1.0 + w.abs()),
            "{what} = {g}, want {w}"
        );
    };
    for (s, &len) in p.lens.iter().enumerate() {
        for t in 0..len {
            let row = &got[(p.start(t) + s) * out_row..][..out_row];
            for (r, &g) in row[..g_len].iter().enumerate() {
                let want = numeric(s, &|v: &mut Vars| &mut v.xg[t * g_len + r]);
                close(
                    g,
                    want,
                    format!("sample {s} step {t} input gate gradient {r}"),
                );
            }
        }
        let row = &got[(p.rows() + s) * out_row..][..out_row];
        for j in 0..h {
            let want = numeric(s, &|v: &mut Vars| &mut v.h0[j]);
            close(row[j], want, format!("dh0[{s}][{j}]"));
            if c.lstm() {
                let want = numeric(s, &|v: &mut Vars| &mut v.c0[j]);
                close(row[h + j], want, format!("dc0[{s}][{j}]"));
            }
        }
    }
    let hidden = if c.cell == Cell::Gru { g_len } else { 0 };
    for r in 0..g_len {
        let sum: f64 = got[..p.rows() * out_row]
            .chunks(out_row)
            .map(|row| row[hidden + r])
            .sum();
        let want: f64 = (0..b)
            .map(|s| numeric(s, &|v: &mut Vars| &mut v.bias.as_mut().unwrap()[r]))
            .sum();
        close(sum, want, format!("hidden gate gradients summed, gate {r}"));
    }
}

#[test]
fn packed_backward_of_every_cell_matches_central_differences_over_each_samples_steps() {
    check_backward_packed(&Packed::new(Cell::Lstm, &LENS, 3, 41, false), 42);
    check_backward_packed(&Packed::new(Cell::Gru, &LENS, 3, 43, false), 44);
    check_backward_packed(&Packed::new(Cell::RnnTanh, &LENS, 3, 45, false), 46);
}

#[test]
fn the_packed_backward_of_a_reverse_direction_ends_each_sample_at_its_first_step() {
    check_backward_packed(&Packed::new(Cell::Lstm, &LENS, 3, 51, true), 52);
    check_backward_packed(&Packed::new(Cell::Gru, &LENS, 3, 53, true), 54);
}

#[test]
fn batch_sizes_that_grow_fail_when_the_op_runs_saying_what_packs() {
    let rt = runtime(Mode::Debug);
    let xg = tensor(&rt, DType::F32, &[3, 2], &[0.5; 6]);
    let w = tensor(&rt, DType::F32, &[2, 2], &[0.1; 4]);
    let h0 = tensor(&rt, DType::F32, &[1, 2], &[0.0; 2]);
    let sizes = tensor(&rt, DType::I64, &[2], &[1.0, 2.0]);
    let op = recurrence(RecurrencePart::RnnTanhForward, false);
    let e = rt
        .op(0, op, &[tt(xg), tt(w), tt(h0), tt(sizes)], None)
        .and_then(|h| rt.synchronize(0).map(|_| h));
    match e {
        Err(Error::InvalidArgument(m)) => {
            assert!(m.contains("rnn_tanh_recurrence"), "{m}");
            assert!(
                m.contains("batch_sizes [1, 2]") && m.contains("non-increasing"),
                "{m}"
            );
        }
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}
