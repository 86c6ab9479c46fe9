//! The kernel ops (gather, scatter, cumsum/cumprod, argsort, random numbers) against the
//! reference in `reference/kernels.rs`, in strict, debug and defer mode (which must agree bit
//! for bit), over dtypes, ranks, dims and views; their index errors, which surface when the
//! program runs; and the Philox generator's known answer, reproducibility and statistics.

use crate::harness;
use crate::reference;

use deferfuse::fusion::ir::{KernelOp, RandomDist, ScanOp, ScatterReduce};
use deferfuse::fusion::plan::CutReason;
use deferfuse::runtime::backend::host_kernels::philox4x32_10;
use deferfuse::{DType, Error, Handle, Input, Mode, Op, Runtime, Scalar, View};
use harness::*;
use reference::kernels::{self as refk, ScatterSrc};
use reference::RefTensor;

/// Shapes of rank 1 to 3 (one with a size-1 dim).
const SHAPES: [&[usize]; 4] = [&[7], &[4, 5], &[3, 1, 4], &[2, 3, 4]];

fn random(dist: RandomDist, sizes: &[usize], dtype: DType) -> Op {
    Op::Kernel(KernelOp::Random {
        dist,
        sizes: sizes.into(),
        dtype,
    })
}

/// An index tensor of `sizes` whose values are in `[0, bound)`, of int64 or int32.
fn index(rng: &mut Rng, sizes: &[usize], bound: usize, dtype: DType) -> RefTensor {
    let n = sizes.iter().product();
    let v = (0..n)
        .map(|_| rng.int(0, bound as i64 - 1) as f64)
        .collect();
    RefTensor::new(dtype, sizes, v)
}

/// `sizes` with each dim but `dim` shrunk at random (torch lets an index be smaller there).
fn smaller(rng: &mut Rng, sizes: &[usize], dim: usize, along: usize) -> Vec<usize> {
    let mut s: Vec<usize> = sizes
        .iter()
        .map(|&n| rng.int(1, n as i64) as usize)
        .collect();
    s[dim] = along;
    s
}

fn assert_equal(ctx: &str, got: &RefTensor, want: &RefTensor) {
    compare(ctx, got, want, EXACT, None).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn gather_matches_the_reference_for_every_dtype_rank_dim_and_layout() {
    let mut rng = Rng::new(11);
    for &dtype in &DType::ALL {
        for sizes in SHAPES {
            for dim in 0..sizes.len() {
                let src = rng.tensor(dtype, sizes, 8.0, 50, true);
                let idx_dtype = rng.pick(&[DType::I64, DType::I32]);
                let along = rng.int(1, 6) as usize;
                let isizes = smaller(&mut rng, sizes, dim, along);
                let idx = index(&mut rng, &isizes, sizes[dim], idx_dtype);
                let want = refk::gather(&src, dim, &idx);
                let p = rng.pick(&PLACES);
                let q = rng.pick(&PLACES);
                let out = run_in_every_mode(|rt| {
                    let s = place(rt, &src, p);
                    let i = place(rt, &idx, q);
                    vec![("gather".into(), run(rt, gather(dim), &[tt(s), tt(i)]))]
                });
                let ctx = format!("gather {dtype} {sizes:?} dim {dim} {p:?}/{q:?}");
                assert_equal(&ctx, &out[0].1, &want);
            }
        }
    }
}

#[test]
fn gather_with_an_expanded_index_is_index_select_and_embedding() {
    // embedding: rows of a [10, 4] table picked by a [6] index, expanded to [6, 4] (stride 0).
    let mut rng = Rng::new(5);
    let table = rng.tensor(DType::F32, &[10, 4], 3.0, 0, false);
    let ids = index(&mut rng, &[6], 10, DType::I64);
    let out = run_in_every_mode(|rt| {
        let t = upload(rt, &table);
        let i = upload(rt, &ids);
        let col = view(rt, i, View::Unsqueeze(1));
        let wide = view(rt, col, View::Expand(vec![6, 4]));
        vec![("embedding".into(), run(rt, gather(0), &[tt(t), tt(wide)]))]
    });
    let want: Vec<f64> = ids
        .data
        .iter()
        .flat_map(|&r| (0..4).map(move |c| (r as usize, c)))
        .map(|(r, c)| table.at(&[r, c]))
        .collect();
    assert_eq!(out[0].1.data, want);
}

#[test]
fn scatter_matches_the_reference_for_every_reduce_and_dtype() {
    let mut rng = Rng::new(23);
    let reduces = ScatterReduce::ALL;
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ] {
        for &reduce in &reduces {
            for include_self in [true, false] {
                let sizes: &[usize] = rng.pick(&SHAPES[1..]);
                let dim = rng.int(0, sizes.len() as i64 - 1) as usize;
                let this = rng.tensor(dtype, sizes, 4.0, 6, false);
                // More index rows than the dim has: duplicates are certain.
                let isizes = smaller(&mut rng, sizes, dim, sizes[dim] + 3);
                let mut ssizes = isizes.clone();
                ssizes[dim] += 1;
                let idx_dtype = rng.pick(&[DType::I64, DType::I32]);
                let idx = index(&mut rng, &isizes, sizes[dim], idx_dtype);
                let src = rng.tensor(dtype, &ssizes, 4.0, 6, false);
                let value = 1.5;
                let op = scatter(dim, reduce, include_self);
                let out = run_in_every_mode(|rt| {
                    let t = place(rt, &this, Place::Transposed);
                    let i = place(rt, &idx, Place::Strided);
                    let s = place(rt, &src, Place::Contig);
                    vec![
                        ("tensor".into(), run(rt, op.clone(), &[tt(t), tt(i), tt(s)])),
                        (
                            "value".into(),
                            run(rt, op.clone(), &[tt(t), tt(i), fs(value)]),
                        ),
                    ]
                });
                let ctx =
                    format!("scatter {reduce:?} self={include_self} {dtype} {sizes:?} dim {dim}");
                let want = refk::scatter(
                    &this,
                    dim,
                    &idx,
                    ScatterSrc::Tensor(&src),
                    reduce,
                    include_self,
                );
                assert_equal(&format!("{ctx} (src)"), &out[0].1, &want);
                let want = refk::scatter(
                    &this,
                    dim,
                    &idx,
                    ScatterSrc::Value(value),
                    reduce,
                    include_self,
                );
                assert_equal(&format!("{ctx} (value)"), &out[1].1, &want);
            }
        }
    }
}

