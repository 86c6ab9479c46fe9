//! The CTC loss kernel op (`KernelOp::Ctc`): its loss and gradient against a reference that
//! enumerates every alignment (every path of labels over the input steps, collapsed), in
//! strict, debug and defer mode (which must agree bit for bit); empty targets, repeated labels,
//! inputs shorter than T and targets no alignment fits; and its record-time errors.

use crate::harness;

use deferfuse::fusion::ir::{Ctc, CtcPart, KernelOp};
use deferfuse::{DType, Error, Handle, Input, Mode, Op, Runtime};
use harness::*;
use reference_paths::*;

/// The reference: probabilities of all label paths, summed by what they collapse to.
mod reference_paths {
    /// A sample: its input length and target labels.
    pub struct Sample {
        pub input: usize,
        pub target: Vec<usize>,
    }

    /// Whether `path` collapses (repeats merged, then blanks dropped) to `target`.
    fn collapses_to(path: &[usize], blank: usize, target: &[usize]) -> bool {
        let mut out = vec![];
        let mut prev = None;
        for &p in path {
            if Some(p) != prev && p != blank {
                out.push(p);
            }
            prev = Some(p);
        }
        out == target
    }

    /// Every path of `len` labels below `c`.
    fn paths(len: usize, c: usize) -> Vec<Vec<usize>> {
        (0..c.pow(len as u32))
            .map(|mut k| {
                (0..len)
                    .map(|_| {
                        let d = k % c;
                        k /= c;
                        d
                    })
                    .collect()
            })
            .collect()
    }

    /// `(loss, grad)` of sample `b` over log-probabilities `lp[t][b][c]` (dims `t_max, n, c`):
    /// the loss is `-log p` with `p` the summed probability of the paths that collapse to the
    /// target, and the gradient PyTorch's with respect to log_probs:
    /// `exp(lp[t, c]) - P(path has c at t | target)` for `t` below the input length, else 0.
    pub fn loss_and_grad(
        lp: &[f64],
        (t_max, n, c): (usize, usize, usize),
        b: usize,
        s: &Sample,
        blank: usize,
    ) -> (f64, Vec<f64>) {
        let at = |t: usize, ch: usize| lp[(t * n + b) * c + ch];
        let mut p = 0.0;
        let mut occupancy = vec![0.0; t_max * c];
        for path in paths(s.input, c) {
            if !collapses_to(&path, blank, &s.target) {
                continue;
            }
            let q: f64 = path
                .iter()
                .enumerate()
                .map(|(t, &ch)| at(t, ch))
                .sum::<f64>()
                .exp();
            p += q;
            for (t, &ch) in path.iter().enumerate() {
                occupancy[t * c + ch] += q;
            }
        }
        let mut grad = vec![0.0; t_max * c];
        for t in 0..s.input {
            for ch in 0..c {
                grad[t * c + ch] = at(t, ch).exp() - occupancy[t * c + ch] / p;
            }
        }
        (-p.ln(), grad)
    }
}

fn ctc(part: CtcPart, max_target: usize) -> Op {
    Op::Kernel(KernelOp::Ctc(Ctc {
        part,
        blank: 0,
        max_target,
    }))
}

/// Log-softmax rows of random values: `[t_max, n, c]`.
fn log_probs(rng: &mut Rng, (t_max, n, c): (usize, usize, usize)) -> Vec<f64> {
    let mut v = vec![0.0; t_max * n * c];
    for row in v.chunks_mut(c) {
        for x in row.iter_mut() {
            *x = rng.float(2.0, false);
        }
        let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
        for x in row.iter_mut() {
            *x -= lse;
        }
    }
    v
}

/// Records the three parts for `samples` and returns (loss, grad) handles; `grad_out` is each
/// sample's incoming gradient.
fn record(
    rt: &Runtime,
    dtype: DType,
    lp: &[f64],
    dims: (usize, usize, usize),
    samples: &[Sample],
    grad_out: &[f64],
) -> (Handle, Handle) {
    let (t_max, n, c) = dims;
    let mut targets = vec![];
    let mut lengths = vec![];
    for s in samples {
        lengths.extend([s.input as f64, s.target.len() as f64, targets.len() as f64]);
        targets.extend(s.target.iter().map(|&l| l as f64));
    }
    let max_target = samples.iter().map(|s| s.target.len()).max().unwrap_or(0);
    let hlp = tensor(rt, dtype, &[t_max, n, c], &round(lp, dtype));
    let ht = tensor(rt, DType::I64, &[targets.len()], &targets);
    let hl = tensor(rt, DType::I64, &[n, 3], &lengths);
    let alpha = run(
        rt,
        ctc(CtcPart::Alpha, max_target),
        &[tt(hlp), tt(ht), tt(hl)],
    );
    let loss = run(rt, ctc(CtcPart::Loss, max_target), &[tt(alpha), tt(hl)]);
    let g = tensor(rt, dtype, &[n], grad_out);
    let ins: [Input; 6] = [tt(g), tt(hlp), tt(ht), tt(hl), tt(loss), tt(alpha)];
    (loss, run(rt, ctc(CtcPart::Grad, max_target), &ins))
}

