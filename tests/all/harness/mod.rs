//! Shared test plumbing: runtimes per mode, moving `RefTensor`s in and out of a runtime (also as
//! strided and transposed views), running one program in every mode, tolerances and a PRNG.
#![allow(dead_code)]

pub mod depthwise;
pub mod flush_spans;

use crate::reference::views::RefLayout;
use crate::reference::{apply, check, indices, Arg, RefTensor};
use deferfuse::{
    BinaryOp, Config, DType, Handle, Input, Mode, Op, ReduceOp, Runtime, Scalar, UnaryOp, View,
};

pub const MODES: [Mode; 3] = [Mode::Strict, Mode::Debug, Mode::Defer];

/// True when `DEFERFUSE_BACKEND=pjrt` runs the suites on the PJRT backend (for the few inputs
/// whose results XLA defines differently; each use says why).
pub fn on_pjrt() -> bool {
    std::env::var("DEFERFUSE_BACKEND").is_ok_and(|b| b == "pjrt")
}

/// The XLA CPU plugin's path from `DEFERFUSE_PJRT_PLUGIN`, or None (the caller skips) with a
/// note saying how to get it.
pub fn plugin() -> Option<std::path::PathBuf> {
    match std::env::var_os("DEFERFUSE_PJRT_PLUGIN") {
        Some(p) if !p.is_empty() => Some(std::path::PathBuf::from(p)),
        _ => {
            eprintln!("skipped: DEFERFUSE_PJRT_PLUGIN is not set (pip install xla-cpu-pjrt)");
            None
        }
    }
}

/// The gather kernel op along `dim`.
pub fn gather(dim: usize) -> Op {
    Op::Kernel(deferfuse::fusion::ir::KernelOp::Gather { dim })
}

/// The scatter kernel op along `dim` with its reduction.
pub fn scatter(dim: usize, reduce: deferfuse::fusion::ir::ScatterReduce, include_self: bool) -> Op {
    Op::Kernel(deferfuse::fusion::ir::KernelOp::Scatter {
        dim,
        reduce,
        include_self,
        wide: false,
    })
}

pub fn runtime(mode: Mode) -> Runtime {
    Runtime::new(Config {
        mode: Some(mode),
        ..Default::default()
    })
    .expect("runtime")
}

/// Copies a reference tensor into a new contiguous runtime tensor.
pub fn upload(rt: &Runtime, t: &RefTensor) -> Handle {
    rt.from_host(&t.to_bytes(), t.dtype, &t.sizes)
        .expect("from_host")
}

/// How an input is laid out in the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A fresh contiguous tensor.
    Contig,
    /// Every other element of a buffer one element longer in the last dim, starting at 1 (an
    /// offset, inner stride 2, and garbage in between).
    Strided,
    /// The transpose of a contiguous tensor of the swapped shape (inner stride = rows).
    Transposed,
}

pub const PLACES: [Place; 3] = [Place::Contig, Place::Strided, Place::Transposed];

fn garbage(dtype: DType) -> f64 {
    match dtype {
        DType::Bool => 1.0,
        DType::U8 => 77.0,
        d if d.is_float() => -1234.5,
        _ => 4321.0,
    }
}

/// A runtime view whose elements equal `t`, laid out as `place` says (falls back to contiguous
/// when the shape has no room for it).
pub fn place(rt: &Runtime, t: &RefTensor, place: Place) -> Handle {
    let rank = t.rank();
    match place {
        Place::Strided if rank >= 1 && t.numel() > 0 => {
            let n = t.sizes[rank - 1];
            let mut big = t.sizes.clone();
            big[rank - 1] = 2 * n + 1;
            let mut data = vec![garbage(t.dtype); big.iter().product()];
            let l = RefLayout::contiguous(&big).slice(-1, 1, 2 * n as i64 + 1, 2);
            for (p, &v) in l.positions().into_iter().zip(&t.data) {
                data[p] = v;
            }
            let base = upload(rt, &RefTensor::new(t.dtype, &big, data));
            let v = rt
                .view(
                    0,
                    base,
                    &View::Slice {
                        dim: -1,
                        start: 1,
                        end: 2 * n as i64 + 1,
                        step: 2,
                    },
                )
                .expect("slice view");
            rt.release(base).unwrap();
            v
        }
        Place::Transposed if rank >= 2 && t.numel() > 0 => {
            let swapped = crate::reference::views::view(t, |l| l.transpose(-1, -2));
            let base = upload(rt, &swapped);
            let v = rt
                .view(0, base, &View::Transpose(-1, -2))
                .expect("transpose view");
            rt.release(base).unwrap();
            v
        }
        Place::Transposed if rank == 1 => self::place(rt, t, Place::Strided),
        _ => upload(rt, t),
    }
}