#[test]
fn scatter_add_with_an_expanded_index_is_index_add() {
    // index_add_(0, ids, src) on a [5, 3] tensor: ids [4] expanded to [4, 3].
    let this = RefTensor::new(DType::F32, &[5, 3], (0..15).map(f64::from).collect());
    let src = RefTensor::new(
        DType::F32,
        &[4, 3],
        (0..12).map(|v| v as f64 * 0.5).collect(),
    );
    let ids = RefTensor::new(DType::I64, &[4], vec![1.0, 4.0, 1.0, 0.0]);
    let out = run_in_every_mode(|rt| {
        let (t, s, i) = (upload(rt, &this), upload(rt, &src), upload(rt, &ids));
        let col = view(rt, i, View::Unsqueeze(1));
        let wide = view(rt, col, View::Expand(vec![4, 3]));
        let op = scatter(0, ScatterReduce::Sum, true);
        vec![("index_add".into(), run(rt, op, &[tt(t), tt(wide), tt(s)]))]
    });
    let mut want = this.data.clone();
    for (k, &r) in ids.data.iter().enumerate() {
        for c in 0..3 {
            want[r as usize * 3 + c] += src.data[k * 3 + c];
        }
    }
    assert_eq!(out[0].1.data, want);
}

/// A wide scatter (`KernelOp::Scatter::wide`) of `src` into `this` along dim 0 of a 1-D
/// tensor, in every mode.
fn wide_scatter(
    this: &RefTensor,
    ids: &RefTensor,
    src: &RefTensor,
    r: ScatterReduce,
    with_self: bool,
) -> RefTensor {
    let out = run_in_every_mode(|rt| {
        let (t, s, i) = (upload(rt, this), upload(rt, src), upload(rt, ids));
        let op = Op::Kernel(KernelOp::Scatter {
            dim: 0,
            reduce: r,
            include_self: with_self,
            wide: true,
        });
        vec![("wide".into(), run(rt, op, &[tt(t), tt(i), tt(s)]))]
    });
    out[0].1.clone()
}

