//! im2col and col2im (`ConvPart::InputToColumns`, `ConvPart::ColumnsToInput`) against the
//! reference in `reference/kernels.rs`, bit for bit (im2col copies, float32 and the half types;
//! col2im sums each element's taps in the order of the strided adds it replaces), in every mode,
//! over 1-D, 2-D and 3-D geometries and operand layouts.

use crate::harness;
use crate::reference;

use deferfuse::fusion::ir::{Conv, ConvPart, KernelOp};
use deferfuse::{DType, Error, Op, Runtime};
use harness::*;
use reference::kernels as refk;
use reference::RefTensor;

/// Columns `[n, c, k..., out...]` going back to an input of `input` positions.
struct Case {
    name: &'static str,
    n: usize,
    c: usize,
    kernel: &'static [usize],
    out: &'static [usize],
    input: &'static [usize],
    padding: &'static [usize],
    dilation: &'static [usize],
    stride: &'static [usize],
}

#[rustfmt::skip]
const CASES: &[Case] = &[
    // A transposed convolution's 4x4 stride-2 upsampling (a VAE's, a DCGAN's): every position
    // takes 4 taps.
    Case { name: "2-D 4x4 s2 p1, 7x7 -> 14x14", n: 3, c: 5, kernel: &[4, 4], out: &[7, 7], input: &[14, 14], padding: &[1, 1], dilation: &[1, 1], stride: &[2, 2] },
    // ResNet's 3x3 stride-2 downsampling on an even map: the last row and column no window
    // reads stay zero.
    Case { name: "2-D 3x3 s2 p1 on an even map", n: 2, c: 3, kernel: &[3, 3], out: &[5, 6], input: &[10, 12], padding: &[1, 1], dilation: &[1, 1], stride: &[2, 2] },
    // A transposed convolution's output_padding: one position past the windows.
    Case { name: "2-D 3x3 s2 p1 output_padding 1", n: 1, c: 2, kernel: &[3, 3], out: &[4, 4], input: &[8, 8], padding: &[1, 1], dilation: &[1, 1], stride: &[2, 2] },
    Case { name: "2-D 3x3 s1 p1 (overlapping taps on every row)", n: 2, c: 2, kernel: &[3, 3], out: &[6, 5], input: &[6, 5], padding: &[1, 1], dilation: &[1, 1], stride: &[1, 1] },
    Case { name: "2-D 2x2 s3 (gaps no window reads)", n: 2, c: 2, kernel: &[2, 2], out: &[3, 3], input: &[8, 8], padding: &[0, 0], dilation: &[1, 1], stride: &[3, 3] },
    Case { name: "2-D 3x5 s(2,3) p(1,2) d(1,2)", n: 2, c: 3, kernel: &[3, 5], out: &[5, 4], input: &[9, 14], padding: &[1, 2], dilation: &[1, 2], stride: &[2, 3] },
    Case { name: "1-D k3 s2", n: 2, c: 3, kernel: &[3], out: &[8], input: &[17], padding: &[0], dilation: &[1], stride: &[2] },
    // An audio encoder's stride-2 layer, rows long enough for the routines' vector groups and
    // their tails.
    Case { name: "1-D k3 s2 p1, 80 -> 40", n: 2, c: 3, kernel: &[3], out: &[40], input: &[80], padding: &[1], dilation: &[1], stride: &[2] },
    Case { name: "1-D k5 d2 p3", n: 1, c: 2, kernel: &[5], out: &[10], input: &[12], padding: &[3], dilation: &[2], stride: &[1] },
    Case { name: "3-D 3x3x3 s(1,2,2) p1", n: 1, c: 2, kernel: &[3, 3, 3], out: &[4, 4, 3], input: &[4, 7, 6], padding: &[1, 1, 1], dilation: &[1, 1, 1], stride: &[1, 2, 2] },
    // A stem's 7x7 stride-2 with padding 3: border taps read padding only.
    Case { name: "2-D 7x7 s2 p3", n: 1, c: 3, kernel: &[7, 7], out: &[10, 10], input: &[20, 19], padding: &[3, 3], dilation: &[1, 1], stride: &[2, 2] },
];

impl Case {
    fn conv(&self) -> Conv {
        Conv {
            part: ConvPart::ColumnsToInput,
            padding: self.padding.into(),
            dilation: self.dilation.into(),
            stride: self.stride.into(),
            sizes: self.input.into(),
        }
    }