/// Reads a runtime tensor back (raw decode: a bool byte of 2 reads as 2).
pub fn download(rt: &Runtime, h: Handle) -> RefTensor {
    let (dtype, sizes, bytes) = read_raw(rt, h);
    RefTensor::from_bytes(dtype, &sizes, &bytes)
}

pub fn read_raw(rt: &Runtime, h: Handle) -> Raw {
    let dtype = rt.dtype(h).expect("dtype");
    let sizes = rt.sizes(h).expect("sizes").to_vec();
    let mut bytes = vec![0u8; sizes.iter().product::<usize>() * dtype.size()];
    rt.to_host(h, &mut bytes).expect("to_host");
    (dtype, sizes, bytes)
}

/// Runs `prog` on a fresh runtime per mode, reads back every labelled output, asserts strict,
/// debug and defer agree byte for byte (dtype and sizes too), and returns the outputs.
pub fn run_in_every_mode(
    prog: impl Fn(&Runtime) -> Vec<(String, Handle)>,
) -> Vec<(String, RefTensor)> {
    run_in_every_mode_raw(prog)
        .into_iter()
        .map(|(n, (d, s, b))| (n, RefTensor::from_bytes(d, &s, &b)))
        .collect()
}

/// Whether two float results agree as two XLA programs computing them may: within 4 ulps
/// per element, or within a relative 1e-6 (f32, f16, bf16) or 1e-13 (f64) of the larger
/// magnitude or of the tensor's largest finite magnitude, NaN where the other is NaN. On PJRT each program is compiled by XLA on its own,
/// and a whole-flush module may evaluate a transcendental with other code, or fold a
/// reduction in another order, than the one-op program strict mode runs (README, "What
/// differs from the CPU backend"); the CPU backend still must agree byte for byte.
fn xla_close(a: &Raw, b: &Raw) -> bool {
    if a.0 != b.0 || a.1 != b.1 || a.2.len() != b.2.len() {
        return false;
    }
    let rel = match a.0 {
        DType::F64 => 1e-13,
        DType::F32 | DType::F16 | DType::BF16 => 1e-6,
        _ => return a == b,
    };
    let x = RefTensor::from_bytes(a.0, &a.1, &a.2);
    let y = RefTensor::from_bytes(b.0, &b.1, &b.2);
    let ulp = |v: f64| match a.0 {
        DType::F64 => f64::EPSILON * v.abs().max(f64::MIN_POSITIVE),
        DType::F32 => f32::EPSILON as f64 * v.abs().max(f32::MIN_POSITIVE as f64),
        DType::F16 => 2f64.powi(-10) * v.abs().max(2f64.powi(-14)),
        _ => 2f64.powi(-7) * v.abs().max(2f64.powi(-126)),
    };
    // XLA may sum in another order in another program: where a sum cancels (a k=300 dot
    // product of terms ~100 ending near 1), the difference is relative to the tensor's
    // magnitude, not the element's.
    let scale = x
        .data
        .iter()
        .fold(0f64, |m, v| if v.is_finite() { m.max(v.abs()) } else { m });
    x.data.iter().zip(&y.data).all(|(&p, &q)| {
        if p.is_nan() || q.is_nan() {
            return p.is_nan() && q.is_nan();
        }
        let d = (p - q).abs();
        p == q
            || d <= 4.0 * ulp(p.abs().max(q.abs()))
            || d <= rel * p.abs().max(q.abs())
            || d <= rel * scale
    })
}

/// A tensor as read back: dtype, sizes, little-endian bytes.
pub type Raw = (DType, Vec<usize>, Vec<u8>);