#[test]
fn a_wide_half_scatter_sums_in_float32_and_rounds_each_element_once() {
    // 2000 x 0.1 into element 0: rounding every step stalls at 32 in bfloat16 (256 steps of
    // 0.125); summed in float32 and rounded once it is 200. Element 1 takes nothing and keeps
    // its value; a product and a mean as well.
    let n = 2000;
    let ids = RefTensor::new(DType::I64, &[n], vec![0.0; n]);
    for dtype in [DType::BF16, DType::F16] {
        let this = RefTensor::new(dtype, &[2], vec![0.0, 7.0]);
        let tenth = RefTensor::new(dtype, &[n], vec![0.1; n]);
        let sum = wide_scatter(&this, &ids, &tenth, ScatterReduce::Sum, true);
        assert_eq!(sum.data, vec![200.0, 7.0], "{dtype} sum");
        let stepped = run_in_every_mode(|rt| {
            let (t, s, i) = (upload(rt, &this), upload(rt, &tenth), upload(rt, &ids));
            let op = scatter(0, ScatterReduce::Sum, true);
            vec![("narrow".into(), run(rt, op, &[tt(t), tt(i), tt(s)]))]
        });
        // Rounding every step: 32 in bfloat16, 230.125 in float16.
        assert_ne!(
            stepped[0].1.data[0], 200.0,
            "{dtype}: the narrow sum rounds each step"
        );
        let round = |v: f64| match dtype {
            DType::BF16 => half::bf16::from_f64(v).to_f64(),
            _ => half::f16::from_f64(v).to_f64(),
        };
        // The mean divides the rounded sum by the count rounded to the dtype (2000 is exact).
        let mean = wide_scatter(&this, &ids, &tenth, ScatterReduce::Mean, false);
        assert_eq!(mean.data, vec![round(0.1f32 as f64), 7.0], "{dtype} mean");
        // 1.01^50 in float32, rounded once.
        let ids50 = RefTensor::new(DType::I64, &[50], vec![0.0; 50]);
        let grow = RefTensor::new(dtype, &[50], vec![1.01; 50]);
        let one = RefTensor::new(dtype, &[2], vec![1.0, 1.0]);
        let prod = wide_scatter(&one, &ids50, &grow, ScatterReduce::Prod, true);
        let g = grow.data[0] as f32;
        let want = (0..50).fold(1f32, |a, _| a * g) as f64;
        assert_eq!(prod.data, vec![round(want), 1.0], "{dtype} prod");
    }
}

#[test]
fn a_wide_scatter_leaves_float32_alone() {
    // Only the half types widen: float32 sums as the narrow scatter does, bit for bit.
    let mut rng = Rng::new(41);
    let this = rng.tensor(DType::F32, &[6], 2.0, 0, false);
    let src = rng.tensor(DType::F32, &[40], 2.0, 0, false);
    let ids = index(&mut rng, &[40], 6, DType::I64);
    let wide = wide_scatter(&this, &ids, &src, ScatterReduce::Sum, true);
    let want = refk::scatter(
        &this,
        0,
        &ids,
        ScatterSrc::Tensor(&src),
        ScatterReduce::Sum,
        true,
    );
    assert_equal("f32", &wide, &want);
}

/// The reductions (and `include_self`) the scatter's row paths take, each checked against the
/// element walk's reference.
const ROW_REDUCTIONS: [(ScatterReduce, bool); 6] = [
    (ScatterReduce::Sum, true),
    (ScatterReduce::Assign, true),
    (ScatterReduce::Sum, false),
    (ScatterReduce::Amax, true),
    (ScatterReduce::Amax, false),
    (ScatterReduce::Amin, false),
];

/// `ids` of `n` rows expanded over a row of `width`, as embedding's backward and `index_add`
/// pass it, and the same index materialized for the reference.
fn expanded_ids(rng: &mut Rng, n: usize, width: usize, bound: usize) -> (RefTensor, RefTensor) {
    let ids = index(rng, &[n], bound, DType::I64);
    let dense = RefTensor::new(
        DType::I64,
        &[n, width],
        ids.data
            .iter()
            .flat_map(|&v| std::iter::repeat_n(v, width))
            .collect(),
    );
    (ids, dense)
}

fn expand_rows(rt: &Runtime, ids: Handle, n: usize, width: usize) -> Handle {
    let col = view(rt, ids, View::Unsqueeze(1));
    view(rt, col, View::Expand(vec![n as i64, width as i64]))
}

#[test]
fn row_scatters_with_an_expanded_index_round_each_step_as_the_element_walk() {
    // Many duplicate rows of values of every magnitude: the sum's order and its rounding at
    // each step show in the bits. Width 37 leaves a remainder after any vector width.
    let mut rng = Rng::new(41);
    for dtype in [DType::F32, DType::F64, DType::I64] {
        let (n, width, rows) = (40, 37, 6);
        let this = rng.tensor(dtype, &[rows, width], 1e3, 0, false);
        let src = rng.tensor(dtype, &[n, width], 1e3, 0, false);
        let (ids, dense) = expanded_ids(&mut rng, n, width, rows);
        for (reduce, with_self) in ROW_REDUCTIONS {
            for p in PLACES {
                let out = run_in_every_mode(|rt| {
                    let t = place(rt, &this, p);
                    let wide = expand_rows(rt, upload(rt, &ids), n, width);
                    let s = upload(rt, &src);
                    let op = scatter(0, reduce, with_self);
                    vec![("rows".into(), run(rt, op, &[tt(t), tt(wide), tt(s)]))]
                });
                let src_ = ScatterSrc::Tensor(&src);
                let want = refk::scatter(&this, 0, &dense, src_, reduce, with_self);
                assert_equal(
                    &format!("{reduce:?} {with_self} {dtype} {p:?}"),
                    &out[0].1,
                    &want,
                );
            }
        }
    }
}

