//! The 8-lane row routines (`backend/cpu/block_math.rs`) give the very bits of the inline
//! 4-lane code they replace, for every input, every length and every position in a row: strict
//! and defer mode, and hosts with and without AVX2, agree.

use deferfuse_fusion::ir::{DType, Layout, Op, ReduceOp, UnaryOp};
use deferfuse_fusion::lower::lower_node;
use deferfuse_fusion::plan::{plan, PlanOptions};
use deferfuse_fusion::region::{Region, Step};
use deferfuse_fusion::trace::{Node, Operand, TensorRef};
use deferfuse_runtime::alloc::HostAllocator;
use deferfuse_runtime::backend::cpu::{limit_row_routine_lanes, CpuBackend};
use deferfuse_runtime::backend::{Backend, Program};
use deferfuse_runtime::buffer::Buffer;
use std::sync::Arc;

/// A compiled `op(x)` over a contiguous f32 vector of `n` elements.
fn program(backend: &CpuBackend, op: UnaryOp, n: usize) -> (Arc<dyn Program>, Node) {
    program_on(backend, op, Layout::contiguous(&[n]), &[n])
}

/// A compiled `y = op(x)`, x laid out as `x_layout`, y contiguous of shape `shape`.
fn program_on(
    backend: &CpuBackend,
    op: UnaryOp,
    x_layout: Layout,
    shape: &[usize],
) -> (Arc<dyn Program>, Node) {
    let t = |buffer, layout| TensorRef {
        buffer,
        layout,
        dtype: DType::F32,
    };
    let node = Node {
        op: Op::Unary(op),
        inputs: [Operand::Tensor(t(1, x_layout))].into_iter().collect(),
        output: t(2, Layout::contiguous(shape)),
        compute: DType::F32,
    };
    let step = lower_node(&node, 0).pop().expect("one step");
    (backend.compile(&step.region).unwrap(), node)
}

fn run(backend: &CpuBackend, op: UnaryOp, xs: &[f32]) -> Vec<u32> {
    run_rows(backend, op, xs, 1)
}

/// x read as rows of `row` elements each followed by as many unread ones (so a loop cannot
/// merge them into one row): its layout and its buffer's values. Rows of 1: `xs` as it is.
fn spread_rows(xs: &[f32], row: usize) -> (Layout, Vec<f32>) {
    if row == 1 {
        return (Layout::contiguous(&[xs.len()]), xs.to_vec());
    }
    let mut layout = Layout::contiguous(&[xs.len() / row, row]);
    layout.strides = [2 * row as isize, 1].into_iter().collect();
    let spread = xs
        .chunks(row)
        .flat_map(|c| c.iter().copied().chain(std::iter::repeat_n(f32::NAN, row)))
        .collect();
    (layout, spread)
}

/// Runs `prog` on `step`'s binding with buffer 1 holding `x` and a fresh buffer for each other
/// operand: the bits of each of `outputs` (buffer, elements), in order.
fn run_step(prog: &dyn Program, step: &Step, x: &[f32], outputs: &[(u64, usize)]) -> Vec<u32> {
    let pool = HostAllocator::new(0);
    let operands = &step.binding.operands;
    let bufs: Vec<Arc<Buffer>> = operands
        .iter()
        .map(|o| {
            let n = if o.buffer == 1 {
                x.len()
            } else {
                o.layout.numel()
            };
            Arc::new(Buffer::new(o.buffer, 4 * n, pool.clone()))
        })
        .collect();
    let at = |id| {
        &bufs[operands
            .iter()
            .position(|o| o.buffer == id)
            .expect("an operand")]
    };
    let x_base = at(1).storage_for_overwrite().unwrap().ptr();
    // SAFETY: x's buffer was just allocated with room for its f32s.
    unsafe { std::ptr::copy_nonoverlapping(x.as_ptr() as *const u8, x_base, 4 * x.len()) };
    // SAFETY: every buffer holds the f32s the binding describes; nothing else uses them.
    unsafe { prog.run(&step.binding, &bufs).unwrap() };
    let mut bits = Vec::new();
    for &(id, n) in outputs {
        let base = at(id).storage().unwrap().ptr() as *const f32;
        // SAFETY: the program wrote the n f32s of this output.
        let vs = unsafe { std::slice::from_raw_parts(base, n) };
        bits.extend(vs.iter().map(|v| v.to_bits()));
    }
    bits
}

