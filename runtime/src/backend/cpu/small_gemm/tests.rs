//! `small_gemm`'s tests, and the operand and reference helpers the other GEMM kernels' tests
//! share.

use super::*;

/// A deterministic f32 sequence in [-1, 1), with some exact zeros.
pub(in crate::backend::cpu) fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 11 == 3 {
                0.0
            } else {
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            }
        })
        .collect()
}

/// A matrix of `rows x cols` in a buffer, addressed with the strides given.
pub(in crate::backend::cpu) struct Strided {
    pub(in crate::backend::cpu) data: Vec<f32>,
    pub(in crate::backend::cpu) rs: isize,
    pub(in crate::backend::cpu) cs: isize,
}

/// `rows x cols`: row-major, column-major, a row's one value repeated along it (column
/// stride 0, as an expanded gradient), or every other element of a row-major buffer.
pub(in crate::backend::cpu) fn matrix(rows: usize, cols: usize, kind: &str, seed: u64) -> Strided {
    let (rs, cs, len) = match kind {
        "rows" => (cols as isize, 1, rows * cols),
        "cols" => (1, rows as isize, rows * cols),
        "repeated" => (1, 0, rows),
        _ => (2 * cols as isize, 2, 2 * rows * cols),
    };
    Strided {
        data: values(len, seed),
        rs,
        cs,
    }
}

/// C from this module's `sgemm` and from `matrixmultiply::sgemm` on the same operands; C
/// row-major with column stride `csc` (the elements between its columns hold their start
/// values, which a kernel writing them would change).
pub(in crate::backend::cpu) fn both(
    mkn: (usize, usize, usize),
    layout: (&str, &str),
    alpha_beta: (f32, f32),
    csc: usize,
) -> (Vec<f32>, Vec<f32>) {
    both_with(sgemm, mkn, layout, alpha_beta, csc)
}

/// As [`both`], with `kernel` in place of this module's `sgemm` (a kernel's own tests).
pub(in crate::backend::cpu) fn both_with(
    kernel: SgemmFn,
    (m, k, n): (usize, usize, usize),
    (a_kind, b_kind): (&str, &str),
    (alpha, beta): (f32, f32),
    csc: usize,
) -> (Vec<f32>, Vec<f32>) {
    let a = matrix(m, k, a_kind, 1 + (m * 31 + k) as u64);
    let b = matrix(k, n, b_kind, 2 + (k * 17 + n) as u64);
    let c0 = values(m * n * csc, 3);
    let (mut ours, mut theirs) = (c0.clone(), c0);
    let c = |p: *mut f32| (p, (n * csc) as isize, csc as isize);
    unsafe {
        kernel(
            (m, k, n),
            alpha,
            (a.data.as_ptr(), a.rs, a.cs),
            (b.data.as_ptr(), b.rs, b.cs),
            beta,
            c(ours.as_mut_ptr()),
        );
    }
    reference((m, k, n), alpha, (&a, &b), beta, c(theirs.as_mut_ptr()));
    (ours, theirs)
}

/// `c = alpha * a @ b + beta * c` by `matrixmultiply::sgemm`, the bits every kernel here
/// must give; `c` holds every element its strides address.
pub(in crate::backend::cpu) fn reference(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    (a, b): (&Strided, &Strided),
    beta: f32,
    (c, rsc, csc): (*mut f32, isize, isize),
) {
    // SAFETY: `matrix` made `a` and `b` hold every element their strides address; the
    // caller vouches for `c`.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs,
            a.cs,
            b.data.as_ptr(),
            b.rs,
            b.cs,
            beta,
            c,
            rsc,
            csc,
        );
    }
}

pub(in crate::backend::cpu) fn assert_same_bits(ours: &[f32], theirs: &[f32], what: &str) {
    for (i, (x, y)) in ours.iter().zip(theirs).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}: element {i}: {x} vs {y}");
    }
}