#[test]
fn scatters_along_the_last_dim_round_each_step_as_the_element_walk() {
    // Bilinear interpolation's backward along the width: a wider source summed into each row
    // at an index every row shares (expanded) or each row has its own, or in runs of one
    // target; duplicates in every row.
    let mut rng = Rng::new(47);
    for dtype in [DType::F32, DType::F64, DType::I64] {
        let (rows, width, n) = (6, 13, 29);
        let this = rng.tensor(dtype, &[rows, width], 1e3, 0, false);
        let src = rng.tensor(dtype, &[rows, n], 1e3, 0, false);
        let row_ids = index(&mut rng, &[n], width, DType::I64);
        let shared = RefTensor::new(DType::I64, &[rows, n], row_ids.data.repeat(rows));
        let own = index(&mut rng, &[rows, n], width, DType::I32);
        // Runs of two (nearest upsampling's backward): each target takes consecutive values.
        let runs = RefTensor::new(
            DType::I64,
            &[rows, n],
            (0..rows * n)
                .map(|e| ((e % n) / 2 % width) as f64)
                .collect(),
        );
        for (reduce, with_self) in ROW_REDUCTIONS {
            for p in PLACES {
                let out = run_in_every_mode(|rt| {
                    let t = place(rt, &this, p);
                    let s = place(rt, &src, p);
                    let row = view(rt, upload(rt, &row_ids), View::Unsqueeze(0));
                    let wide = view(rt, row, View::Expand(vec![rows as i64, n as i64]));
                    let op = scatter(1, reduce, with_self);
                    let (o, r) = (upload(rt, &own), upload(rt, &runs));
                    vec![
                        (
                            "shared".into(),
                            run(rt, op.clone(), &[tt(t), tt(wide), tt(s)]),
                        ),
                        ("own".into(), run(rt, op.clone(), &[tt(t), tt(o), tt(s)])),
                        ("runs".into(), run(rt, op, &[tt(t), tt(r), tt(s)])),
                    ]
                });
                for (k, ids) in [&shared, &own, &runs].into_iter().enumerate() {
                    let src_ = ScatterSrc::Tensor(&src);
                    let want = refk::scatter(&this, 1, ids, src_, reduce, with_self);
                    assert_equal(
                        &format!("{reduce:?} {with_self} {dtype} {p:?} {}", out[k].0),
                        &out[k].1,
                        &want,
                    );
                }
            }
        }
    }
}

#[test]
fn gathers_along_a_dim_shorter_than_the_last_match_the_reference_in_every_layout() {
    // nll_loss2d's pick of one class per pixel: the index is short along the gathered dim and
    // long along the last, so the kernel walks the last dim (each index position reading at
    // its own value along `dim`).
    let mut rng = Rng::new(61);
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::U8, DType::I64] {
        let src = rng.tensor(dtype, &[2, 5, 3, 11], 50.0, 50, false);
        for along in [1, 2] {
            let idx_dtype = rng.pick(&[DType::I64, DType::I32]);
            let idx = index(&mut rng, &[2, along, 3, 11], 5, idx_dtype);
            let want = refk::gather(&src, 1, &idx);
            for (p, q) in PLACES.iter().zip(PLACES.iter().rev()) {
                let out = run_in_every_mode(|rt| {
                    let s = place(rt, &src, *p);
                    let i = place(rt, &idx, *q);
                    vec![("gather".into(), run(rt, gather(1), &[tt(s), tt(i)]))]
                });
                let ctx = format!("gather {dtype} along {along} {p:?}/{q:?}");
                assert_equal(&ctx, &out[0].1, &want);
            }
        }
    }
}

#[test]
fn row_gathers_with_an_expanded_index_match_the_reference_in_every_layout() {
    let mut rng = Rng::new(43);
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64] {
        let (n, width, rows) = (9, 13, 5);
        let table = rng.tensor(dtype, &[rows, width], 50.0, 50, false);
        let (ids, dense) = expanded_ids(&mut rng, n, width, rows);
        for p in PLACES {
            let out = run_in_every_mode(|rt| {
                let t = place(rt, &table, p);
                let wide = expand_rows(rt, upload(rt, &ids), n, width);
                vec![("rows".into(), run(rt, gather(0), &[tt(t), tt(wide)]))]
            });
            let want = refk::gather(&table, 0, &dense);
            assert_equal(&format!("gather {dtype} {p:?}"), &out[0].1, &want);
        }
    }
}

