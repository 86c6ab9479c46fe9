//! The CTC loss's host routines (`KernelOp::Ctc`): PyTorch's CPU algorithm (LossCTC.cpp) step
//! for step, the same log-space recursions and max-shifted sums, each step computed in f64 and
//! every stored value (alphas, betas, the collected products) rounded to the dtype as CPU stores
//! them. Samples are independent; a sample's lengths and labels are checked before any of its
//! values is read.

use super::elem::{read_f64, read_i64, round_to, write_f64};
use super::{out_of_bounds, View};
use crate::error::{Error, Result};
use deferfuse_fusion::ir::{Ctc, CtcPart, DType};

const NEG_INF: f64 = f64::NEG_INFINITY;

/// The element offset of `idx` in `v`.
fn at(v: &View, idx: &[usize]) -> isize {
    v.offset
        + idx
            .iter()
            .zip(&v.strides)
            .map(|(&i, &s)| i as isize * s)
            .sum::<isize>()
}

/// One sample's input length and its extended labels (blank, label, blank, ..., blank).
struct Sample {
    input: usize,
    labels: Vec<usize>,
}

impl Sample {
    /// The target's length.
    fn target(&self) -> usize {
        self.labels.len() / 2
    }
}

/// Reads and checks sample `b`: its input length within T, its target inside `targets` (when
/// given) with every label below `classes`, and `2 * target + 1` within `width` (the alphas').
unsafe fn sample(
    b: usize,
    lengths: &View,
    targets: Option<&View>,
    (t_max, classes, width): (usize, usize, usize),
    blank: usize,
) -> Result<Sample> {
    let get = |j: usize| read_i64(lengths.dtype, lengths.base, at(lengths, &[b, j]));
    let (input, target, offset) = (get(0), get(1), get(2));
    let bad = |what: &str, v: i64, limit: String| {
        Err(Error::IndexOutOfBounds(format!(
            "ctc_loss: sample {b}'s {what} is {v}, expected {limit}"
        )))
    };
    if input < 0 || input as usize > t_max {
        return bad("input length", input, format!("0..={t_max}"));
    }
    if target < 0 || (2 * target + 1) as usize > width {
        return bad("target length", target, format!("0..={}", (width - 1) / 2));
    }
    let mut labels = vec![blank; 2 * target as usize + 1];
    if let Some(t) = targets {
        let n = t.sizes[0] as i64;
        if offset < 0 || offset + target > n {
            return bad("target offset", offset, format!("0..={}", n - target));
        }
        for j in 0..target as usize {
            let v = read_i64(t.dtype, t.base, at(t, &[offset as usize + j]));
            if v < 0 || v as usize >= classes {
                return Err(out_of_bounds("ctc_loss", v, 2, classes));
            }
            labels[2 * j + 1] = v as usize;
        }
    }
    Ok(Sample {
        input: input as usize,
        labels,
    })
}

/// `log(sum exp(x - m)) + m` over `xs` with `m` their maximum (0 when all are -inf), as CPU
/// sums its two or three terms.
fn log_sum_exp(xs: &[f64]) -> f64 {
    let m = xs
        .iter()
        .copied()
        .fold(NEG_INF, |m, x| if x > m { x } else { m });
    let m = if m == NEG_INF { 0.0 } else { m };
    xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m
}

/// Runs part `k` over `inputs` (see [`CtcPart`] for each part's operands) into `out`.
///
/// # Safety
/// Every view must lie inside its buffer; `out` must not overlap an input.
pub(super) unsafe fn run(k: &Ctc, inputs: &[View], out: &View) -> Result<()> {
    match k.part {
        CtcPart::Alpha => alpha(k, &inputs[0], &inputs[1], &inputs[2], out),
        CtcPart::Loss => loss(&inputs[0], &inputs[1], out),
        CtcPart::Grad => grad(k, inputs, out),
    }
}

/// Writes `v` to every element of the 3-D view `v`.
unsafe fn fill(out: &View, v: f64) {
    for i in 0..out.sizes[0] {
        for j in 0..out.sizes[1] {
            for l in 0..out.sizes[2] {
                write_f64(out.dtype, out.base, at(out, &[i, j, l]), v);
            }
        }
    }
}

/// The alphas: `out[b, t, s]`, the log-probability of the paths through the first `t + 1`
/// inputs that end at extended label `s`.
unsafe fn alpha(k: &Ctc, lp: &View, targets: &View, lengths: &View, out: &View) -> Result<()> {
    let (t_max, n, c) = (lp.sizes[0], lp.sizes[1], lp.sizes[2]);
    fill(out, NEG_INF);
    let dt = out.dtype;
    for b in 0..n {
        let smp = sample(b, lengths, Some(targets), (t_max, c, out.sizes[2]), k.blank)?;
        if smp.input == 0 {
            continue;
        }
        let lpv = |t: usize, c: usize| read_f64(lp.dtype, lp.base, at(lp, &[t, b, c]));
        let la = |t: usize, s: usize| read_f64(dt, out.base, at(out, &[b, t, s]));
        let set = |t: usize, s: usize, v: f64| write_f64(dt, out.base, at(out, &[b, t, s]), v);
        let labels = &smp.labels;
        set(0, 0, lpv(0, k.blank));
        if smp.target() > 0 {
            set(0, 1, lpv(0, labels[1]));
        }
        for t in 1..smp.input {
            for s in 0..labels.len() {
                let la2 = if s > 0 { la(t - 1, s - 1) } else { NEG_INF };
                let la3 = if s > 1 && labels[s - 2] != labels[s] {
                    la(t - 1, s - 2)
                } else {
                    NEG_INF
                };
                let v = log_sum_exp(&[la(t - 1, s), la2, la3]);
                set(t, s, round_to(dt, v) + lpv(t, labels[s]));
            }
        }
    }
    Ok(())
}