fn round(v: &[f64], dtype: DType) -> Vec<f64> {
    v.iter()
        .map(|&x| crate::reference::round_float(x, dtype))
        .collect()
}

/// Checks loss and gradient of `samples` (log_probs `dims`) against the path reference.
fn check(dtype: DType, dims: (usize, usize, usize), samples: &[Sample], seed: u64, tol: f64) {
    let mut rng = Rng::new(seed);
    let lp = round(&log_probs(&mut rng, dims), dtype);
    let grad_out: Vec<f64> = (0..dims.1).map(|b| 0.5 + b as f64).collect();
    let outs = run_in_every_mode(|rt| {
        let (loss, grad) = record(rt, dtype, &lp, dims, samples, &grad_out);
        vec![("loss".into(), loss), ("grad".into(), grad)]
    });
    let (t_max, n, c) = dims;
    for (b, s) in samples.iter().enumerate() {
        let (want_loss, want_grad) = loss_and_grad(&lp, dims, b, s, 0);
        let got = outs[0].1.data[b];
        let close = |g: f64, w: f64| (g - w).abs() <= tol * (1.0 + w.abs()) || g == w;
        assert!(
            close(got, want_loss),
            "{dtype} sample {b}: loss {got}, want {want_loss}"
        );
        for t in 0..t_max {
            for ch in 0..c {
                let g = outs[1].1.data[(t * n + b) * c + ch];
                let w = want_grad[t * c + ch] * grad_out[b];
                assert!(
                    close(g, w),
                    "{dtype} sample {b}: grad[{t}][{ch}] {g}, want {w}"
                );
            }
        }
    }
}

fn sample(input: usize, target: &[usize]) -> Sample {
    Sample {
        input,
        target: target.to_vec(),
    }
}

#[test]
fn loss_and_gradient_match_every_alignment_summed() {
    // 5 steps, 4 labels (blank 0); a repeated label needs a blank between its copies.
    let samples = [
        sample(5, &[1, 2]),
        sample(5, &[3, 3]),
        sample(4, &[2]),
        sample(5, &[1, 2, 3]),
    ];
    check(DType::F32, (5, 4, 4), &samples, 1, 2e-5);
    check(DType::F64, (5, 4, 4), &samples, 2, 1e-12);
}

#[test]
fn an_empty_target_is_the_all_blank_path() {
    check(
        DType::F64,
        (4, 2, 3),
        &[sample(4, &[]), sample(2, &[])],
        3,
        1e-12,
    );
}

#[test]
fn inputs_shorter_than_t_have_zero_gradient_past_their_end() {
    check(
        DType::F64,
        (6, 2, 3),
        &[sample(3, &[2]), sample(1, &[1])],
        4,
        1e-12,
    );
}

#[test]
fn a_target_no_alignment_fits_has_infinite_loss() {
    // Two copies of one label need three steps (a blank between); two steps have none.
    let outs = run_in_every_mode(|rt| {
        let mut rng = Rng::new(5);
        let lp = log_probs(&mut rng, (2, 1, 3));
        let (loss, _) = record(
            rt,
            DType::F32,
            &lp,
            (2, 1, 3),
            &[sample(2, &[1, 1])],
            &[1.0],
        );
        vec![("loss".into(), loss)]
    });
    assert_eq!(outs[0].1.data, [f64::INFINITY]);
}

#[test]
fn a_label_outside_the_classes_fails_when_the_op_runs() {
    let rt = runtime(Mode::Debug);
    let lp = tensor(&rt, DType::F32, &[2, 1, 3], &[-1.0; 6]);
    let t = tensor(&rt, DType::I64, &[1], &[7.0]);
    let l = tensor(&rt, DType::I64, &[1, 3], &[2.0, 1.0, 0.0]);
    let e = rt
        .op(0, ctc(CtcPart::Alpha, 1), &[tt(lp), tt(t), tt(l)], None)
        .and_then(|h| rt.synchronize(0).map(|_| h));
    match e {
        Err(Error::IndexOutOfBounds(m)) => assert!(m.contains("ctc_loss"), "{m}"),
        other => panic!("expected an out-of-bounds error, got {other:?}"),
    }
}

#[test]
fn a_blank_outside_the_classes_fails_at_record_time() {
    let rt = runtime(Mode::Strict);
    let lp = tensor(&rt, DType::F32, &[2, 1, 3], &[-1.0; 6]);
    let t = tensor(&rt, DType::I64, &[1], &[1.0]);
    let l = tensor(&rt, DType::I64, &[1, 3], &[2.0, 1.0, 0.0]);
    let op = Op::Kernel(KernelOp::Ctc(Ctc {
        part: CtcPart::Alpha,
        blank: 3,
        max_target: 1,
    }));
    match rt.op(0, op, &[tt(lp), tt(t), tt(l)], None) {
        Err(e @ Error::Op(_)) => assert!(e.to_string().contains("blank"), "{e}"),
        other => panic!("expected a record-time error, got {other:?}"),
    }
}