#[test]
fn gathers_whose_rows_share_one_index_row_match_the_reference_in_every_layout() {
    // index_select and flip reach gather with one index row expanded over every other dim:
    // along the last dim (a reversed row, flip's, and an arbitrary one with repeats) and along
    // a middle dim, whose trailing dims are copied as one block per index value.
    let mut rng = Rng::new(53);
    let sizes = [3, 4, 5];
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::U8] {
        let src = rng.tensor(dtype, &sizes, 50.0, 50, false);
        for (dim, row) in [
            (2, vec![4.0, 3.0, 2.0, 1.0, 0.0]),
            (2, vec![1.0, 1.0, 4.0, 0.0, 2.0, 3.0, 0.0]),
            (1, vec![3.0, 2.0, 1.0, 0.0]),
            (1, vec![2.0, 0.0, 2.0]),
        ] {
            let mut isizes = sizes.to_vec();
            isizes[dim] = row.len();
            let n: usize = isizes.iter().product();
            let stride: usize = isizes[dim + 1..].iter().product();
            let dense = RefTensor::new(
                DType::I64,
                &isizes,
                (0..n).map(|e| row[e / stride % row.len()]).collect(),
            );
            let ids = RefTensor::new(DType::I64, &[row.len()], row.clone());
            let want = refk::gather(&src, dim, &dense);
            for p in PLACES {
                let out = run_in_every_mode(|rt| {
                    let s = place(rt, &src, p);
                    let mut i = upload(rt, &ids);
                    for d in 0..3 {
                        if d != dim {
                            i = view(rt, i, View::Unsqueeze(d as i64));
                        }
                    }
                    let wide = isizes.iter().map(|&k| k as i64).collect();
                    let i = view(rt, i, View::Expand(wide));
                    vec![("shared".into(), run(rt, gather(dim), &[tt(s), tt(i)]))]
                });
                let ctx = format!("gather {dtype} dim {dim} {row:?} {p:?}");
                assert_equal(&ctx, &out[0].1, &want);
            }
        }
    }
}

#[test]
fn scatter_into_self_through_out_updates_the_tensor_and_its_aliases() {
    let this = RefTensor::new(DType::F64, &[2, 4], (0..8).map(f64::from).collect());
    let idx = RefTensor::new(DType::I64, &[2, 2], vec![3.0, 0.0, 1.0, 1.0]);
    let src = RefTensor::new(DType::F64, &[2, 2], vec![10.0, 20.0, 30.0, 40.0]);
    let out = run_in_every_mode(|rt| {
        let (t, i, s) = (upload(rt, &this), upload(rt, &idx), upload(rt, &src));
        let alias = view(rt, t, View::Transpose(0, 1));
        let op = scatter(1, ScatterReduce::Sum, true);
        let r = rt.op(0, op, &[tt(t), tt(i), tt(s)], Some(t)).unwrap();
        assert_eq!(r, t, "an in-place op returns its out handle");
        vec![("self".into(), t), ("alias".into(), alias)]
    });
    let want = refk::scatter(
        &this,
        1,
        &idx,
        ScatterSrc::Tensor(&src),
        ScatterReduce::Sum,
        true,
    );
    assert_equal("scatter_", &out[0].1, &want);
    assert_eq!(out[1].1.data, [20.0, 4.0, 1.0, 75.0, 2.0, 6.0, 13.0, 7.0]);
}

#[test]
fn cumsum_and_cumprod_match_the_reference_with_torch_result_dtypes() {
    let mut rng = Rng::new(31);
    for &dtype in &DType::ALL {
        for sizes in SHAPES {
            for dim in 0..sizes.len() {
                for op in ScanOp::ALL {
                    let mut x = rng.tensor(dtype, sizes, 1.5, 3, false);
                    if dtype == DType::U8 {
                        // Small factors: a product of 255s leaves f64's exact integers.
                        x.data.iter_mut().for_each(|v| *v %= 5.0);
                    }
                    let cast = rng.pick(&[
                        None,
                        None,
                        Some(DType::F64),
                        Some(DType::F16),
                        Some(DType::I32),
                    ]);
                    let k = Op::Kernel(KernelOp::Scan {
                        op,
                        dim,
                        dtype: cast,
                    });
                    let p = rng.pick(&PLACES);
                    let out = run_in_every_mode(|rt| {
                        let h = place(rt, &x, p);
                        vec![("scan".into(), run(rt, k.clone(), &[tt(h)]))]
                    });
                    let ctx = format!("{op:?} {dtype} {sizes:?} dim {dim} dtype={cast:?} {p:?}");
                    assert_equal(&ctx, &out[0].1, &refk::scan(&x, dim, op, cast));
                }
            }
        }
    }
}