    fn op(&self) -> Op {
        Op::Kernel(KernelOp::Conv(Box::new(self.conv())))
    }

    /// The columns' shape `[N, C, k..., out...]`.
    fn cols(&self) -> Vec<usize> {
        [&[self.n, self.c][..], self.kernel, self.out].concat()
    }
}

/// The columns laid out as a product that folded the batch into its columns leaves them: `[C,
/// k..., N, out...]` in memory, viewed `[N, C, k..., out...]`.
fn folded(rt: &Runtime, cols: &RefTensor) -> deferfuse::Handle {
    let d = (cols.rank() - 2) / 2;
    // Memory order: C, k..., N, out...; the view's dim i reads memory dim perm[i].
    let mem_order: Vec<usize> = [1]
        .into_iter()
        .chain(2..2 + d)
        .chain([0])
        .chain(2 + d..2 + 2 * d)
        .collect();
    let mem = reference::views::view(cols, |l| l.permute(&mem_order));
    let base = upload(rt, &mem);
    let mut back = vec![0; mem_order.len()];
    for (i, &m) in mem_order.iter().enumerate() {
        back[m] = i;
    }
    let back: Vec<i64> = back.iter().map(|&b| b as i64).collect();
    let v = rt
        .view(0, base, &deferfuse::View::Permute(back))
        .expect("permute view");
    rt.release(base).unwrap();
    v
}

/// What a check runs per case: the operand's shape and the op.
type Part = (fn(&Case) -> Vec<usize>, fn(&Case) -> Conv);

/// Runs `op` of every case on an operand of `shape` (random values) placed by `place`, in every
/// mode (bit for bit alike), and checks each result against `want` exactly: im2col copies and
/// col2im sums in the reference's order.
fn check_exact(
    what: &str,
    (seed, dtype): (u64, DType),
    (shape, op): Part,
    place: &dyn Fn(&Runtime, &RefTensor) -> deferfuse::Handle,
    want: fn(&Conv, &RefTensor) -> RefTensor,
) {
    let mut rng = Rng::new(seed);
    let inputs: Vec<RefTensor> = CASES
        .iter()
        .map(|c| rng.tensor(dtype, &shape(c), 2.0, 0, false))
        .collect();
    let outs = run_in_every_mode(|rt| {
        CASES
            .iter()
            .zip(&inputs)
            .map(|(c, t)| {
                let k = Op::Kernel(KernelOp::Conv(Box::new(op(c))));
                (c.name.to_string(), run(rt, k, &[tt(place(rt, t))]))
            })
            .collect()
    });
    let failures: Vec<String> = CASES
        .iter()
        .zip(&inputs)
        .zip(&outs)
        .filter_map(|((c, t), (name, got))| {
            compare(
                &format!("{what} {name}"),
                got,
                &want(&op(c), t),
                EXACT,
                None,
            )
            .err()
        })
        .collect();
    assert_no_failures(&failures);
}

/// col2im of every case on columns laid out as `layout` says.
fn check(layout: &str, seed: u64) {
    let place = |rt: &Runtime, t: &RefTensor| match layout {
        "folded" => folded(rt, t),
        "strided" => place(rt, t, Place::Strided),
        _ => upload(rt, t),
    };
    let parts: Part = (Case::cols, Case::conv);
    check_exact(
        layout,
        (seed, DType::F32),
        parts,
        &place,
        refk::conv_columns_to_input,
    );
}

#[test]
fn contiguous_columns_sum_bit_for_bit_as_the_strided_adds_in_every_mode() {
    check("contiguous", 1);
}

#[test]
fn columns_a_folded_product_left_sum_bit_for_bit_in_every_mode() {
    check("folded", 2);
}

#[test]
fn strided_columns_sum_bit_for_bit_in_every_mode() {
    check("strided", 3);
}

#[test]
fn a_negative_zero_sums_to_positive_zero_as_the_strided_adds_do() {
    // Every input element of a 1x1-tap stride-1 col2im is one column value added to +0.0.
    let case = &CASES[3];
    let cols = RefTensor::new(
        DType::F32,
        &case.cols(),
        vec![-0.0; case.cols().iter().product()],
    );
    let outs = run_in_every_mode(|rt| {
        vec![("zeros".into(), run(rt, case.op(), &[tt(upload(rt, &cols))]))]
    });
    assert!(outs[0]
        .1
        .data
        .iter()
        .all(|v| *v == 0.0 && v.is_sign_positive()));
}

