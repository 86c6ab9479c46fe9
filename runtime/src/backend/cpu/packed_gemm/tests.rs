//! `packed_gemm`'s tests: both register tiles against `matrixmultiply`, bit for bit.

use super::*;
use crate::backend::cpu::small_gemm::tests::{
    assert_same_bits, matrix, reference, values, Strided,
};

/// The kernels to test: `false` is the 8-lane one, `true` the 16-lane one where the core
/// has AVX-512 (the 8-lane one first, so the wide one is compared with it).
fn kernels() -> Vec<bool> {
    let mut k = vec![false];
    if avx512::has_avx512() {
        k.push(true);
    }
    k
}

/// C (with strides `(rsc, csc)` into a buffer of `len`) from this module's `sgemm` and from
/// `matrixmultiply::sgemm` on the same operands.
fn both(
    (m, k, n): (usize, usize, usize),
    (a, b): (&Strided, &Strided),
    beta: f32,
    (rsc, csc): (isize, isize),
) -> (Vec<f32>, Vec<f32>) {
    let c0 = values(m * n, 3);
    let (mut ours, mut theirs) = (c0.clone(), c0.clone());
    // Each kernel this core runs: the 8-lane one, and the 16-lane one on AVX-512 cores,
    // whose result must equal the 8-lane one's.
    for wide in kernels() {
        let mut c = c0.clone();
        unsafe {
            sgemm_on(
                wide,
                (m, k, n),
                (a.data.as_ptr(), a.rs, a.cs),
                (b.data.as_ptr(), b.rs, b.cs),
                beta,
                (c.as_mut_ptr(), rsc, csc),
            );
        }
        if wide {
            assert_same_bits(&c, &ours, "the 16-lane kernel against the 8-lane one");
        } else {
            ours = c;
        }
    }
    reference(
        (m, k, n),
        1.0,
        (a, b),
        beta,
        (theirs.as_mut_ptr(), rsc, csc),
    );
    (ours, theirs)
}