#[test]
fn integer_cumsum_is_int64_and_a_cumsum_into_a_wider_out_converts() {
    let x = RefTensor::new(DType::U8, &[4], vec![200.0, 100.0, 255.0, 1.0]);
    let f = RefTensor::new(DType::F32, &[3], vec![0.5, 0.25, 1.0]);
    let out = run_in_every_mode(|rt| {
        let k = Op::Kernel(KernelOp::Scan {
            op: ScanOp::Sum,
            dim: 0,
            dtype: None,
        });
        let sum = run(rt, k.clone(), &[tt(upload(rt, &x))]);
        let wide = upload(rt, &RefTensor::new(DType::F64, &[3], vec![9.0; 3]));
        rt.op(0, k, &[tt(upload(rt, &f))], Some(wide)).unwrap();
        vec![("u8".into(), sum), ("out".into(), wide)]
    });
    assert_eq!(
        (out[0].1.dtype, out[0].1.data.clone()),
        (DType::I64, vec![200.0, 300.0, 555.0, 556.0])
    );
    assert_eq!(
        (out[1].1.dtype, out[1].1.data.clone()),
        (DType::F64, vec![0.5, 0.75, 1.75])
    );
}

#[test]
fn argsort_is_stable_puts_nan_last_and_matches_the_reference() {
    let mut rng = Rng::new(47);
    for &dtype in &DType::ALL {
        for sizes in SHAPES {
            for dim in 0..sizes.len() {
                for descending in [false, true] {
                    // Few distinct values: ties everywhere, so stability is tested.
                    let x = rng.tensor(dtype, sizes, 1.0, 2, true);
                    let k = Op::Kernel(KernelOp::Sort {
                        dim,
                        descending,
                        limit: None,
                    });
                    let p = rng.pick(&PLACES);
                    let out = run_in_every_mode(|rt| {
                        let h = place(rt, &x, p);
                        vec![("argsort".into(), run(rt, k.clone(), &[tt(h)]))]
                    });
                    let ctx =
                        format!("argsort {dtype} {sizes:?} dim {dim} desc={descending} {p:?}");
                    assert_equal(&ctx, &out[0].1, &refk::argsort(&x, dim, descending));
                }
            }
        }
    }
    let x = RefTensor::new(DType::F32, &[5], vec![f64::NAN, 1.0, -0.0, 0.0, -1.0]);
    assert_eq!(refk::argsort(&x, 0, false).data, [4.0, 2.0, 3.0, 1.0, 0.0]);
}

/// The first `k` positions of `t` along `dim`.
fn first_along(t: &RefTensor, dim: usize, k: usize) -> RefTensor {
    let n = t.sizes[dim];
    let inner: usize = t.sizes[dim + 1..].iter().product();
    let mut sizes = t.sizes.clone();
    sizes[dim] = k;
    let data = t
        .data
        .chunks(n * inner)
        .flat_map(|block| block[..k * inner].iter().copied())
        .collect();
    RefTensor::new(t.dtype, &sizes, data)
}

#[test]
fn argsort_with_a_limit_gives_the_first_positions_of_the_stable_sort() {
    // Short rows (a selection), long ones (a sorted buffer while the row streams by: k at most
    // a 32nd of the row), ties everywhere, NaN, -0.0 and 0.0; k from one to the whole row.
    let mut rng = Rng::new(53);
    let shapes: [&[usize]; 4] = [&[7], &[4, 5], &[3, 1, 4], &[3, 700]];
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64, DType::I32] {
        for sizes in shapes {
            for dim in 0..sizes.len() {
                let n = sizes[dim];
                for descending in [false, true] {
                    for k in [1, 2, n / 32, n / 2, n]
                        .into_iter()
                        .filter(|&k| (1..=n).contains(&k))
                    {
                        let x = rng.tensor(dtype, sizes, 1.0, 3, true);
                        let op = Op::Kernel(KernelOp::Sort {
                            dim,
                            descending,
                            limit: Some(k),
                        });
                        let out = run_in_every_mode(|rt| {
                            let h = upload(rt, &x);
                            vec![("topk".into(), run(rt, op.clone(), &[tt(h)]))]
                        });
                        let want = first_along(&refk::argsort(&x, dim, descending), dim, k);
                        let ctx = format!(
                            "argsort {dtype} {sizes:?} dim {dim} desc={descending} first {k}"
                        );
                        assert_equal(&ctx, &out[0].1, &want);
                    }
                }
            }
        }
    }
}

#[test]
fn argsort_with_a_limit_past_the_dim_is_refused_naming_both() {
    let rt = runtime(Mode::Strict);
    let x = tensor(&rt, DType::F32, &[2, 3], &[1.0; 6]);
    let op = Op::Kernel(KernelOp::Sort {
        dim: 1,
        descending: true,
        limit: Some(4),
    });
    let e = rt.op(0, op, &[tt(x)], None).unwrap_err().to_string();
    assert!(
        e.contains("limit") && e.contains("at most 3") && e.contains('4'),
        "{e}"
    );
}

