//! The plain RNN cell's walks over the steps (`RecurrencePart::RnnTanh*`, `RnnRelu*`), in the
//! order of CPU's cell: `h = act(hg + xg)`, `hg` the hidden product `b_hh + h_prev @ W_hh^T`
//! and `xg` the step's input product; relu keeps NaN and zeroes what is below 0.

use super::{hidden_products, part, tanh, tanh_backward, Operands, Walk};
use std::ops::Range;

/// `x` through relu as `torch.relu` gives it: NaN stays NaN.
fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// The forward walk for the samples `rows`: `y [T, B, H]` (packed: `[N, H]`) gets each step's
/// `h`.
///
/// # Safety
/// `y` is the dense result for `ops`; no other range writes `rows`.
pub(super) unsafe fn forward(walk: Walk, ops: &Operands, y: *mut f32, rows: Range<usize>) {
    let (t_len, _, h) = ops.dims;
    let steps = &ops.steps;
    let xg = &ops.dense[0];
    let bias = ops.dense.get(2).map(|b| &b[..]);
    for step in (0..t_len).filter_map(|s| steps.visit(s, walk.reverse, &rows)) {
        hidden_products(ops, y, &step, (h, h, 0), bias);
        let (n, at) = (step.held.len() * h, (step.start + step.held.start) * h);
        let here = part(y, at, n);
        let x = &xg[at..][..n];
        here.iter_mut().zip(x).for_each(|(v, x)| *v += x);
        if walk.relu {
            here.iter_mut().for_each(|v| *v = relu(*v));
        } else {
            tanh(here);
        }
    }
}

/// The backward walk for the samples `rows`, from the forward's last step to its first: `r
/// [T + 1, B, H]` (packed: `[N + B, H]`) gets each step's gradient before the activation, and
/// in the last rows the gradient of `h0`.
///
/// # Safety
/// `r` is the dense result for `ops`; no other range writes `rows`.
pub(super) unsafe fn backward(walk: Walk, ops: &Operands, r: *mut f32, rows: Range<usize>) {
    let (t_len, b_len, h) = ops.dims;
    let steps = &ops.steps;
    let (kept, dy) = (&ops.dense[0], &ops.dense[1]);
    // This range's running gradient of h, from the last state's: a sample's stays untouched
    // until the walk reaches its last step.
    let mut dh = ops.dense[2][rows.start * h..rows.end * h].to_vec();
    // The forward's steps from its last.
    for step in (0..t_len)
        .rev()
        .filter_map(|s| steps.visit(s, walk.reverse, &rows))
    {
        let held = step.held;
        let n = held.len() * h;
        let at = (step.start + held.start) * h;
        let (y, dy) = (&kept[at..][..n], &dy[at..][..n]);
        let out = part(r, at, n);
        let dh = &mut dh[(held.start - rows.start) * h..][..n];
        for j in 0..n {
            let dh_t = dy[j] + dh[j];
            // CPU's threshold_backward(grad, result, 0) for relu.
            out[j] = if walk.relu {
                if y[j] > 0.0 {
                    dh_t
                } else {
                    0.0
                }
            } else {
                tanh_backward(dh_t, y[j])
            };
        }
        let dh_out = (dh.as_mut_ptr(), h as isize, 1);
        let a = (out.as_ptr(), h as isize, 1);
        ops.w.product(b_len, (held.len(), h, h), a, 0.0, dh_out);
    }
    part(r, (steps.rows + rows.start) * h, rows.len() * h).copy_from_slice(&dh);
}