/// [`run_in_every_mode`] returning the raw bytes (for exact int64 checks).
pub fn run_in_every_mode_raw(
    prog: impl Fn(&Runtime) -> Vec<(String, Handle)>,
) -> Vec<(String, Raw)> {
    let mut first: Option<Vec<(String, Raw)>> = None;
    for mode in MODES {
        let rt = runtime(mode);
        let outs: Vec<(String, Raw)> = prog(&rt)
            .into_iter()
            .map(|(name, h)| {
                let r = read_raw(&rt, h);
                (name, r)
            })
            .collect();
        match &first {
            None => first = Some(outs),
            Some(f) => {
                assert_eq!(f.len(), outs.len(), "{mode:?}: output count");
                for ((name, a), (_, b)) in f.iter().zip(&outs) {
                    assert!(
                        a == b || (rt.backend_name() == "pjrt" && xla_close(a, b)),
                        "{name}: strict and {mode:?} differ:\n strict {:?}\n {mode:?} {:?}",
                        RefTensor::from_bytes(a.0, &a.1, &a.2),
                        RefTensor::from_bytes(b.0, &b.1, &b.2)
                    );
                }
            }
        }
    }
    first.unwrap()
}

/// The int64 values of raw bytes.
pub fn i64s(raw: &Raw) -> Vec<i64> {
    assert_eq!(raw.0, DType::I64);
    raw.2
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Allowed difference from the reference: `rel * |want| + abs + scaled * scale`, where `scale` is
/// the sum of the magnitudes of the terms an accumulation added (0 for elementwise ops).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    pub rel: f64,
    pub abs: f64,
    pub scaled: f64,
}

/// Bit-exact (by value: NaN matches NaN, -0.0 matches 0.0).
pub const EXACT: Tol = Tol {
    rel: 0.0,
    abs: 0.0,
    scaled: 0.0,
};
/// f32 transcendentals: inline polynomials of ~2 ulp (exp, log), erf with 1.4e-7 absolute error.
pub const F32_TRANSCENDENTAL: Tol = Tol {
    rel: 2e-6,
    abs: 1e-6,
    scaled: 0.0,
};
/// f64 transcendentals: libm against our own f64 formulas (erf: two independent series).
pub const F64_TRANSCENDENTAL: Tol = Tol {
    rel: 1e-13,
    abs: 1e-14,
    scaled: 0.0,
};
/// f16 results: one f16 ulp (2^-10 relative) of an f32 computation, plus f32-level absolute error.
pub const F16_TOL: Tol = Tol {
    rel: 1e-3,
    abs: 1e-6,
    scaled: 0.0,
};
/// bf16 results: one bf16 ulp (2^-7 relative).
pub const BF16_TOL: Tol = Tol {
    rel: 8e-3,
    abs: 1e-6,
    scaled: 0.0,
};
/// f32 sum/mean/matmul: vector accumulation order, relative to the sum of |terms|.
pub const F32_ACCUM: Tol = Tol {
    rel: 0.0,
    abs: 1e-6,
    scaled: 1e-5,
};
/// f64 sum/mean/matmul.
pub const F64_ACCUM: Tol = Tol {
    rel: 0.0,
    abs: 1e-14,
    scaled: 1e-13,
};

/// The tolerance of an op's float result of `dtype`: `exact` for ops rounded once from exact
/// inputs, else the dtype's transcendental tolerance (f16/bf16 rounding dominates).
pub fn float_tol(dtype: DType, exact: bool) -> Tol {
    match dtype {
        DType::F16 if !exact => F16_TOL,
        DType::BF16 if !exact => BF16_TOL,
        DType::F32 if !exact => F32_TRANSCENDENTAL,
        DType::F64 if !exact => F64_TRANSCENDENTAL,
        _ => EXACT,
    }
}

/// Accumulation tolerance (sums, means, matmul) of `dtype`, including the output rounding.
pub fn accum_tol(dtype: DType) -> Tol {
    match dtype {
        DType::F64 => F64_ACCUM,
        DType::F32 => F32_ACCUM,
        DType::F16 => Tol {
            scaled: 1e-5,
            ..F16_TOL
        },
        DType::BF16 => Tol {
            scaled: 1e-5,
            ..BF16_TOL
        },
        _ => EXACT,
    }
}