/// Every layout of A and B (row-major, column-major as in `x @ W.t()` and `g.t() @ x`, and
/// every other element), beta 0, 1 and other, for the shapes given.
fn check_every_layout(ms: &[usize], ks: &[usize], ns: &[usize]) {
    if !has_fma_avx2() {
        return;
    }
    let kinds = ["rows", "cols", "gap"];
    for &m in ms {
        for &k in ks {
            for &n in ns {
                for a_kind in kinds {
                    for b_kind in kinds {
                        let a = matrix(m, k, a_kind, 1 + (m * 31 + k) as u64);
                        let b = matrix(k, n, b_kind, 2 + (k * 17 + n) as u64);
                        for beta in [0.0, 1.0, 0.5] {
                            let (ours, theirs) = both((m, k, n), (&a, &b), beta, (n as isize, 1));
                            let what = format!("{m}x{k}x{n} A {a_kind} B {b_kind} beta {beta}");
                            assert_same_bits(&ours, &theirs, &what);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn matches_matrixmultiply_bit_for_bit_on_every_layout_and_edge() {
    // Rows: one tile and a partial one, several MC blocks with a partial last tile. k: one
    // product, a partial k-block, several k-blocks. Columns: partial panels only, one full
    // panel and a partial one, several panels.
    check_every_layout(&[8, 13, 79], &[1, 9, 257, 600], &[1, 17, 70]);
}

#[test]
fn matches_matrixmultiply_on_the_wide_kernels_tile_edges() {
    // The 16-lane kernel's 12-row tiles and 96-row blocks (a whole tile, a partial last
    // block), its 32-column panels (one whole, one and a bit), k across a block edge.
    check_every_layout(&[12, 100], &[256, 513], &[32, 65]);
}

#[test]
fn matches_matrixmultiply_across_column_blocks() {
    // More columns than one packed block (NC), with a partial last panel.
    check_every_layout(&[14], &[300], &[NC + 45]);
}

#[test]
fn matches_matrixmultiply_when_a_transposed_is_copied_into_row_tiles() {
    // A column-major A whose columns are `pack_a::PACK_ROWS_MIN_STRIDE` apart is packed;
    // 1030 rows end in a partial MC block and a partial tile, 300 columns in a partial
    // k-block.
    let (m, k, n) = (1030, 300, 20);
    let cs = pack_a::PACK_ROWS_MIN_STRIDE;
    assert!(packs_rows(1, cs) && !packs_rows(1, cs - 1));
    let a = Strided {
        data: values((k - 1) * cs as usize + m, 9),
        rs: 1,
        cs,
    };
    let b = matrix(k, n, "rows", 10);
    for beta in [0.0, 1.0, 0.5] {
        let (ours, theirs) = both((m, k, n), (&a, &b), beta, (n as isize, 1));
        assert_same_bits(&ours, &theirs, &format!("A packed, beta {beta}"));
    }
}

#[test]
fn matches_matrixmultiply_when_a_plain_a_with_rows_4_kib_apart_is_copied_into_row_tiles() {
    // 79 rows end in a partial MC block and a partial tile; k = 1024 is whole blocks of
    // eight k, k = 300 ends in a partial k-block whose last 4 k are copied one by one.
    let (m, n) = (79, 20);
    for k in [1024, 300] {
        let a = Strided {
            data: values(m * 1024, 11),
            rs: 1024,
            cs: 1,
        };
        let b = matrix(k, n, "cols", 12);
        for beta in [0.0, 1.0, 0.5] {
            let (ours, theirs) = both((m, k, n), (&a, &b), beta, (n as isize, 1));
            assert_same_bits(&ours, &theirs, &format!("k {k}, A packed, beta {beta}"));
        }
    }
}

#[test]
fn a_plain_a_is_copied_only_when_its_rows_share_l1_sets() {
    assert!(packs_rows(1024, 1));
    assert!(packs_rows(4096, 1));
    assert!(!packs_rows(1040, 1), "padded rows are read in place");
    assert!(
        !packs_rows(512, 1),
        "2 KiB apart: three rows per set, read in place"
    );
}

#[test]
fn a_plain_b_is_read_in_place_only_while_a_fits_one_row_block() {
    // The layout tests above take both sides: 8 to 79 rows in place (79 above the 8-lane
    // tile's block, copied there), 100 copied on the 16-lane tile.
    assert!(pack_b::reads_in_place(96, 1, 96));
    assert!(!pack_b::reads_in_place(97, 1, 96));
    assert!(
        !pack_b::reads_in_place(8, 2, 96),
        "strided columns are copied"
    );
    assert!(
        !pack_b::reads_in_place(8, 64, 96),
        "a transposed B is copied"
    );
}

#[test]
fn matches_matrixmultiply_with_c_column_major() {
    // The write-back's strided path: every C column is a vector of the tile.
    let (m, k, n) = (20, 40, 33);
    let a = matrix(m, k, "rows", 4);
    let b = matrix(k, n, "cols", 5);
    for beta in [0.0, 0.5] {
        let (ours, theirs) = both((m, k, n), (&a, &b), beta, (1, m as isize));
        assert_same_bits(&ours, &theirs, &format!("C column-major, beta {beta}"));
    }
}

#[test]
fn a_row_block_or_column_block_matches_the_same_part_of_the_whole_product() {
    // The runtime cuts a GEMM into row blocks (epilogues, threads) or column blocks (few
    // rows): rows 30..77 or columns 21..64 computed alone give the whole product's bits.
    let (m, k, n) = (77, 600, 64);
    let a = matrix(m, k, "cols", 6);
    let b = matrix(k, n, "rows", 7);
    let (whole, _) = both((m, k, n), (&a, &b), 0.0, (n as isize, 1));
    let mut rows = vec![0f32; 47 * n];
    let mut cols = vec![0f32; m * 43];
    unsafe {
        sgemm(
            (47, k, n),
            (a.data.as_ptr().offset(30 * a.rs), a.rs, a.cs),
            (b.data.as_ptr(), b.rs, b.cs),
            0.0,
            (rows.as_mut_ptr(), n as isize, 1),
        );
        sgemm(
            (m, k, 43),
            (a.data.as_ptr(), a.rs, a.cs),
            (b.data.as_ptr().offset(21 * b.cs), b.rs, b.cs),
            0.0,
            (cols.as_mut_ptr(), 43, 1),
        );
    }
    assert_same_bits(&rows, &whole[30 * n..], "rows 30..77 of 77");
    let whole_cols: Vec<f32> = (0..m)
        .flat_map(|i| whole[i * n + 21..i * n + 64].to_vec())
        .collect();
    assert_same_bits(&cols, &whole_cols, "columns 21..64 of 64");
}

#[test]
fn scaled_products_and_few_rows_are_not_taken() {
    // alpha != 1: matrixmultiply's full tiles round differently from its partial ones.
    assert!(!takes_packed_path((64, 64, 64), 0.5));
    assert!(!takes_packed_path((MIN_ROWS - 1, 64, 64), 1.0));
    assert_eq!(takes_packed_path((64, 64, 64), 1.0), has_fma_avx2());
}
