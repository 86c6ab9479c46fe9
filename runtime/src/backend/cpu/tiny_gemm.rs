//! Small f32/f64 products with a short inner dim (k <= [`MAX_K`], at most [`MAX_WORK`]
//! multiply-adds): a batch of 3x3 or 4x4 matrices (point-cloud T-nets, rotations, capsule
//! routing), computed element by element.
//!
//! Every product through the other paths pays their setup (`matrixmultiply` packs both
//! operands into aligned panels): `torch.bmm` of 20,000 3x3 matrices took ~140 ns a product,
//! 2.2x CPU eager's time; here 3x3 and 4x4 batches run 2-4x faster than before.
//!
//! Bit-identity: each element is what `matrixmultiply`'s FMA kernels give for k within one
//! k-block (`small_gemm::KC`): `acc = fma(a, b, acc)` from `+0` over k in order, then with
//! `alpha == 1` (the only case taken) `c = acc` (`beta == 0`) or `c = c * beta + acc`; a full
//! 8x8 tile's `fma(1, acc, c * beta)` is the same number. The tests compare the bits with
//! `matrixmultiply` over every shape up to the limits.

/// Longest inner dim taken. Measured against the other paths (one thread, batched
/// products): 3x3 and 4x4 2-2.5x faster, 8x8 and 16x16 slower (their vector tiles win).
pub(super) const MAX_K: usize = 4;

/// Most multiply-adds per product taken: the loop is scalar, and what it saves is the other
/// paths' setup per product (a `[10, 1] @ [1, 204]` outer product, 2,040, was 2 us slower
/// here than through `matrixmultiply`).
pub(super) const MAX_WORK: usize = 256;

/// Whether [`gemm`] computes a product of this shape and `alpha` (on a host with FMA).
pub(super) fn takes((m, k, n): (usize, usize, usize), alpha: f64) -> bool {
    alpha == 1.0 && (1..=MAX_K).contains(&k) && m * n * k <= MAX_WORK && has_fma()
}

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The element type of a product: f32 or f64, with a fused multiply-add.
pub(super) trait Real:
    Copy + PartialEq + std::ops::Mul<Output = Self> + std::ops::Add<Output = Self>
{
    const ZERO: Self;
    fn fma(self, b: Self, c: Self) -> Self;
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    #[inline(always)]
    fn fma(self, b: f32, c: f32) -> f32 {
        self.mul_add(b, c)
    }
}

impl Real for f64 {
    const ZERO: f64 = 0.0;
    #[inline(always)]
    fn fma(self, b: f64, c: f64) -> f64 {
        self.mul_add(b, c)
    }
}

/// `c = a @ b + beta * c` for `a: [m, k]`, `b: [k, n]`, `c: [m, n]` with element strides
/// `(rs*, cs*)`, where [`takes`] holds.
///
/// # Safety
/// The pointers are valid for every element the strides address; `c` overlaps neither operand;
/// the host has FMA ([`takes`] checks it).
pub(super) unsafe fn gemm<T: Real>(
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const T, isize, isize),
    (b, rsb, csb): (*const T, isize, isize),
    beta: T,
    (c, rsc, csc): (*mut T, isize, isize),
) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "fma")]
        unsafe fn with_fma<T: Real>(
            mkn: (usize, usize, usize),
            a: (*const T, isize, isize),
            b: (*const T, isize, isize),
            beta: T,
            c: (*mut T, isize, isize),
        ) {
            unsafe { each_element(mkn, a, b, beta, c) }
        }
        with_fma((m, k, n), (a, rsa, csa), (b, rsb, csb), beta, (c, rsc, csc))
    }
    #[cfg(not(target_arch = "x86_64"))]
    each_element((m, k, n), (a, rsa, csa), (b, rsb, csb), beta, (c, rsc, csc))
}