/// Compares `got` with `want`; `scale` (same shape as `want`) feeds `tol.scaled`.
pub fn compare(
    ctx: &str,
    got: &RefTensor,
    want: &RefTensor,
    tol: Tol,
    scale: Option<&RefTensor>,
) -> Result<(), String> {
    if got.dtype != want.dtype || got.sizes != want.sizes {
        return Err(format!(
            "{ctx}: got {:?}{:?}, want {:?}{:?}",
            got.dtype, got.sizes, want.dtype, want.sizes
        ));
    }
    let mut bad = Vec::new();
    for (i, (&g, &w)) in got.data.iter().zip(&want.data).enumerate() {
        let ok = if w.is_nan() || g.is_nan() {
            w.is_nan() && g.is_nan()
        } else if g == w {
            true
        } else if w.is_infinite() || g.is_infinite() {
            false
        } else {
            let s = scale.map_or(0.0, |s| s.data[i]);
            (g - w).abs() <= tol.rel * w.abs() + tol.abs + tol.scaled * s
        };
        if !ok {
            bad.push(format!("[{i}] got {g:e} want {w:e}"));
        }
    }
    if bad.is_empty() {
        return Ok(());
    }
    let n = bad.len();
    bad.truncate(6);
    Err(format!(
        "{ctx}: {n} of {} elements differ (tol {tol:?}): {}",
        want.numel(),
        bad.join(", ")
    ))
}

/// Panics listing every failure.
pub fn assert_no_failures(failures: &[String]) {
    if !failures.is_empty() {
        let shown: Vec<&String> = failures.iter().take(30).collect();
        panic!(
            "{} failures:\n{}",
            failures.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// xorshift64* PRNG: deterministic inputs without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in [lo, hi].
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.next_u64() as usize % xs.len()]
    }

    /// A float in [-r, r]: a quarter are multiples of 0.5 (ties for round), some are +-0; with
    /// `specials`, about 1 in 11 is NaN, inf or -inf.
    pub fn float(&mut self, r: f64, specials: bool) -> f64 {
        match self.next_u64() % 32 {
            0 if specials => f64::NAN,
            1 if specials => f64::INFINITY,
            2 if specials => f64::NEG_INFINITY,
            3 => 0.0,
            4 => -0.0,
            5..=12 => ((self.unit() * 2.0 - 1.0) * r * 2.0).round() / 2.0,
            _ => (self.unit() * 2.0 - 1.0) * r,
        }
    }

    /// Values for a tensor of `dtype`: floats in [-r, r] (see [`Rng::float`]), integers in
    /// [-ir, ir] (u8 in [0, 255], bool 0/1).
    pub fn values(&mut self, dtype: DType, n: usize, r: f64, ir: i64, specials: bool) -> Vec<f64> {
        (0..n)
            .map(|_| match dtype {
                DType::Bool => self.int(0, 1) as f64,
                DType::U8 => self.int(0, 255) as f64,
                d if d.is_float() => self.float(r, specials),
                _ => self.int(-ir, ir) as f64,
            })
            .collect()
    }

    pub fn tensor(
        &mut self,
        dtype: DType,
        sizes: &[usize],
        r: f64,
        ir: i64,
        specials: bool,
    ) -> RefTensor {
        let n = sizes.iter().product();
        RefTensor::new(dtype, sizes, self.values(dtype, n, r, ir, specials))
    }
}

/// Every index of `sizes` (re-exported for tests that walk shapes).
pub fn all_indices(sizes: &[usize]) -> Vec<Vec<usize>> {
    indices(sizes)
}

/// One operand of a [`Case`].
#[derive(Clone, Debug)]
pub enum In {
    T(RefTensor, Place),
    S(Scalar),
    Absent,
}

/// One op applied to fresh inputs, checked against the reference with `tol`.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<In>,
    pub tol: Tol,
    /// Per-output-element magnitude for `tol.scaled` (accumulations).
    pub scale: Option<RefTensor>,
}

impl Case {
    pub fn new(name: impl Into<String>, op: Op, inputs: Vec<In>, tol: Tol) -> Case {
        Case {
            name: name.into(),
            op,
            inputs,
            tol,
            scale: None,
        }
    }

