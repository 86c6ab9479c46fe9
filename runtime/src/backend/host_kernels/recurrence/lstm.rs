//! The LSTM cell's walks over the steps (`RecurrencePart::LstmForward`, `LstmBackward`).

use super::{
    hidden_products, in_lanes, part, sigmoid, sigmoid_backward, tanh, tanh_backward, Operands,
    Walk, V,
};
use std::ops::Range;

/// The forward walk for the samples `rows`: `y [T, B, 6H]` (packed: `[N, 6H]`) gets each
/// step's `i, f, g, o, c, h`.
///
/// # Safety
/// `y` is the dense result for `ops`; no other range writes `rows`.
pub(super) unsafe fn forward(walk: Walk, ops: &Operands, y: *mut f32, rows: Range<usize>) {
    let reverse = walk.reverse;
    let (t_len, _, h) = ops.dims;
    let steps = &ops.steps;
    let (g_len, row) = (4 * h, 6 * h);
    let (xg, c0) = (&ops.dense[0], &ops.dense[2]);
    let bias = ops.dense.get(3).map(|b| &b[..]);
    let (mut tanh_c, mut c_prev) = (vec![0f32; h], vec![0f32; h]);
    for step in (0..t_len).filter_map(|s| steps.visit(s, reverse, &rows)) {
        hidden_products(ops, y, &step, (row, g_len, 5 * h), bias);
        for b in step.held.clone() {
            // The previous step's row lies before this one or, walking in reverse, after it.
            c_prev.copy_from_slice(match step.row_before(b) {
                Some(r) => part(y, r * row + 4 * h, h),
                _ => &c0[b * h..][..h],
            });
            let cell = part(y, (step.start + b) * row, row);
            let x = &xg[(step.start + b) * g_len..][..g_len];
            cell[..g_len].iter_mut().zip(x).for_each(|(v, x)| *v += x);
            sigmoid(&mut cell[..2 * h]);
            tanh(&mut cell[2 * h..3 * h]);
            sigmoid(&mut cell[3 * h..4 * h]);
            let (gates, state) = cell.split_at_mut(g_len);
            let (i, rest) = gates.split_at(h);
            let (f, rest) = rest.split_at(h);
            let (g, o) = rest.split_at(h);
            let (c_new, h_new) = state.split_at_mut(h);
            for j in 0..h {
                c_new[j] = f[j] * c_prev[j] + i[j] * g[j];
            }
            tanh_c.copy_from_slice(c_new);
            tanh(&mut tanh_c);
            for j in 0..h {
                h_new[j] = o[j] * tanh_c[j];
            }
        }
    }
}

/// The backward walk for the samples `rows`, from the forward's last step to its first: `r
/// [T + 1, B, 4H]` (packed: `[N + B, 4H]`) gets each step's gate gradients, and in the last
/// rows the gradients of `h0` and `c0`.
///
/// # Safety
/// `r` is the dense result for `ops`; no other range writes `rows`.
pub(super) unsafe fn backward(walk: Walk, ops: &Operands, r: *mut f32, rows: Range<usize>) {
    let reverse = walk.reverse;
    let (t_len, b_len, h) = ops.dims;
    let steps = &ops.steps;
    let (g_len, row) = (4 * h, 6 * h);
    let (kept, c0, dy) = (&ops.dense[0], &ops.dense[1], &ops.dense[2]);
    // This range's running gradients of h and c, from those of the last states: a sample's
    // stay untouched until the walk reaches its last step.
    let mut dh = ops.dense[3][rows.start * h..rows.end * h].to_vec();
    let mut dc = ops.dense[4][rows.start * h..rows.end * h].to_vec();
    let mut tanh_c = vec![0f32; h];
    // The forward's steps from its last.
    for step in (0..t_len)
        .rev()
        .filter_map(|s| steps.visit(s, reverse, &rows))
    {
        let (at, held) = (step.start, step.held.clone());
        for b in held.clone() {
            let k = b - rows.start;
            let cell = &kept[(at + b) * row..][..row];
            let (i, f, g, o) = (
                &cell[..h],
                &cell[h..2 * h],
                &cell[2 * h..3 * h],
                &cell[3 * h..4 * h],
            );
            let c = &cell[4 * h..5 * h];
            let c_prev = match step.row_before(b) {
                Some(r) => &kept[r * row + 4 * h..][..h],
                _ => &c0[b * h..][..h],
            };
            tanh_c.copy_from_slice(c);
            tanh(&mut tanh_c);
            let dy = &dy[(at + b) * h..][..h];
            let (dh, dc) = (&dh[k * h..][..h], &mut dc[k * h..][..h]);
            let out = part(r, (at + b) * g_len, g_len);
            let cell = [i, f, g, o, c_prev, &tanh_c[..], dy, dh];
            in_lanes(h, cell, dc, out, gate_gradients);
        }
        let a = (
            r.add((at + held.start) * g_len) as *const f32,
            g_len as isize,
            1,
        );
        let dh_out = (
            dh.as_mut_ptr().add((held.start - rows.start) * h),
            h as isize,
            1,
        );
        ops.w.product(b_len, (held.len(), g_len, h), a, 0.0, dh_out);
    }
    for (k, b) in rows.enumerate() {
        let out = part(r, (steps.rows + b) * g_len, g_len);
        out[..h].copy_from_slice(&dh[k * h..][..h]);
        out[h..2 * h].copy_from_slice(&dc[k * h..][..h]);
        out[2 * h..].fill(0.0);
    }
}

/// One lane group of a step's backward: from `i, f, g, o, c_prev, tanh(c), dy, dh` and the
/// running `dc` the gate gradients `di, df, dg, do` and the next `dc`, as autograd through
/// CPU's cell gives them (`dh_t = dy + dh`, `dc_t = tanh_backward(dh_t * o, tanh(c)) + dc`).
#[inline(always)]
fn gate_gradients(x: &[[f32; V]; 8], dc: &[f32; V]) -> ([[f32; V]; 4], [f32; V]) {
    let [i, f, g, o, c_prev, tc, dy, dh] = x;
    let (mut y, mut next) = ([[0f32; V]; 4], [0f32; V]);
    for l in 0..V {
        let dh_t = dy[l] + dh[l];
        let dc_t = tanh_backward(dh_t * o[l], tc[l]) + dc[l];
        y[0][l] = sigmoid_backward(dc_t * g[l], i[l]);
        y[1][l] = sigmoid_backward(dc_t * c_prev[l], f[l]);
        y[2][l] = tanh_backward(dc_t * i[l], g[l]);
        y[3][l] = sigmoid_backward(dh_t * tc[l], o[l]);
        next[l] = dc_t * f[l];
    }
    (y, next)
}