/// The loss per sample: minus the log of the last two alphas' sum (the last one's alone for an
/// empty target; 0 for an empty input and target, +inf for an empty input only).
unsafe fn loss(la: &View, lengths: &View, out: &View) -> Result<()> {
    let (n, t_max, width) = (la.sizes[0], la.sizes[1], la.sizes[2]);
    for b in 0..n {
        let smp = sample(b, lengths, None, (t_max, usize::MAX, width), 0)?;
        let get = |s: usize| read_f64(la.dtype, la.base, at(la, &[b, smp.input - 1, s]));
        let tg = smp.target();
        let log_likelihood = if smp.input == 0 {
            if tg == 0 {
                0.0
            } else {
                NEG_INF
            }
        } else if tg == 0 {
            get(0)
        } else {
            let (l1, l2) = (get(2 * tg), get(2 * tg - 1));
            let m = l1.max(l2);
            let m = if m == NEG_INF { 0.0 } else { m };
            round_to(out.dtype, ((l1 - m).exp() + (l2 - m).exp()).ln()) + m
        };
        write_f64(out.dtype, out.base, at(out, &[b]), -log_likelihood);
    }
    Ok(())
}

/// The gradient: the betas (the paths through the inputs from `t` on that start at `s`), the
/// products of alphas and betas collected per label and time step, then CPU's
/// `(exp(lp) - exp(collected + loss - lp)) * grad`; zero past a sample's input length.
unsafe fn grad(k: &Ctc, inputs: &[View], out: &View) -> Result<()> {
    let (gout, lp, targets, lengths, nll, la) = (
        &inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4], &inputs[5],
    );
    let (t_max, n, c) = (lp.sizes[0], lp.sizes[1], lp.sizes[2]);
    let dt: DType = out.dtype;
    for b in 0..n {
        let smp = sample(b, lengths, Some(targets), (t_max, c, la.sizes[2]), k.blank)?;
        let (input, labels) = (smp.input, &smp.labels);
        let width = labels.len();
        let lpv = |t: usize, c: usize| read_f64(lp.dtype, lp.base, at(lp, &[t, b, c]));
        let lav = |t: usize, s: usize| read_f64(la.dtype, la.base, at(la, &[b, t, s]));
        let mut beta = vec![NEG_INF; input * width];
        let mut coll = vec![NEG_INF; input * c];
        if input > 0 {
            let (t, s) = (input - 1, width - 1);
            beta[t * width + s] = lpv(t, k.blank);
            coll[t * c + k.blank] = round_to(dt, lav(t, s) + beta[t * width + s]);
            if smp.target() > 0 {
                let p = labels[s - 1];
                beta[t * width + s - 1] = lpv(t, p);
                coll[t * c + p] = round_to(dt, lav(t, s - 1) + beta[t * width + s - 1]);
            }
        }
        for t in (0..input.saturating_sub(1)).rev() {
            for s in (0..width).rev() {
                let next = |s: usize| beta[(t + 1) * width + s];
                let lb2 = if s + 1 < width { next(s + 1) } else { NEG_INF };
                let lb3 = if s + 2 < width && labels[s + 2] != labels[s] {
                    next(s + 2)
                } else {
                    NEG_INF
                };
                let v = round_to(dt, log_sum_exp(&[next(s), lb2, lb3])) + lpv(t, labels[s]);
                let v = round_to(dt, v);
                beta[t * width + s] = v;
                let ab = round_to(dt, lav(t, s) + v);
                let slot = &mut coll[t * c + labels[s]];
                *slot = if *slot == NEG_INF {
                    ab
                } else {
                    let m = slot.max(ab);
                    round_to(dt, ((*slot - m).exp() + (ab - m).exp()).ln() + m)
                };
            }
        }
        let g = read_f64(gout.dtype, gout.base, at(gout, &[b]));
        let loss = read_f64(nll.dtype, nll.base, at(nll, &[b]));
        for t in 0..t_max {
            for ch in 0..c {
                let v = if t < input {
                    let p = lpv(t, ch);
                    (p.exp() - (coll[t * c + ch] + loss - p).exp()) * g
                } else {
                    0.0
                };
                write_f64(dt, out.base, at(out, &[t, b, ch]), v);
            }
        }
    }
    Ok(())
}