#[inline(always)]
unsafe fn each_element<T: Real>(
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const T, isize, isize),
    (b, rsb, csb): (*const T, isize, isize),
    beta: T,
    (c, rsc, csc): (*mut T, isize, isize),
) {
    for i in 0..m as isize {
        let arow = a.offset(i * rsa);
        let crow = c.offset(i * rsc);
        for j in 0..n as isize {
            let bcol = b.offset(j * csb);
            let mut acc = T::ZERO;
            for p in 0..k as isize {
                acc = (*arow.offset(p * csa)).fma(*bcol.offset(p * rsb), acc);
            }
            let cp = crow.offset(j * csc);
            *cp = if beta == T::ZERO {
                acc
            } else {
                *cp * beta + acc
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values whose products and sums round, signed zeros included.
    fn values(len: usize, seed: u32) -> Vec<f64> {
        (0..len)
            .map(|i| {
                let x = ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f64;
                match i % 11 {
                    0 => -0.0,
                    1 => 0.0,
                    _ => (x / 16_777_216.0 - 0.5) * 3.7,
                }
            })
            .collect()
    }

    /// An element type with `matrixmultiply`'s GEMM for it, the reference.
    trait Reference: Real + std::fmt::Debug {
        fn from_f64(v: f64) -> Self;
        fn bits(self) -> u64;
        /// # Safety
        /// As `matrixmultiply`'s gemm: the pointers address every element the strides name.
        unsafe fn reference(
            mkn: (usize, usize, usize),
            a: (*const Self, isize, isize),
            b: (*const Self, isize, isize),
            beta: Self,
            c: (*mut Self, isize, isize),
        );
    }

    impl Reference for f32 {
        fn from_f64(v: f64) -> f32 {
            v as f32
        }
        fn bits(self) -> u64 {
            self.to_bits() as u64
        }
        unsafe fn reference(
            (m, k, n): (usize, usize, usize),
            a: (*const f32, isize, isize),
            b: (*const f32, isize, isize),
            beta: f32,
            c: (*mut f32, isize, isize),
        ) {
            matrixmultiply::sgemm(
                m, k, n, 1.0, a.0, a.1, a.2, b.0, b.1, b.2, beta, c.0, c.1, c.2,
            )
        }
    }

    impl Reference for f64 {
        fn from_f64(v: f64) -> f64 {
            v
        }
        fn bits(self) -> u64 {
            self.to_bits()
        }
        unsafe fn reference(
            (m, k, n): (usize, usize, usize),
            a: (*const f64, isize, isize),
            b: (*const f64, isize, isize),
            beta: f64,
            c: (*mut f64, isize, isize),
        ) {
            matrixmultiply::dgemm(
                m, k, n, 1.0, a.0, a.1, a.2, b.0, b.1, b.2, beta, c.0, c.1, c.2,
            )
        }
    }

    fn check<T: Reference>((m, k, n): (usize, usize, usize), beta: f64, b_transposed: bool) {
        let typed = |v: Vec<f64>| v.into_iter().map(T::from_f64).collect::<Vec<T>>();
        let (a, b) = (typed(values(m * k, 1)), typed(values(k * n, 2)));
        let c0 = typed(values(m * n, 3));
        let (rsb, csb) = if b_transposed {
            (1, k as isize)
        } else {
            (n as isize, 1)
        };
        let (mut want, mut got) = (c0.clone(), c0);
        let (av, bv) = ((a.as_ptr(), k as isize, 1), (b.as_ptr(), rsb, csb));
        let beta = T::from_f64(beta);
        unsafe {
            T::reference((m, k, n), av, bv, beta, (want.as_mut_ptr(), n as isize, 1));
            gemm((m, k, n), av, bv, beta, (got.as_mut_ptr(), n as isize, 1));
        }
        let bits = |v: &[T]| v.iter().map(|x| x.bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{m}x{k}x{n} beta {beta:?} bt {b_transposed}"
        );
    }

    #[test]
    fn every_short_inner_dim_gives_matrixmultiplys_bits() {
        if !has_fma() {
            eprintln!("skipped: this host has no FMA, where the path is not taken");
            return;
        }
        for m in [1, 2, 3, 7, 8, 9, 16, 17] {
            for k in 1..=16 {
                for n in [1, 3, 4, 8, 13, 64, 204] {
                    for beta in [0.0, 1.0, 0.5] {
                        for bt in [false, true] {
                            check::<f32>((m, k, n), beta, bt);
                            check::<f64>((m, k, n), beta, bt);
                        }
                    }
                }
            }
        }
    }
}
