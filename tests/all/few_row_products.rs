//! The summation order of f32 matrix products, which decides their bits: a product whose whole
//! output has at most 4 rows, by a transposed weight (`x @ W.t()`, a Linear at batch 1-4), sums
//! each element as a dot product along W's row; every other product keeps `matrixmultiply`'s
//! order (lanes are output columns, k in order, 256-long k-blocks), because the runtime cuts
//! those into row blocks and a row must get the same bits whichever block computes it. The
//! choice is by the whole product's rows, so it holds in every mode (`run_in_every_mode`
//! checks they agree byte for byte). The dot order needs AVX2 and FMA; elsewhere every product
//! keeps `matrixmultiply`'s order and the dot-order tests have nothing to check.

use crate::harness;

use deferfuse::*;
use harness::{run, tensor, tt, view, Rng};

const K: usize = 300; // two of matrixmultiply's k-blocks; not a multiple of 16
const N: usize = 40;

fn has_dot_order() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Values rounded to f32, of mixed sign and magnitude, so a different order changes bits.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.float(3.0, false) as f32).collect()
}

/// The dot order: two 8-lane sums (k mod 16 below 8, and from 8), `fma` from +0 in k order,
/// added lane by lane, then halves added twice, then the last pair.
fn dot_order(x: &[f32], w: &[f32]) -> f32 {
    let (mut lo, mut hi) = ([0f32; 8], [0f32; 8]);
    for (p, (&a, &b)) in x.iter().zip(w).enumerate() {
        let acc = if p % 16 < 8 { &mut lo } else { &mut hi };
        acc[p % 8] = a.mul_add(b, acc[p % 8]);
    }
    let t: [f32; 8] = std::array::from_fn(|i| lo[i] + hi[i]);
    let u: [f32; 4] = std::array::from_fn(|i| t[i] + t[i + 4]);
    (u[0] + u[2]) + (u[1] + u[3])
}

/// `matrixmultiply`'s order: per 256-long k-block, `fma` from +0 in k order; the blocks added.
fn gemm_order(x: &[f32], w: &[f32]) -> f32 {
    let mut c = 0f32;
    for (i, (xs, ws)) in x.chunks(256).zip(w.chunks(256)).enumerate() {
        let acc = xs
            .iter()
            .zip(ws)
            .fold(0f32, |acc, (&a, &b)| a.mul_add(b, acc));
        c = if i == 0 { acc } else { c + acc };
    }
    c
}

/// `x @ W.t()` for `m` rows in every mode, checked element by element against `order`.
fn check(m: usize, order: fn(&[f32], &[f32]) -> f32) {
    let (xv, wv) = (values(m * K, 1 + m as u64), values(N * K, 2));
    let outs = harness::run_in_every_mode(|rt| {
        let to64 = |v: &[f32]| v.iter().map(|&f| f as f64).collect::<Vec<_>>();
        let x = tensor(rt, DType::F32, &[m, K], &to64(&xv));
        let w = tensor(rt, DType::F32, &[N, K], &to64(&wv));
        let wt = view(rt, w, View::Transpose(0, 1));
        vec![("x @ W.t()".into(), run(rt, Op::Matmul, &[tt(x), tt(wt)]))]
    });
    let got = &outs[0].1.data;
    for i in 0..m {
        for j in 0..N {
            let want = order(&xv[i * K..][..K], &wv[j * K..][..K]);
            assert_eq!(got[i * N + j] as f32, want, "{m} rows: element ({i}, {j})");
        }
    }
}

#[test]
fn one_to_four_rows_by_a_transposed_weight_sum_along_the_weights_rows() {
    if !has_dot_order() {
        return;
    }
    for m in 1..=4 {
        check(m, dot_order);
    }
}

#[test]
fn five_rows_keep_the_order_any_row_block_of_a_larger_product_has() {
    // `gemm_order` is matrixmultiply's FMA kernel's order, which it runs only with AVX2 and FMA.
    if !has_dot_order() {
        return;
    }
    check(5, gemm_order);
}