    pub fn args(&self) -> Vec<Arg<'_>> {
        self.inputs
            .iter()
            .map(|i| match i {
                In::T(t, _) => Arg::T(t),
                In::S(s) => Arg::S(*s),
                In::Absent => Arg::Absent,
            })
            .collect()
    }

    /// True when the record-time checker accepts the op (cases it rejects are skipped).
    pub fn is_valid(&self) -> bool {
        check(&self.op, &self.args()).is_ok()
    }
}

/// Records every case (inputs placed as asked, then released: pending work must keep them
/// alive) on one runtime per mode, asserts the modes agree bit for bit, and returns the
/// reference mismatches.
pub fn run_cases(cases: &[Case]) -> Vec<String> {
    let outs = run_in_every_mode(|rt| {
        cases
            .iter()
            .map(|c| {
                let ins: Vec<Input> = c
                    .inputs
                    .iter()
                    .map(|i| match i {
                        In::T(t, p) => Input::Tensor(place(rt, t, *p)),
                        In::S(s) => Input::Scalar(*s),
                        In::Absent => Input::Absent,
                    })
                    .collect();
                let out = rt
                    .op(0, c.op.clone(), &ins, None)
                    .unwrap_or_else(|e| panic!("{}: {e}", c.name));
                for i in ins {
                    if let Input::Tensor(h) = i {
                        rt.release(h).unwrap();
                    }
                }
                (c.name.clone(), out)
            })
            .collect()
    });
    cases
        .iter()
        .zip(outs)
        .filter_map(|(c, (_, got))| {
            let want = apply(&c.op, &c.args());
            compare(&c.name, &got, &want, c.tol, c.scale.as_ref()).err()
        })
        .collect()
}

/// Runs `prog` on a defer-mode runtime of the CPU backend (whatever DEFERFUSE_BACKEND says)
/// that dumps its programs, and returns the optimized IR of each dumped program whose listing
/// contains every one of `marks`: what tests of the generated code read.
pub fn dumped_ir(name: &str, marks: &[&str], prog: impl Fn(&Runtime)) -> Vec<String> {
    let dir = std::env::temp_dir().join(format!("deferfuse-{name}-{}", std::process::id()));
    let rt = Runtime::new(Config {
        mode: Some(Mode::Defer),
        backend: Some(deferfuse::BackendKind::Cpu),
        dump_dir: Some(dir.clone()),
        ..Default::default()
    })
    .unwrap();
    prog(&rt);
    let listings: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .filter(|s| marks.iter().all(|m| s.contains(m)))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    listings
        .iter()
        .map(|l| {
            let start = l.find("; ---- optimized IR ----").unwrap();
            let end = l.find("; ---- machine code ----").unwrap_or(l.len());
            l[start..end].to_string()
        })
        .collect()
}

// ---- terse program building ----

/// A new tensor of `vals` stored into `dtype`.
pub fn tensor(rt: &Runtime, dtype: DType, sizes: &[usize], vals: &[f64]) -> Handle {
    upload(rt, &RefTensor::new(dtype, sizes, vals.to_vec()))
}

/// Records `op`; panics with the op's error.
pub fn run(rt: &Runtime, op: Op, ins: &[Input]) -> Handle {
    rt.op(0, op.clone(), ins, None)
        .unwrap_or_else(|e| panic!("{op}: {e}"))
}

pub fn un(rt: &Runtime, u: UnaryOp, x: Handle) -> Handle {
    run(rt, Op::Unary(u), &[Input::Tensor(x)])
}

pub fn bin(rt: &Runtime, b: BinaryOp, x: Input, y: Input) -> Handle {
    run(rt, Op::Binary(b), &[x, y])
}

pub fn red(op: ReduceOp, dims: &[usize], keepdim: bool) -> Op {
    Op::Reduce {
        op,
        dims: dims.iter().copied().collect(),
        keepdim,
    }
}

pub fn view(rt: &Runtime, h: Handle, v: View) -> Handle {
    rt.view(0, h, &v).unwrap_or_else(|e| panic!("{v:?}: {e}"))
}

pub fn tt(h: Handle) -> Input {
    Input::Tensor(h)
}

pub fn fs(v: f64) -> Input {
    Input::Scalar(Scalar::Float(v))
}

pub fn is(v: i64) -> Input {
    Input::Scalar(Scalar::Int(v))
}
