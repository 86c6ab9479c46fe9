//! Reductions over leading dims (a bias gradient's `g.sum(0)`, layernorm's weight gradient)
//! run on gathered rows (`backend/cpu/columns.rs`): they must give the bits of the same
//! reduction over a contiguous transposed copy, whose rows the kernel reads directly. Regions
//! that only sum their inputs are summed in place instead (`backend/cpu/column_sums.rs`), in
//! the row kernel's order: the same bits again. Elementwise loops over a transposed input
//! (a transposing copy, an op on `x.t()`) take the gathered rows too: they must give exactly
//! the permuted values, whatever the element size.

mod common;

use common::lanes::{download, runtime, t};
use deferfuse_fusion::ir::{BinaryOp, Op, ReduceOp};
use deferfuse_runtime::{Handle, Input, Runtime, View};

/// Pseudo-random values in [-1, 1) with a few orders of magnitude, so summation order shows.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * u - 1.0) * [1.0, 1e-3, 1e3][i % 3]
        })
        .collect()
}

/// `xs` (row-major `sizes`) with its dims permuted by `perm`, as a new row-major array.
fn permuted(xs: &[f32], sizes: &[usize], perm: &[usize]) -> Vec<f32> {
    let out_sizes: Vec<usize> = perm.iter().map(|&p| sizes[p]).collect();
    let mut strides = vec![1; sizes.len()];
    for d in (0..sizes.len() - 1).rev() {
        strides[d] = strides[d + 1] * sizes[d + 1];
    }
    let mut out = Vec::with_capacity(xs.len());
    let mut idx = vec![0; sizes.len()];
    for _ in 0..xs.len() {
        let at: usize = (0..sizes.len()).map(|d| idx[d] * strides[perm[d]]).sum();
        out.push(xs[at]);
        for d in (0..sizes.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

fn tensor(rt: &Runtime, xs: &[f32], sizes: &[usize]) -> Handle {
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    rt.from_host(&bytes, deferfuse_fusion::ir::DType::F32, sizes)
        .unwrap()
}

fn reduce(rt: &Runtime, op: ReduceOp, x: Handle, dims: &[usize]) -> Handle {
    let op = Op::Reduce {
        op,
        dims: dims.iter().copied().collect(),
        keepdim: false,
    };
    rt.op(0, op, &[t(x)], None).unwrap()
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

/// `f` over `sizes` reducing `dims`, and over the copy whose reduced dims are innermost (and
/// the kept dims first, in order), reducing those: the results must be the same bits.
fn same_bits_as_over_rows(
    sizes: &[usize],
    dims: &[usize],
    f: impl Fn(&Runtime, Handle, &[usize]) -> Handle,
) {
    let xs = values(sizes.iter().product(), 7);
    let kept: Vec<usize> = (0..sizes.len()).filter(|d| !dims.contains(d)).collect();
    let perm: Vec<usize> = kept.iter().chain(dims).copied().collect();
    let t_sizes: Vec<usize> = perm.iter().map(|&p| sizes[p]).collect();
    let t_dims: Vec<usize> = (kept.len()..sizes.len()).collect();
    let n_out: usize = kept.iter().map(|&d| sizes[d]).product();
    let rt = runtime();
    let columns = f(&rt, tensor(&rt, &xs, sizes), dims);
    let rows = f(
        &rt,
        tensor(&rt, &permuted(&xs, sizes, &perm), &t_sizes),
        &t_dims,
    );
    let (a, b) = (
        download::<f32>(&rt, columns, n_out),
        download::<f32>(&rt, rows, n_out),
    );
    assert_eq!(bits(&a), bits(&b), "over columns {a:?}\nover rows {b:?}");
}

#[test]
fn a_sum_over_the_first_dim_gives_the_bits_of_the_sum_over_rows() {
    same_bits_as_over_rows(&[1000, 70], &[0], |rt, x, d| {
        reduce(rt, ReduceOp::Sum, x, d)
    });
}

#[test]
fn a_sum_over_two_leading_dims_gives_the_bits_of_the_sum_over_rows() {
    same_bits_as_over_rows(&[8, 200, 24], &[0, 1], |rt, x, d| {
        reduce(rt, ReduceOp::Sum, x, d)
    });
}

#[test]
fn a_sum_over_a_middle_dim_walks_the_outer_dim_and_gives_the_bits_of_the_sum_over_rows() {
    same_bits_as_over_rows(&[6, 300, 20], &[1], |rt, x, d| {
        reduce(rt, ReduceOp::Sum, x, d)
    });
}

#[test]
fn a_fused_product_then_mean_over_columns_gives_the_bits_over_rows() {
    same_bits_as_over_rows(&[512, 130], &[0], |rt, x, d| {
        let sq = rt
            .op(0, Op::Binary(BinaryOp::Mul), &[t(x), t(x)], None)
            .unwrap();
        reduce(rt, ReduceOp::Mean, sq, d)
    });
}

#[test]
fn two_sums_of_one_input_over_columns_give_the_bits_over_rows() {
    // Layernorm's weight and bias gradients: sum(g * xhat) and sum(g) over the tokens.
    same_bits_as_over_rows(&[16, 64, 48], &[0, 1], |rt, x, d| {
        let sq = rt
            .op(0, Op::Binary(BinaryOp::Mul), &[t(x), t(x)], None)
            .unwrap();
        let (a, b) = (
            reduce(rt, ReduceOp::Sum, sq, d),
            reduce(rt, ReduceOp::Sum, x, d),
        );
        rt.op(0, Op::Binary(BinaryOp::Add), &[t(a), t(b)], None)
            .unwrap()
    });
}

#[test]
fn an_amax_over_columns_gives_the_bits_over_rows() {
    same_bits_as_over_rows(&[700, 33], &[0], |rt, x, d| {
        reduce(rt, ReduceOp::Amax, x, d)
    });
}

#[test]
fn a_column_sum_is_the_sum_within_a_float_tolerance() {
    let (r, c) = (2048, 40);
    let xs = values(r * c, 3);
    let rt = runtime();
    let s = reduce(&rt, ReduceOp::Sum, tensor(&rt, &xs, &[r, c]), &[0]);
    let got = download::<f32>(&rt, s, c);
    for (j, g) in got.iter().enumerate() {
        let want: f64 = (0..r).map(|i| xs[i * c + j] as f64).sum();
        let scale: f64 = (0..r).map(|i| (xs[i * c + j] as f64).abs()).sum();
        assert!(
            ((*g as f64) - want).abs() <= 1e-5 * scale,
            "column {j}: {g} vs {want}"
        );
    }
}

#[test]
fn a_mean_over_the_first_dim_with_a_last_group_of_four_gives_the_bits_over_rows() {
    // 1004 rows: 125 groups of eight, then one of four; 40 columns: two vectors and 8 more.
    same_bits_as_over_rows(&[1004, 40], &[0], |rt, x, d| {
        reduce(rt, ReduceOp::Mean, x, d)
    });
}

#[test]
fn a_sum_and_a_mean_of_one_input_with_a_tail_give_the_bits_over_rows() {
    // 1003 rows: groups of eight, one of four, three left one by one; 17 columns.
    same_bits_as_over_rows(&[1003, 17], &[0], |rt, x, d| {
        let (a, b) = (
            reduce(rt, ReduceOp::Sum, x, d),
            reduce(rt, ReduceOp::Mean, x, d),
        );
        rt.op(0, Op::Binary(BinaryOp::Add), &[t(a), t(b)], None)
            .unwrap()
    });
}

#[test]
fn a_sum_of_few_rows_over_many_columns_gives_the_bits_over_rows() {
    // A position embedding's gradient: 16 rows of 8192 columns, summed in place.
    same_bits_as_over_rows(&[16, 64, 128], &[0], |rt, x, d| {
        reduce(rt, ReduceOp::Sum, x, d)
    });
}

#[test]
fn a_sum_over_more_rows_than_a_gathered_block_holds_gives_the_bits_over_rows() {
    // 140,000 rows: past the gather's scratch bound, still summed in place.
    same_bits_as_over_rows(&[140_000, 17], &[0], |rt, x, d| {
        reduce(rt, ReduceOp::Sum, x, d)
    });
}

/// `xs` (row-major `sizes`) permuted by `perm` on the runtime: a view, then a copy into a
/// contiguous tensor (`x.permute(perm).contiguous()`), downloaded.
fn permuted_on_runtime<T: common::lanes::Elem>(
    xs: &[T],
    sizes: &[usize],
    perm: &[usize],
) -> Vec<T> {
    let rt = runtime();
    let x = common::lanes::upload(&rt, xs);
    let x = rt
        .view(
            0,
            x,
            &View::Reshape(sizes.iter().map(|&s| s as i64).collect()),
        )
        .unwrap();
    let v = rt
        .view(
            0,
            x,
            &View::Permute(perm.iter().map(|&p| p as i64).collect()),
        )
        .unwrap();
    let y = rt.op(0, Op::Copy, &[t(v)], None).unwrap();
    download::<T>(&rt, y, xs.len())
}

/// The same permutation on the host, for any element type.
fn permuted_on_host<T: Copy>(xs: &[T], sizes: &[usize], perm: &[usize]) -> Vec<T> {
    let idx: Vec<f32> = (0..xs.len()).map(|i| i as f32).collect();
    permuted(&idx, sizes, perm)
        .iter()
        .map(|&i| xs[i as usize])
        .collect()
}

#[test]
fn a_transposing_copy_gives_the_transposed_values_including_the_edge_rows_and_columns() {
    // Neither side a multiple of the gather's 8x8 tiles or of a block's rows.
    let (sizes, perm) = ([300, 77], [1, 0]);
    let xs = values(300 * 77, 3);
    let got = permuted_on_runtime(&xs, &sizes, &perm);
    assert_eq!(bits(&got), bits(&permuted(&xs, &sizes, &perm)));
}

#[test]
fn a_copy_to_channels_last_gives_the_permuted_values() {
    let (sizes, perm) = ([3, 64, 9, 10], [0, 2, 3, 1]);
    let xs = values(3 * 64 * 9 * 10, 5);
    let got = permuted_on_runtime(&xs, &sizes, &perm);
    assert_eq!(bits(&got), bits(&permuted(&xs, &sizes, &perm)));
}

#[test]
fn transposing_copies_of_one_and_eight_byte_elements_give_the_transposed_values() {
    let (sizes, perm) = ([130, 70], [1, 0]);
    let n = 130 * 70;
    let bytes: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(
        permuted_on_runtime(&bytes, &sizes, &perm),
        permuted_on_host(&bytes, &sizes, &perm)
    );
    let longs: Vec<i64> = (0..n as i64).map(|i| i * 1_000_003 - 5).collect();
    assert_eq!(
        permuted_on_runtime(&longs, &sizes, &perm),
        permuted_on_host(&longs, &sizes, &perm)
    );
}

#[test]
fn an_op_on_a_transposed_input_gives_the_bits_of_the_op_on_its_transposed_copy() {
    let (sizes, perm) = ([200, 96], [1, 0]);
    let (xs, ys) = (values(200 * 96, 9), values(200 * 96, 11));
    let rt = runtime();
    let x = tensor(&rt, &xs, &sizes);
    let xt = rt.view(0, x, &View::Transpose(0, 1)).unwrap();
    let y = tensor(&rt, &permuted(&ys, &sizes, &perm), &[96, 200]);
    let two = Input::Scalar(deferfuse_fusion::ir::Scalar::Float(2.0));
    let scaled = rt
        .op(0, Op::Binary(BinaryOp::Mul), &[t(xt), two], None)
        .unwrap();
    let got = rt
        .op(0, Op::Binary(BinaryOp::Add), &[t(scaled), t(y)], None)
        .unwrap();
    let want: Vec<f32> = permuted(&xs, &sizes, &perm)
        .iter()
        .zip(permuted(&ys, &sizes, &perm))
        .map(|(a, b)| a * 2.0 + b)
        .collect();
    assert_eq!(bits(&download::<f32>(&rt, got, want.len())), bits(&want));
}
