//! The GRU cell's walks over the steps (`RecurrencePart::GruForward`, `GruBackward`), in the
//! order of CPU's cell: `r = sigmoid(hr + xr)`, `z = sigmoid(hz + xz)`, `n = tanh(xn + hn *
//! r)`, `h = (h_prev - n) * z + n`, where `h*` is the hidden product `b_hh + h_prev @ W_hh^T`
//! and `x*` the step's input product.

use super::{
    hidden_products, in_lanes, part, sigmoid, sigmoid_backward, tanh, tanh_backward, Operands,
    Walk, V,
};
use std::ops::Range;

/// The forward walk for the samples `rows`: `y [T, B, 5H]` (packed: `[N, 5H]`) gets each
/// step's `r, z, n, hn, h`.
///
/// # Safety
/// `y` is the dense result for `ops`; no other range writes `rows`.
pub(super) unsafe fn forward(walk: Walk, ops: &Operands, y: *mut f32, rows: Range<usize>) {
    let reverse = walk.reverse;
    let (t_len, _, h) = ops.dims;
    let steps = &ops.steps;
    let (g_len, row) = (3 * h, 5 * h);
    let (xg, h0) = (&ops.dense[0], &ops.dense[1]);
    let bias = ops.dense.get(2).map(|b| &b[..]);
    let mut h_prev = vec![0f32; h];
    for step in (0..t_len).filter_map(|s| steps.visit(s, reverse, &rows)) {
        // The hidden product lands in the first 3H floats of each sample's row.
        hidden_products(ops, y, &step, (row, g_len, 4 * h), bias);
        for b in step.held.clone() {
            // The previous step's row lies before this one or, walking in reverse, after it.
            h_prev.copy_from_slice(match step.row_before(b) {
                Some(r) => part(y, r * row + 4 * h, h),
                _ => &h0[b * h..][..h],
            });
            let cell = part(y, (step.start + b) * row, row);
            let x = &xg[(step.start + b) * g_len..][..g_len];
            // hn is kept for the backward before n's place is overwritten.
            cell.copy_within(2 * h..3 * h, 3 * h);
            cell[..2 * h].iter_mut().zip(x).for_each(|(v, x)| *v += x);
            sigmoid(&mut cell[..2 * h]);
            let (rz, rest) = cell.split_at_mut(2 * h);
            let (r, z) = rz.split_at(h);
            let (n, rest) = rest.split_at_mut(h);
            let (hn, h_new) = rest.split_at_mut(h);
            for j in 0..h {
                n[j] = x[2 * h + j] + hn[j] * r[j];
            }
            tanh(n);
            for j in 0..h {
                h_new[j] = (h_prev[j] - n[j]) * z[j] + n[j];
            }
        }
    }
}

/// The backward walk for the samples `rows`, from the forward's last step to its first: `r
/// [T + 1, B, 6H]` (packed: `[N + B, 6H]`) gets each step's gradients of the input product's
/// gates and of the hidden product's, and in the last rows the gradient of `h0`.
///
/// # Safety
/// `r` is the dense result for `ops`; no other range writes `rows`.
pub(super) unsafe fn backward(walk: Walk, ops: &Operands, r: *mut f32, rows: Range<usize>) {
    let reverse = walk.reverse;
    let (t_len, b_len, h) = ops.dims;
    let steps = &ops.steps;
    let (g_len, row, out_row) = (3 * h, 5 * h, 6 * h);
    let (kept, h0, dy) = (&ops.dense[0], &ops.dense[1], &ops.dense[2]);
    // This range's running gradient of h (from the last state's: a sample's stays untouched
    // until the walk reaches its last step), and each sample's share of it that skips the
    // gates (through `(h_prev - n) * z`).
    let mut dh = ops.dense[3][rows.start * h..rows.end * h].to_vec();
    let mut through_z = vec![0f32; rows.len() * h];
    // The forward's steps from its last.
    for step in (0..t_len)
        .rev()
        .filter_map(|s| steps.visit(s, reverse, &rows))
    {
        let (at, held) = (step.start, step.held.clone());
        for b in held.clone() {
            let k = b - rows.start;
            let cell = &kept[(at + b) * row..][..row];
            let (rg, z, n, hn) = (
                &cell[..h],
                &cell[h..2 * h],
                &cell[2 * h..3 * h],
                &cell[3 * h..4 * h],
            );
            let h_prev = match step.row_before(b) {
                Some(r) => &kept[r * row + 4 * h..][..h],
                _ => &h0[b * h..][..h],
            };
            let dy = &dy[(at + b) * h..][..h];
            let dh = &dh[k * h..][..h];
            let skip = &mut through_z[k * h..][..h];
            let out = part(r, (at + b) * out_row, out_row);
            in_lanes(h, [rg, z, n, hn, h_prev, dy, dh], skip, out, gate_gradients);
        }
        // dh = through_z + the hidden product's gate gradients @ W_hh, for the samples held.
        let a = (
            r.add((at + held.start) * out_row + g_len) as *const f32,
            out_row as isize,
            1,
        );
        let here = (held.start - rows.start) * h..(held.end - rows.start) * h;
        let dh_out = (dh[here.clone()].as_mut_ptr(), h as isize, 1);
        ops.w.product(b_len, (held.len(), g_len, h), a, 0.0, dh_out);
        dh[here.clone()]
            .iter_mut()
            .zip(&through_z[here])
            .for_each(|(d, s)| *d += s);
    }
    for (k, b) in rows.enumerate() {
        let out = part(r, (steps.rows + b) * out_row, out_row);
        out[..h].copy_from_slice(&dh[k * h..][..h]);
        out[h..].fill(0.0);
    }
}

/// One lane group of a step's backward: from `r, z, n, hn, h_prev, dy, dh` the gradients of
/// the input product's gates `dr, dz, dn` and of the hidden product's `dr, dz, dn * r`, and
/// the share of `dh` that skips the gates (`(dy + dh) * z`), as autograd through CPU's cell
/// gives them (the share needs no running value: `_` is `in_lanes`' state slot).
#[inline(always)]
fn gate_gradients(x: &[[f32; V]; 7], _: &[f32; V]) -> ([[f32; V]; 6], [f32; V]) {
    let [r, z, n, hn, h_prev, dy, dh] = x;
    let (mut y, mut skip) = ([[0f32; V]; 6], [0f32; V]);
    for l in 0..V {
        let dh_t = dy[l] + dh[l];
        skip[l] = dh_t * z[l];
        let dz = dh_t * (h_prev[l] - n[l]);
        let dn = tanh_backward(dh_t - skip[l], n[l]);
        let dr = sigmoid_backward(dn * hn[l], r[l]);
        let dz_pre = sigmoid_backward(dz, z[l]);
        y[0][l] = dr;
        y[1][l] = dz_pre;
        y[2][l] = dn;
        y[3][l] = dr;
        y[4][l] = dz_pre;
        y[5][l] = dn * r[l];
    }
    (y, skip)
}