/// `op` over `xs` read as rows of `row` (`spread_rows`), written contiguously: the bits of
/// each result.
fn run_rows(backend: &CpuBackend, op: UnaryOp, xs: &[f32], row: usize) -> Vec<u32> {
    let (layout, spread) = spread_rows(xs, row);
    let shape = layout.sizes.to_vec();
    let (prog, node) = program_on(backend, op, layout, &shape);
    let step = lower_node(&node, 0).pop().expect("one step");
    run_step(&*prog, &step, &spread, &[(2, xs.len())])
}

/// Backends with and without the row routines, or None (after saying so) on a host without
/// AVX2, where only the inline code exists.
fn both() -> Option<(CpuBackend, CpuBackend)> {
    let fast = CpuBackend::new(false, 1).unwrap();
    if !fast.row_routines() {
        eprintln!("skipped: this host has no AVX2/FMA, so loops never call the row routines");
        return None;
    }
    Some((
        fast,
        CpuBackend::new(false, 1).unwrap().without_row_routines(),
    ))
}

/// Dense over the interesting range, plus the edges each routine special-cases.
fn inputs() -> Vec<f32> {
    let mut xs: Vec<f32> = (0..40_001).map(|i| -100.0 + i as f32 * 0.005).collect();
    xs.extend([
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        88.722_83,
        88.7229,
        -87.336_54,
        -87.3366,
        4e-4,
        -4e-4,
        3.999_999_7e-4,
        9.0,
        -9.0,
        f32::MAX,
        f32::MIN,
    ]);
    xs
}

/// Every op that has a row routine.
const OPS: [UnaryOp; 19] = [
    UnaryOp::Exp,
    UnaryOp::Tanh,
    UnaryOp::Log,
    UnaryOp::Erf,
    UnaryOp::Sigmoid,
    UnaryOp::Silu,
    UnaryOp::GeluTanh,
    UnaryOp::GeluErf,
    UnaryOp::Log1p,
    UnaryOp::Expm1,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tan,
    UnaryOp::Atan,
    UnaryOp::Asin,
    UnaryOp::Acos,
    UnaryOp::Log2,
    UnaryOp::Log10,
    UnaryOp::Atanh,
];

#[test]
fn every_row_routine_matches_the_inline_code_bit_for_bit_at_8_and_16_lanes() {
    let Some((fast, inline)) = both() else { return };
    let mut xs = inputs();
    // log's domain: positive floats from subnormals up.
    xs.extend((0..2000).map(|i| f32::from_bits(1 + i * 1_061_109)));
    // 16 lanes only where the host has AVX-512; the cap is process-wide, and every width
    // gives the same bits, so other tests running meanwhile are unaffected.
    for lanes in [8, 16] {
        limit_row_routine_lanes(lanes);
        for op in OPS {
            let (got, want) = (run(&fast, op, &xs), run(&inline, op, &xs));
            let bad = (0..xs.len()).find(|&i| got[i] != want[i]);
            assert!(
                bad.is_none(),
                "{lanes} lanes: {op:?}({}) = {:e} ({:#x}) by the routine, {:e} ({:#x}) inline",
                xs[bad.unwrap()],
                f32::from_bits(got[bad.unwrap()]),
                got[bad.unwrap()],
                f32::from_bits(want[bad.unwrap()]),
                want[bad.unwrap()]
            );
        }
    }
}

#[test]
fn every_length_around_the_block_size_matches() {
    // Lengths that end mid-group of 8, mid-block and just past blocks of 1024.
    let Some((fast, inline)) = both() else { return };
    for n in (1..=20).chain([1023, 1024, 1025, 2048 + 7]) {
        let xs: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        for op in OPS {
            assert_eq!(
                run(&fast, op, &xs),
                run(&inline, op, &xs),
                "{op:?}, {n} elements"
            );
        }
    }
}

#[test]
fn loops_call_a_row_routine_only_when_the_host_has_one() {
    let Some((fast, inline)) = both() else { return };
    let listing = |b: &CpuBackend| {
        let keep = CpuBackend::new(true, 1).unwrap();
        let b = if b.row_routines() {
            keep
        } else {
            keep.without_row_routines()
        };
        program(&b, UnaryOp::Exp, 4096).0.listing()
    };
    assert!(listing(&fast).contains("call fn0"), "{}", listing(&fast));
    assert!(
        !listing(&inline).contains("call fn0"),
        "{}",
        listing(&inline)
    );
}