#[test]
fn columns_of_the_wrong_shape_fail_at_record_naming_the_columns() {
    let rt = Runtime::new(Default::default()).unwrap();
    let case = &CASES[0];
    let h = tensor(
        &rt,
        DType::F32,
        &[3, 5, 4, 4, 7],
        &vec![0.0; 3 * 5 * 16 * 7],
    );
    match rt.op(0, case.op(), &[tt(h)], None) {
        Err(e @ Error::Op(_)) => assert!(e.to_string().contains("input 0 (columns)"), "{e}"),
        other => panic!("expected a record-time op error, got {other:?}"),
    }
    let h = tensor(
        &rt,
        DType::F64,
        &case.cols(),
        &vec![0.0; case.cols().iter().product()],
    );
    match rt.op(0, case.op(), &[tt(h)], None) {
        Err(e @ Error::Op(_)) => assert!(e.to_string().contains("float32"), "{e}"),
        other => panic!("expected a record-time op error, got {other:?}"),
    }
}

impl Case {
    /// The im2col op of this geometry: the input's windows into columns.
    fn im2col(&self) -> Conv {
        Conv {
            part: ConvPart::InputToColumns,
            sizes: self.kernel.into(),
            ..self.conv()
        }
    }

    /// The input's shape `[N, C, in...]`.
    fn x(&self) -> Vec<usize> {
        [&[self.n, self.c][..], self.input].concat()
    }
}

/// im2col of every case on `dtype` inputs placed as `layout` says.
fn check_im2col(layout: Place, seed: u64, dtype: DType) {
    let place = |rt: &Runtime, t: &RefTensor| place(rt, t, layout);
    let parts: Part = (Case::x, Case::im2col);
    let what = format!("im2col {dtype} {layout:?}");
    check_exact(
        &what,
        (seed, dtype),
        parts,
        &place,
        refk::conv_input_to_columns,
    );
}

#[test]
fn im2col_of_contiguous_inputs_copies_every_window_in_every_mode() {
    check_im2col(Place::Contig, 4, DType::F32);
}

#[test]
fn im2col_of_strided_and_transposed_inputs_copies_every_window_in_every_mode() {
    check_im2col(Place::Strided, 5, DType::F32);
    check_im2col(Place::Transposed, 6, DType::F32);
}

#[test]
fn im2col_of_bfloat16_and_float16_inputs_copies_every_window_bit_for_bit() {
    // The autocast convolutions' columns: the routine copies 16-bit patterns.
    for (dtype, seed) in [(DType::BF16, 7), (DType::F16, 8)] {
        check_im2col(Place::Contig, seed, dtype);
        check_im2col(Place::Strided, seed + 10, dtype);
    }
}

#[test]
fn im2col_columns_have_the_input_dtype() {
    let rt = Runtime::new(Default::default()).unwrap();
    let case = &CASES[0];
    let n: usize = case.x().iter().product();
    let x = tensor(&rt, DType::BF16, &case.x(), &vec![1.5; n]);
    let op = Op::Kernel(KernelOp::Conv(Box::new(case.im2col())));
    let cols = run(&rt, op.clone(), &[tt(x)]);
    assert_eq!(rt.dtype(cols).unwrap(), DType::BF16);
    let x = tensor(&rt, DType::F64, &case.x(), &vec![1.5; n]);
    match rt.op(0, op, &[tt(x)], None) {
        Err(e @ Error::Op(_)) => {
            assert!(
                e.to_string().contains("float32, bfloat16 or float16"),
                "{e}"
            )
        }
        other => panic!("expected a record-time op error, got {other:?}"),
    }
}

#[test]
fn im2col_lays_the_columns_out_channels_taps_batch_positions() {
    let rt = Runtime::new(Default::default()).unwrap();
    let case = &CASES[0];
    let x = tensor(
        &rt,
        DType::F32,
        &case.x(),
        &vec![1.0; case.x().iter().product()],
    );
    let op = Op::Kernel(KernelOp::Conv(Box::new(case.im2col())));
    let cols = run(&rt, op, &[tt(x)]);
    assert_eq!(rt.sizes(cols).unwrap().as_slice(), &[5, 4, 4, 3, 7, 7]);
}
