//! The depthwise forward and input gradient one output element at a time, over only the taps
//! that land inside the input: the path for a weight that is infinite or NaN. The vector loops
//! multiply the zero padding by every live tap's weight, which adds nothing for a finite weight
//! but NaN for an infinite one, where PyTorch's CPU kernel, which never reads padding, gives a
//! number at the border. The sum order is the vector loops' (taps in row-major order), so a
//! finite weight would give their bits here too.

use super::channels_last::{each_position, Acc, Planes};
use super::{tap_elements, Geometry, View};

/// `out` = the forward (`forward`) or the input gradient of `a` (x or grad) by the weight `w`.
///
/// # Safety
/// The views' elements lie inside their buffers.
pub(super) unsafe fn run<T: Acc>(forward: bool, g: &Geometry, a: &View, w: &View, out: &View) {
    let (pa, pw, po) = (Planes::of(a), Planes::of(w), Planes::of(out));
    let tap_at = tap_elements(w);
    let result = if forward { g.output } else { g.input };
    let inside = |v: isize, size: usize| (0..size as isize).contains(&v);
    for n in 0..a.sizes[0] {
        for c in 0..a.sizes[1] {
            let (src, dst, wc) = (pa.at(n, c), po.at(n, c), pw.at(c, 0));
            each_position(result, po.spatial, |p, o| {
                let mut acc = T::default();
                let mut t = 0;
                for i in 0..g.kernel[0] {
                    for j in 0..g.kernel[1] {
                        for l in 0..g.kernel[2] {
                            let tap = [i, j, l];
                            // Forward: input position p * stride - padding + t * dilation.
                            // Input gradient: the gradient position o with that input
                            // position p, if there is one.
                            let mut off = 0isize;
                            let mut hit = true;
                            for d in 0..3 {
                                let (s, pad, dil) = (g.stride[d], g.padding[d], g.dilation[d]);
                                let q = if forward {
                                    (p[d] * s + tap[d] * dil) as isize - pad as isize
                                } else {
                                    let num = (p[d] + pad) as isize - (tap[d] * dil) as isize;
                                    if num % s as isize != 0 {
                                        hit = false;
                                        break;
                                    }
                                    num / s as isize
                                };
                                let size = if forward { g.input[d] } else { g.output[d] };
                                if !inside(q, size) {
                                    hit = false;
                                    break;
                                }
                                off += q * pa.spatial[d];
                            }
                            if hit {
                                let x = T::load(a.dtype, a.base, src + off);
                                let wt = T::load(w.dtype, w.base, wc + tap_at[t]);
                                acc = x.mul_add(wt, acc);
                            }
                            t += 1;
                        }
                    }
                }
                acc.store(out.dtype, out.base, dst + o);
            });
        }
    }
}