#[test]
fn rows_of_every_length_taken_in_groups_match_the_inline_code() {
    // Rows shorter than a block (1024) run in groups filling a block, the last group partial
    // (37 rows of each length); longer rows block by block.
    let Some((fast, inline)) = both() else { return };
    for row in (1..=33).chain([100, 341, 1000, 1023, 1024, 1025]) {
        let xs: Vec<f32> = (0..row * 37)
            .map(|i| (i as f32 * 0.37).sin() * 6.0)
            .collect();
        let want = run(&inline, UnaryOp::Exp, &xs);
        assert_eq!(
            run_rows(&fast, UnaryOp::Exp, &xs, row),
            want,
            "exp, rows of {row}"
        );
        for op in OPS {
            assert_eq!(
                run_rows(&fast, op, &xs, row),
                run_rows(&inline, op, &xs, row),
                "{op:?}, rows of {row}"
            );
        }
    }
}

/// `y = op(x)` over x read as rows of `row` (as `run_rows` reads it) and `s = sum(y)` of each
/// row, planned into one row kernel (its routine call in the first sweep, before the sum):
/// the bits of y, then of s.
fn run_row_kernel(backend: &CpuBackend, op: UnaryOp, xs: &[f32], row: usize) -> Vec<u32> {
    let (x_layout, spread) = spread_rows(xs, row);
    run_row_kernel_on(backend, op, x_layout, &spread, xs.len() / row, row)
}

/// `run_row_kernel` on `rows` rows of `row` read from `spread` through `x_layout`.
fn run_row_kernel_on(
    backend: &CpuBackend,
    op: UnaryOp,
    x_layout: Layout,
    spread: &[f32],
    rows: usize,
    row: usize,
) -> Vec<u32> {
    let t = |buffer, layout| TensorRef {
        buffer,
        layout,
        dtype: DType::F32,
    };
    let y = t(2, Layout::contiguous(&[rows, row]));
    let nodes = [
        Node {
            op: Op::Unary(op),
            inputs: [Operand::Tensor(t(1, x_layout))].into_iter().collect(),
            output: y.clone(),
            compute: DType::F32,
        },
        Node {
            op: Op::Reduce {
                op: ReduceOp::Sum,
                dims: [1].into_iter().collect(),
                keepdim: false,
            },
            inputs: [Operand::Tensor(y)].into_iter().collect(),
            output: t(3, Layout::contiguous(&[rows])),
            compute: DType::F32,
        },
    ];
    let steps = plan(&nodes, &|b| b == 2 || b == 3, &PlanOptions::default()).steps;
    assert_eq!(steps.len(), 1, "one fused step");
    let step = &steps[0];
    assert!(
        matches!(&*step.region, Region::Loop(l) if !l.reduces.is_empty()),
        "a row kernel"
    );
    let prog = backend.compile(&step.region).unwrap();
    run_step(&*prog, step, spread, &[(2, rows * row), (3, rows)])
}

#[test]
fn a_row_kernel_over_rows_of_every_length_taken_in_groups_matches_the_inline_code() {
    // Its routine call is in the first sweep (before the sum), so short rows run in groups:
    // the values and each row's sum as the inline code gives them.
    let Some((fast, inline)) = both() else { return };
    for row in (1..=33).chain([100, 1000, 1023, 1024, 1025]) {
        let xs: Vec<f32> = (0..row * 37)
            .map(|i| (i as f32 * 0.37).sin() * 6.0)
            .collect();
        for op in OPS {
            assert_eq!(
                run_row_kernel(&fast, op, &xs, row),
                run_row_kernel(&inline, op, &xs, row),
                "{op:?} and its row sums, rows of {row}"
            );
        }
    }
}

#[test]
fn a_row_kernel_over_empty_rows_gives_zero_sums() {
    // Rows of length 0 (`x.exp().sum(1)` of a [37, 0] tensor) once took the grouped path,
    // which divides the block by the row length: the process died of SIGFPE.
    let backend = CpuBackend::new(false, 1).unwrap();
    for op in [UnaryOp::Exp, UnaryOp::Tanh] {
        let sums = run_row_kernel_on(&backend, op, Layout::contiguous(&[37, 0]), &[], 37, 0);
        assert_eq!(sums, vec![0.0f32.to_bits(); 37], "{op:?}");
    }
}