#[test]
fn few_rows_match_matrixmultiply_bit_for_bit_on_every_layout() {
    let layouts = [
        ("rows", "rows"),
        ("rows", "cols"),
        ("cols", "rows"),
        ("gap", "gap"),
    ];
    for m in [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32] {
        for k in [1, 9, 256, 257, 600] {
            for n in [1, 7, 16, 70] {
                for layout in layouts {
                    for (alpha, beta) in [(1.0, 0.0), (1.0, 1.0), (1.0, 0.5), (0.5, 2.0)] {
                        let (ours, theirs) = both((m, k, n), layout, (alpha, beta), 1);
                        let what = format!("{m}x{k}x{n} {layout:?} alpha {alpha} beta {beta}");
                        assert_same_bits(&ours, &theirs, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn narrow_outputs_and_last_panels_match_matrixmultiply_bit_for_bit() {
    // Fewer columns than a tile holds (a depthwise convolution's weight gradient has 9),
    // and the last panel of a wider product, take narrower tiles.
    let layouts = [
        ("rows", "rows"),
        ("rows", "cols"),
        ("repeated", "rows"),
        ("repeated", "cols"),
    ];
    for m in [1, 2, 3, 4, 5, 8, 9, 32] {
        for k in [9, 257, 2048] {
            for n in [2, 3, 8, 9, 15, 17, 33, 65, 71] {
                for layout in layouts {
                    for (alpha, beta) in [(1.0, 0.0), (0.5, 2.0)] {
                        let (ours, theirs) = both((m, k, n), layout, (alpha, beta), 1);
                        let what = format!("{m}x{k}x{n} {layout:?} alpha {alpha} beta {beta}");
                        assert_same_bits(&ours, &theirs, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn a_row_block_here_matches_the_same_rows_of_the_whole_product() {
    // The runtime computes rows 40..45 of a 45-row GEMM on their own (a last block); the
    // whole GEMM's rows 40..45 sit in matrixmultiply's full and partial tiles. (A transposed B
    // of fewer than 64 columns: on AVX-512 cores a wider one leaves this module above 4 rows.)
    let (m, k, n) = (45, 600, 60);
    let a = matrix(m, k, "rows", 5);
    let b = matrix(k, n, "cols", 6);
    let mut whole = vec![0f32; m * n];
    let mut block = vec![0f32; 5 * n];
    unsafe {
        reference(
            (m, k, n),
            1.0,
            (&a, &b),
            0.0,
            (whole.as_mut_ptr(), n as isize, 1),
        );
        assert!(takes_small_path((5, k, n), b.rs, 1.0) || !has_fma_avx2());
        sgemm(
            (5, k, n),
            1.0,
            (a.data.as_ptr().add(40 * k), a.rs, a.cs),
            (b.data.as_ptr(), b.rs, b.cs),
            0.0,
            (block.as_mut_ptr(), n as isize, 1),
        );
    }
    assert_same_bits(&block, &whole[40 * n..], "rows 40..45 of 45");
}

#[test]
fn beta_zero_ignores_what_c_held() {
    // On an AVX-512 core 3 rows take `gemv_avx512`'s transposed kernel (elsewhere this
    // module's), as 2 rows of a large plain B take its row kernel (`gemv_rows_avx2`'s on
    // AVX2 cores); 5 rows take this
    // module's kernel, 13 the packed one (`packed_gemm`).
    for (m, (k, n), b_kind) in [
        (3, (20, 24), "cols"),
        (2, (300, 300), "rows"),
        (5, (20, 24), "cols"),
        (13, (20, 24), "cols"),
    ] {
        let a = matrix(m, k, "rows", 7);
        let b = matrix(k, n, b_kind, 8);
        let mut c = vec![f32::NAN; m * n];
        unsafe {
            sgemm(
                (m, k, n),
                1.0,
                (a.data.as_ptr(), a.rs, a.cs),
                (b.data.as_ptr(), b.rs, b.cs),
                0.0,
                (c.as_mut_ptr(), n as isize, 1),
            );
        }
        assert!(c.iter().all(|x| x.is_finite()), "{m} rows: {c:?}");
    }
}

#[test]
fn scaled_products_of_eight_or_more_rows_stay_with_matrixmultiply() {
    // Its full tiles round alpha * acc + c once, a partial tile twice: only alpha == 1
    // makes them agree, so a scaled product of a full tile's rows is left to it.
    assert!(!takes_small_path((8, 64, 64), 1, 0.5));
    assert!(!takes_small_path((8, 64, 64), 64, 2.0));
}

#[test]
fn five_to_eight_rows_by_a_plain_b_take_the_wide_tile_with_the_same_bits() {
    // On AVX-512 cores these leave this module's 4-row passes for `packed_gemm`'s 16-lane
    // tile, which reads the plain B in place, whatever B's width; the bits stay
    // matrixmultiply's (scaled products of fewer than 8 rows stay here).
    let wide = super::wide_tile_available() && has_fma_avx2();
    for m in 5..=8 {
        for n in [16, 128, 511, 512] {
            assert_eq!(
                takes_small_path((m, 64, n), n as isize, 1.0),
                !wide && has_fma_avx2()
            );
        }
        assert_eq!(takes_small_path((4, 64, 128), 128, 1.0), has_fma_avx2());
        for k in [9, 257] {
            for n in [20, 128, 512, 530] {
                for (alpha, beta) in [(1.0, 0.0), (1.0, 1.0), (1.0, 0.5), (0.5, 2.0)] {
                    let (ours, theirs) = both((m, k, n), ("rows", "rows"), (alpha, beta), 1);
                    let what = format!("{m}x{k}x{n} alpha {alpha} beta {beta}");
                    assert_same_bits(&ours, &theirs, &what);
                }
            }
        }
    }
}

#[test]
fn five_to_thirty_two_rows_by_a_wide_transposed_b_take_the_wide_tile_with_the_same_bits() {
    // On AVX-512 cores a transposed B of 64+ columns leaves this module's transposing passes
    // above 4 rows (an LSTM's hidden product, `h @ W_hh.t()` at batch 16); a narrower one
    // stays up to 32 rows. Either way the bits are matrixmultiply's.
    let wide = super::wide_tile_available() && has_fma_avx2();
    for m in [5, 16, 32] {
        assert_eq!(
            takes_small_path((m, 64, 64), 1, 1.0),
            !wide && has_fma_avx2()
        );
        assert_eq!(takes_small_path((m, 64, 63), 1, 1.0), has_fma_avx2());
        for k in [9, 128, 257] {
            for n in [63, 64, 200, 512] {
                for (alpha, beta) in [(1.0, 0.0), (1.0, 1.0), (0.5, 2.0)] {
                    let (ours, theirs) = both((m, k, n), ("rows", "cols"), (alpha, beta), 1);
                    let what = format!("{m}x{k}x{n} alpha {alpha} beta {beta}");
                    assert_same_bits(&ours, &theirs, &what);
                }
            }
        }
    }
    assert!(!takes_small_path((33, 64, 63), 1, 1.0));
}
