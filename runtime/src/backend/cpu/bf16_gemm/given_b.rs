//! Products whose B the caller hands over in a form of its own: rows at offsets into a buffer
//! (the dense convolution's columns, read in its padded grid: [`matmul_f32_b_rows`]), or panels
//! packed once for many products (a recurrent layer's weight: [`PackedB`],
//! [`matmul_f32_packed`]). Both drive the parent module's tile kernel, so each element is the
//! same f32 sum as [`super::matmul_f32`]'s.

use super::{a_panel, pack_a, pack_b, pair, tile_kernel, trim, Out, MR, NR, PACKED};
use crate::backend::cpu::half_gemm::HalfMat;
use std::arch::x86_64::*;

/// `c = a @ B` for a bf16 `a` `[m, k]` into an f32 `c` (first element, row and column
/// strides), B's row `q` (`n` contiguous bf16 values) at `b.offset(b_rows[q])`: the dense
/// convolution's columns, read where they lie in its padded grid. B is never packed whole:
/// each panel of [`NR`] columns is packed from the rows just before the kernel reads it, and
/// stays in L1 while every panel of A passes over it. Each element is the same f32 sum as
/// [`matmul_f32`]'s over those rows gathered into a matrix.
///
/// # Safety
/// [`available`]; `a` and `c` as in [`matmul_f32`]; every `b.offset(b_rows[q])` is valid for
/// `n` values; `b_rows.len() == a.cols`.
pub(in crate::backend::cpu) unsafe fn matmul_f32_b_rows(
    a: HalfMat,
    (b, b_rows): (*const u16, &[isize]),
    n: usize,
    c: (*mut f32, isize, isize),
) {
    let (m, k) = (a.rows, a.cols);
    assert_eq!(b_rows.len(), k, "one offset per row of B");
    if m == 0 || n == 0 {
        return;
    }
    by_panels(a, n, Out::F32(c), |j0, cols, pb| {
        pb.resize(k.div_ceil(2) * NR, 0);
        pack_rows_panel((b, b_rows), j0, cols, pb);
        pb.as_ptr()
    });
}

/// The tiles of `a @ B` into `out` (`n` columns), column panel by column panel: `panel(j0,
/// cols, scratch)` gives the panel of B's columns from `j0` packed as [`super::pack_b`] packs
/// one (in `scratch`, this thread's B buffer, or anywhere it lives); A's panels are read in
/// place or packed once, as in [`super::matmul`].
///
/// # Safety
/// [`super::available`]; `a` and `out` as in [`super::matmul_f32`]; each panel `panel` gives
/// stays valid until the next call.
unsafe fn by_panels(
    a: HalfMat,
    n: usize,
    out: Out,
    mut panel: impl FnMut(usize, usize, &mut Vec<u32>) -> *const u32,
) {
    let (m, k) = (a.rows, a.cols);
    let pairs = k.div_ceil(2);
    let direct = a.cs == 1 && k % 2 == 0;
    PACKED.with(|bufs| {
        let mut bufs = bufs.borrow_mut();
        let (pa, pb) = &mut *bufs;
        if !direct {
            pa.resize(m.div_ceil(MR) * pairs * MR, 0);
            pack_a(&a, pairs, pa);
        }
        for j0 in (0..n).step_by(NR) {
            let cols = NR.min(n - j0);
            let bp = panel(j0, cols, pb);
            for ip in 0..m.div_ceil(MR) {
                let i0 = ip * MR;
                let tile = (MR.min(m - i0), cols);
                let rows = a_panel(&a, direct, pa, ip, pairs);
                tile_kernel(pairs, rows, bp, 1.0, 0.0, out, (i0, j0), tile);
            }
        }
        trim(pa, pb);
    });
}

/// Columns `j0..j0 + cols` (at most [`NR`]) of the B whose row `q` is at `b.offset(rows[q])`,
/// packed as [`pack_b`] packs one panel (zero past the columns and past k's end).
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_rows_panel(
    (b, rows): (*const u16, &[isize]),
    j0: usize,
    cols: usize,
    out: &mut [u32],
) {
    let k = rows.len();
    // Result element 2i takes the first row's element i, 2i + 1 the second row's (index 32 +
    // i): the pairs of the panel's first 16 columns, then of its last 16.
    let lo = _mm512_set_epi16(
        47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4,
        35, 3, 34, 2, 33, 1, 32, 0,
    );
    let hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for p in 0..k.div_ceil(2) {
        let k0 = b.offset(rows[2 * p]).add(j0);
        let k1 = (2 * p + 1 < k).then(|| b.offset(rows[2 * p + 1]).add(j0));
        let dst = out.as_mut_ptr().add(p * NR);
        if let (NR, Some(k1)) = (cols, k1) {
            let (x0, x1) = (
                _mm512_loadu_si512(k0 as *const _),
                _mm512_loadu_si512(k1 as *const _),
            );
            _mm512_storeu_si512(dst as *mut _, _mm512_permutex2var_epi16(x0, lo, x1));
            _mm512_storeu_si512(dst.add(16) as *mut _, _mm512_permutex2var_epi16(x0, hi, x1));
            continue;
        }
        for j in 0..NR {
            let second = k1.map_or(0, |k1| if j < cols { *k1.add(j) } else { 0 });
            *dst.add(j) = if j < cols {
                pair(*k0.add(j), second)
            } else {
                0
            };
        }
    }
}