#[test]
fn philox_matches_the_random123_known_answer() {
    assert_eq!(
        philox4x32_10([0; 4], [0; 2]),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
}

/// Draws `sizes` values on `rt`.
fn draw(
    rt: &Runtime,
    dist: RandomDist,
    sizes: &[usize],
    dtype: DType,
    seed: i64,
    offset: i64,
) -> Handle {
    run(rt, random(dist, sizes, dtype), &[is(seed), is(offset)])
}

#[test]
fn random_values_depend_only_on_seed_offset_and_position() {
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for dist in RandomDist::ALL {
            let out = run_in_every_mode_raw(|rt| {
                vec![
                    ("a".into(), draw(rt, dist, &[37], dtype, 7, 0)),
                    ("again".into(), draw(rt, dist, &[37], dtype, 7, 0)),
                    ("prefix".into(), draw(rt, dist, &[5], dtype, 7, 0)),
                    ("shaped".into(), draw(rt, dist, &[37, 1], dtype, 7, 0)),
                    ("offset".into(), draw(rt, dist, &[37], dtype, 7, 1)),
                    ("seed".into(), draw(rt, dist, &[37], dtype, 8, 0)),
                ]
            });
            let bytes = |k: usize| &out[k].1 .2;
            let ctx = format!("{dist:?} {dtype}");
            assert_eq!(bytes(0), bytes(1), "{ctx}: the same draw twice");
            assert_eq!(
                &bytes(0)[..bytes(2).len()],
                &bytes(2)[..],
                "{ctx}: a shorter draw is a prefix"
            );
            assert_eq!(bytes(0), bytes(3), "{ctx}: the shape does not matter");
            assert_ne!(bytes(0), bytes(4), "{ctx}: another offset");
            assert_ne!(bytes(0), bytes(5), "{ctx}: another seed");
        }
    }
}

#[test]
fn random_values_have_the_distributions_mean_and_variance() {
    let rt = runtime(Mode::Strict);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (dist, mean, var) in [
            (RandomDist::Uniform, 0.5, 1.0 / 12.0),
            (RandomDist::Normal, 0.0, 1.0),
        ] {
            let v = download(&rt, draw(&rt, dist, &[100_000], dtype, 1234, 5)).data;
            let m = v.iter().sum::<f64>() / v.len() as f64;
            let s = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
            // 1e5 samples: the standard error of the mean is sqrt(var / 1e5) < 0.0032.
            assert!((m - mean).abs() < 0.015, "{dist:?} {dtype}: mean {m}");
            assert!(
                (s - var).abs() < 0.04 * var,
                "{dist:?} {dtype}: variance {s}"
            );
            if dist == RandomDist::Uniform {
                assert!(
                    v.iter().all(|&x| (0.0..1.0).contains(&x)),
                    "{dtype}: outside [0, 1)"
                );
            } else {
                assert!(
                    v.iter().all(|x| x.is_finite()),
                    "{dtype}: a non-finite normal"
                );
            }
        }
    }
}

#[test]
fn kernel_ops_are_cut_out_of_fused_loops_as_unfusable() {
    let rt = runtime(Mode::Defer);
    let x = tensor(&rt, DType::F32, &[4], &[3.0, 1.0, 2.0, 0.0]);
    let y = bin(&rt, deferfuse::BinaryOp::Mul, tt(x), fs(2.0));
    let order = run(
        &rt,
        Op::Kernel(KernelOp::Sort {
            dim: 0,
            descending: false,
            limit: None,
        }),
        &[tt(y)],
    );
    let back = run(&rt, gather(0), &[tt(y), tt(order)]);
    let z = bin(&rt, deferfuse::BinaryOp::Add, tt(back), fs(1.0));
    assert_eq!(download(&rt, z).data, [1.0, 3.0, 5.0, 7.0]);
    assert!(rt.stats().cuts[CutReason::Unfusable as usize] >= 1);
}

// ---- errors ----

/// A [2, 5] source and a [2, 2] index holding `bad` at [1, 0].
fn bad_gather(rt: &Runtime, bad: f64) -> deferfuse::runtime::Result<Handle> {
    let src = tensor(rt, DType::F32, &[2, 5], &[1.0; 10]);
    let idx = tensor(rt, DType::I64, &[2, 2], &[0.0, 4.0, bad, 1.0]);
    rt.op(0, gather(1), &[tt(src), tt(idx)], None)
}

fn assert_index_error(e: &Error, msg: &str) {
    assert!(matches!(e, Error::IndexOutOfBounds(_)), "{e:?}");
    assert_eq!(e.to_string(), msg);
    assert_eq!(e.status(), deferfuse::Status::BadOp);
}

