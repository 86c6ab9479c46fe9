//! The dense convolution's forward and input gradient one output element at a time, over only
//! the taps that land inside the input: the path for a weight that is infinite or NaN. The
//! products read the zero-padded grid, and a padding zero times an infinite weight is NaN,
//! where PyTorch's CPU kernels, which never read padding, give a number at the border (a conv1d
//! input gradient with an infinite tap: CPU's last element 2.0, the products' NaN). As
//! `depthwise/exact.rs` does for the depthwise convolution.

use super::{for_each_index, Idx, View};
use deferfuse_fusion::ir::Conv;

/// `out = conv(x, weight)` with `k`'s padding, dilation and stride, `weight` the dense `[OC, C
/// * K]` matrix the products read (each row's taps row-major over `kernel`, already mirrored
/// for the input gradient). Each element sums its taps that read the input, channels then taps
/// in order, `acc = fma(w, x, acc)` from +0.
///
/// # Safety
/// Every view lies inside its buffer and is float32; `out` overlaps neither operand.
pub(super) unsafe fn run(k: &Conv, x: &View, weight: &[f32], kernel: &[usize], out: &View) {
    let (d, c, oc) = (kernel.len(), x.sizes[1], out.sizes[1]);
    let mut taps: Vec<Idx> = Vec::new();
    for_each_index(kernel, |t| taps.push(t.into()));
    let xp = x.base as *const f32;
    let op = out.base as *mut f32;
    for s in 0..x.sizes[0] {
        for o in 0..oc {
            let row = &weight[o * c * taps.len()..(o + 1) * c * taps.len()];
            for_each_index(&out.sizes[2..], |p| {
                let mut acc = 0f32;
                for ci in 0..c {
                    let plane = x.offset + s as isize * x.strides[0] + ci as isize * x.strides[1];
                    for (ti, t) in taps.iter().enumerate() {
                        let mut at = plane;
                        let inside = (0..d).all(|i| {
                            let q = (p[i] * k.stride[i] + t[i] * k.dilation[i]) as isize
                                - k.padding[i] as isize;
                            at += q * x.strides[2 + i];
                            (0..x.sizes[2 + i] as isize).contains(&q)
                        });
                        if inside {
                            acc = row[ci * taps.len() + ti].mul_add(*xp.offset(at), acc);
                        }
                    }
                }
                let to = out.offset
                    + s as isize * out.strides[0]
                    + o as isize * out.strides[1]
                    + (0..d)
                        .map(|i| p[i] as isize * out.strides[2 + i])
                        .sum::<isize>();
                *op.offset(to) = acc;
            });
        }
    }
}