/// A bf16 B packed once into the kernel's panels, for products that reuse it (a recurrent
/// layer's weight, multiplied by every step's few rows): [`matmul_f32_packed`] reads it as
/// [`matmul_f32`] reads the B it packs per call.
pub(crate) struct PackedB {
    panels: Vec<u32>,
    k: usize,
    n: usize,
}

impl PackedB {
    /// `b` packed.
    ///
    /// # Safety
    /// `b` is valid for every element its strides address.
    pub(in crate::backend::cpu) unsafe fn new(b: HalfMat) -> PackedB {
        let pairs = b.rows.div_ceil(2);
        let mut panels = vec![0; b.cols.div_ceil(NR) * pairs * NR];
        pack_b(&b, pairs, &mut panels);
        PackedB {
            panels,
            k: b.rows,
            n: b.cols,
        }
    }
}

/// `c = a @ b` (`accumulate`: `c += a @ b`) for a bf16 `a` `[m, k]` and a packed `b` `[k, n]`
/// into an f32 `c` (first element, row and column strides): each element the same f32 sum as
/// [`matmul_f32`]'s, added to `c` with one rounding when accumulating.
///
/// # Safety
/// [`available`]; `a` and `c` as in [`matmul_f32`]; `a.cols == b.k`.
pub(in crate::backend::cpu) unsafe fn matmul_f32_packed(
    a: HalfMat,
    b: &PackedB,
    c: (*mut f32, isize, isize),
    accumulate: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.n);
    assert_eq!(k, b.k, "A's columns are B's rows");
    if m == 0 || n == 0 {
        return;
    }
    let out = if accumulate {
        Out::F32Add(c)
    } else {
        Out::F32(c)
    };
    let pairs = k.div_ceil(2);
    by_panels(a, n, out, |j0, _, _| {
        b.panels.as_ptr().add(j0 / NR * pairs * NR)
    });
}

#[cfg(test)]
mod tests {
    use super::super::{available, matmul_f32};
    use super::*;
    use crate::backend::cpu::half_gemm::tests::{values, view};
    use deferfuse_fusion::ir::DType;

    #[test]
    fn a_b_read_through_row_offsets_gives_the_gathered_matrixs_bits() {
        if !available() {
            eprintln!("no AVX512-BF16 on this core: bf16_gemm is not used here");
            return;
        }
        // Odd and even k (a last pair with a zero), whole and short panels of columns, a short
        // last panel of A's rows, and A read in place or packed (odd k).
        for (m, k, n) in [
            (5, 2, 16),
            (16, 144, 70),
            (9, 33, 32),
            (32, 7, 100),
            (3, 1, 5),
        ] {
            // B's rows lie anywhere in one pool, out of order and overlapping, as a conv's
            // taps do in its grid; a NaN and an infinity among them.
            let pool_len = 3 * k + n + 8;
            let special = |i: usize| match i {
                4 => Some(f32::NAN),
                9 => Some(f32::INFINITY),
                _ => None,
            };
            let pool = values(DType::BF16, pool_len, 5, special);
            let offsets: Vec<isize> = (0..k)
                .map(|q| ((q * 7 + 3) % (3 * k + 8)) as isize)
                .collect();
            let mut gathered: Vec<u16> = offsets
                .iter()
                .flat_map(|&o| pool[o as usize..o as usize + n].to_vec())
                .collect();
            let mut a = values(DType::BF16, m * k, 6, |_| None);
            let va = view(&mut a, m, k, 0);
            let vb = view(&mut gathered, k, n, 0);
            let (mut want, mut got) = (vec![0f32; m * n], vec![1f32; m * n]);
            unsafe {
                matmul_f32(va, vb, (want.as_mut_ptr(), n as isize, 1));
                matmul_f32_b_rows(
                    va,
                    (pool.as_ptr(), &offsets),
                    n,
                    (got.as_mut_ptr(), n as isize, 1),
                );
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                assert!(same, "{m}x{k}x{n} element {i}: {g} want {w}");
            }
        }
    }

    #[test]
    fn a_b_packed_once_gives_matmul_f32s_bits_and_accumulates_with_one_rounding() {
        if !available() {
            return;
        }
        for (m, k, n) in [(16, 128, 512), (5, 7, 33), (4, 64, 40), (9, 2, 16)] {
            let mut a = values(DType::BF16, m * k, 7, |_| None);
            let mut b = values(DType::BF16, k * n, 8, |_| None);
            let (va, vb) = (view(&mut a, m, k, 0), view(&mut b, k, n, 0));
            let packed = unsafe { PackedB::new(vb) };
            let (mut want, mut got) = (vec![0f32; m * n], vec![1f32; m * n]);
            unsafe {
                matmul_f32(va, vb, (want.as_mut_ptr(), n as isize, 1));
                matmul_f32_packed(va, &packed, (got.as_mut_ptr(), n as isize, 1), false);
            }
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "{m}x{k}x{n}"
            );
            let base: Vec<f32> = (0..m * n).map(|i| i as f32 / 7.0 - 3.0).collect();
            let mut acc = base.clone();
            unsafe { matmul_f32_packed(va, &packed, (acc.as_mut_ptr(), n as isize, 1), true) };
            for i in 0..m * n {
                assert_eq!(
                    acc[i].to_bits(),
                    (want[i] + base[i]).to_bits(),
                    "{m}x{k}x{n} [{i}]"
                );
            }
        }
    }
}
