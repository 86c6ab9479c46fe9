//! The depthwise loops over channels-last scratch (`channels_last`): each output vector's sum
//! over the taps, and each tap's weight-gradient sum over the positions, with AVX2 and FMA
//! where the CPU has them (the same bits either way: `Acc::mul_add` rounds once).

use super::channels_last::{Acc, Vector, LANES};

/// Output positions whose sums are computed side by side.
pub(super) const UNITS: usize = 8;

/// Taps whose weight-gradient sums run side by side, sharing each load of the gradient.
pub(super) const TAP_GROUP: usize = 8;

/// A loop over a scratch `x` read at `starts[p] + taps[t] + v` (position, tap, channel
/// vector), with one more vector operand `y` and a result `out`: both loops take these.
trait TapLoop {
    /// The loop itself; inlined into [`on_avx2_fma`], which compiles it for those features.
    fn body<T: Acc>(
        x: &[Vector<T>],
        y: &[Vector<T>],
        taps: &[usize],
        starts: &[usize],
        vectors: usize,
        out: &mut [Vector<T>],
    );
}

/// Runs loop `L`, compiled for AVX2 and FMA where the CPU has them, after checking that every
/// read of `x` the loops make unchecked lies inside it.
fn run<L: TapLoop, T: Acc>(
    x: &[Vector<T>],
    y: &[Vector<T>],
    taps: &[usize],
    starts: &[usize],
    vectors: usize,
    out: &mut [Vector<T>],
) {
    let reach = starts.iter().max().copied().unwrap_or(0) + taps.iter().max().copied().unwrap_or(0);
    assert!(reach + vectors <= x.len(), "a tap reads past the scratch");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { on_avx2_fma::<L, T>(x, y, taps, starts, vectors, out) };
    }
    L::body(x, y, taps, starts, vectors, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn on_avx2_fma<L: TapLoop, T: Acc>(
    x: &[Vector<T>],
    y: &[Vector<T>],
    taps: &[usize],
    starts: &[usize],
    vectors: usize,
    out: &mut [Vector<T>],
) {
    L::body(x, y, taps, starts, vectors, out)
}

/// `acc[p][v] = sum over taps t of x[starts[p] + taps[t] + v] * w[t][v]` for every output
/// position `p` and channel vector `v`.
pub(super) fn sum_over_taps<T: Acc>(
    x: &[Vector<T>],
    w: &[Vector<T>],
    taps: &[usize],
    starts: &[usize],
    vectors: usize,
    acc: &mut [Vector<T>],
) {
    run::<SumOverTaps, T>(x, w, taps, starts, vectors, acc)
}

/// `sums[t][v] += grad[p][v] * x[starts[p] + taps[t] + v]` over the output positions `p` in
/// order, for every tap `t` and channel vector `v` (`sums` has a multiple of [`TAP_GROUP`]
/// taps).
pub(super) fn tap_dots<T: Acc>(
    x: &[Vector<T>],
    grad: &[Vector<T>],
    taps: &[usize],
    starts: &[usize],
    vectors: usize,
    sums: &mut [Vector<T>],
) {
    run::<TapDots, T>(x, grad, taps, starts, vectors, sums)
}

struct SumOverTaps;

impl TapLoop for SumOverTaps {
    #[inline(always)]
    fn body<T: Acc>(
        x: &[Vector<T>],
        w: &[Vector<T>],
        taps: &[usize],
        starts: &[usize],
        vectors: usize,
        acc: &mut [Vector<T>],
    ) {
        assert_eq!(w.len(), taps.len() * vectors);
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        // Raw pointers: the eight positions' bases and the weight's stay in registers across the
        // taps (indexing reloaded each base from memory per tap and unit).
        let mut blocks = starts.chunks_exact(UNITS);
        let mut p0 = 0;
        for block in blocks.by_ref() {
            for v in 0..vectors {
                // SAFETY: every read is below `reach + vectors`, checked in `run`.
                unsafe {
                    let bases: [*const Vector<T>; UNITS] =
                        std::array::from_fn(|u| xp.add(block[u] + v));
                    let mut sums = [Vector::<T>::default(); UNITS];
                    let mut wt = wp.add(v);
                    for &tap in taps {
                        let wv = *wt;
                        wt = wt.add(vectors);
                        for (sum, base) in sums.iter_mut().zip(&bases) {
                            let xv = &*base.add(tap);
                            for l in 0..LANES {
                                sum[l] = xv[l].mul_add(wv[l], sum[l]);
                            }
                        }
                    }
                    for (u, sum) in sums.iter().enumerate() {
                        acc[(p0 + u) * vectors + v] = *sum;
                    }
                }
            }
            p0 += UNITS;
        }
        for (u, &s) in blocks.remainder().iter().enumerate() {
            for v in 0..vectors {
                let mut sum = Vector::<T>::default();
                for (t, &tap) in taps.iter().enumerate() {
                    let wv = w[t * vectors + v];
                    // SAFETY: as above.
                    let xv = unsafe { x.get_unchecked(s + tap + v) };
                    for l in 0..LANES {
                        sum[l] = xv[l].mul_add(wv[l], sum[l]);
                    }
                }
                acc[(p0 + u) * vectors + v] = sum;
            }
        }
    }
}

struct TapDots;

impl TapLoop for TapDots {
    #[inline(always)]
    fn body<T: Acc>(
        x: &[Vector<T>],
        grad: &[Vector<T>],
        taps: &[usize],
        starts: &[usize],
        vectors: usize,
        sums: &mut [Vector<T>],
    ) {
        assert!(grad.len() >= starts.len() * vectors);
        for (gi, group) in taps.chunks(TAP_GROUP).enumerate() {
            // A short last group repeats its last tap; its extra sums are never read.
            let offs: [usize; TAP_GROUP] = std::array::from_fn(|i| group[i.min(group.len() - 1)]);
            for v in 0..vectors {
                let at = |i: usize| (gi * TAP_GROUP + i) * vectors + v;
                let mut acc: [Vector<T>; TAP_GROUP] = std::array::from_fn(|i| sums[at(i)]);
                for (p, &s) in starts.iter().enumerate() {
                    let gv = grad[p * vectors + v];
                    for (t, &off) in offs.iter().enumerate() {
                        // SAFETY: below `reach + vectors`, checked in `run`.
                        let xv = unsafe { x.get_unchecked(s + off + v) };
                        for l in 0..LANES {
                            acc[t][l] = gv[l].mul_add(xv[l], acc[t][l]);
                        }
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    sums[at(i)] = *a;
                }
            }
        }
    }
}