#[test]
fn an_out_of_range_index_fails_at_the_op_in_debug_mode() {
    let rt = runtime(Mode::Debug);
    for (bad, msg) in [
        (
            7.0,
            "gather: index 7 is out of bounds for dim 1 with size 5",
        ),
        (
            -1.0,
            "gather: index -1 is out of bounds for dim 1 with size 5",
        ),
    ] {
        assert_index_error(&bad_gather(&rt, bad).unwrap_err(), msg);
    }
    let ok = bad_gather(&rt, 2.0).unwrap();
    assert_eq!(download(&rt, ok).data, [1.0; 4], "the runtime stays usable");
}

#[test]
fn an_out_of_range_index_fails_every_later_use_in_strict_and_defer_mode() {
    for mode in [Mode::Strict, Mode::Defer] {
        let rt = runtime(mode);
        let g = bad_gather(&rt, 7.0).expect("recorded: the index is only read when it runs");
        let msg = "gather: index 7 is out of bounds for dim 1 with size 5";
        let mut out = vec![0u8; 16];
        // A consumer recorded before the sync point fails with it too (in strict mode the
        // gather may already have failed: then the consumer fails at its call).
        let later = rt.op(
            0,
            Op::Binary(deferfuse::BinaryOp::Add),
            &[tt(g), fs(1.0)],
            None,
        );
        assert_index_error(&rt.to_host(g, &mut out).unwrap_err(), msg);
        assert_index_error(&rt.to_host(g, &mut out).unwrap_err(), msg);
        match later {
            Ok(h) => assert_index_error(&rt.to_host(h, &mut out).unwrap_err(), msg),
            Err(e) => assert_index_error(&e, msg),
        }
        let e = rt
            .op(0, Op::Unary(deferfuse::UnaryOp::Neg), &[tt(g)], None)
            .unwrap_err();
        assert_index_error(&e, msg);
        // Unrelated work runs as before.
        let x = tensor(&rt, DType::F32, &[2], &[1.0, 2.0]);
        let y = bin(&rt, deferfuse::BinaryOp::Mul, tt(x), fs(3.0));
        assert_eq!(download(&rt, y).data, [3.0, 6.0], "{mode:?}");
    }
}

#[test]
fn a_scatter_index_out_of_range_names_the_op_the_value_and_the_dim() {
    let rt = runtime(Mode::Debug);
    let this = tensor(&rt, DType::F32, &[4], &[0.0; 4]);
    let idx = tensor(&rt, DType::I32, &[2], &[1.0, 4.0]);
    for (reduce, name) in [
        (ScatterReduce::Assign, "scatter"),
        (ScatterReduce::Sum, "scatter_reduce"),
    ] {
        let e = rt
            .op(
                0,
                scatter(0, reduce, true),
                &[tt(this), tt(idx), fs(1.0)],
                Some(this),
            )
            .unwrap_err();
        assert_index_error(
            &e,
            &format!("{name}: index 4 is out of bounds for dim 0 with size 4"),
        );
    }
    assert_eq!(
        download(&rt, this).data,
        [0.0; 4],
        "a failed scatter_ leaves self as it was"
    );
}

#[test]
fn bad_kernel_operands_fail_at_the_call_in_every_mode() {
    for mode in MODES {
        let rt = runtime(mode);
        let src = tensor(&rt, DType::F32, &[2, 3], &[0.0; 6]);
        let fidx = tensor(&rt, DType::F32, &[2, 1], &[0.0; 2]);
        let idx3 = tensor(&rt, DType::I64, &[2, 1, 1], &[0.0; 2]);
        let wide = tensor(&rt, DType::I64, &[3, 1], &[0.0; 3]);
        let cases: Vec<(Op, Vec<Input>, &str)> = vec![
            (
                gather(1),
                vec![tt(src), tt(fidx)],
                "gather: input 1 (index): expected an int64 or int32 tensor, got dtype float32",
            ),
            (
                gather(1),
                vec![tt(src), tt(idx3)],
                "gather: input 1 (index): expected 2 dims (as many as input 0)",
            ),
            (
                gather(2),
                vec![tt(src), tt(wide)],
                "gather: dim: expected a dim in [-2, 1], got 2",
            ),
            (
                gather(1),
                vec![tt(src), tt(wide)],
                "gather: input 1 (index): expected size <= 2 in dim 0",
            ),
            (
                random(RandomDist::Uniform, &[2], DType::I32),
                vec![is(0), is(0)],
                "rand: dtype: expected a floating dtype, got int32",
            ),
            (
                random(RandomDist::Normal, &[2], DType::F32),
                vec![is(0), Input::Scalar(Scalar::Float(0.5))],
                "randn: input 1 (offset): expected an int scalar",
            ),
        ];
        for (op, ins, msg) in cases {
            let e = rt.op(0, op, &ins, None).unwrap_err();
            assert!(matches!(e, Error::Op(_)), "{e:?}");
            assert!(
                e.to_string().starts_with(msg),
                "{mode:?}: {e}\n  should start with {msg}"
            );
        }
    }
}
