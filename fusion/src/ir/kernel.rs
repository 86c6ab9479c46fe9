//! Kernel ops: gather, scatter, scans, sort, random numbers, depthwise convolutions, grouped
//! matrix products, the CTC loss and the RNN recurrences. Each output element depends on
//! elements other than its own position (or on a counter), so none fuses into a loop: the
//! planner cuts around them (`unfusable`) and a backend runs each as one host routine.
//!
//! The sub-enums are `repr(u32)` with explicit numbers because the C ABI passes them; append
//! new values, never renumber.

use super::conv::{infer_conv, Conv};
use super::ctc::{infer_ctc, Ctc};
use super::depthwise::{infer_depthwise, Depthwise};
use super::dtype::DType;
use super::error::{OpError, OpResult};
use super::grouped_matmul::{infer_grouped_matmul, GroupedMatmul};
use super::infer::{ArgMeta, Inferred};
use super::layout::{fmt_dims, wrap_dim, Dims};
use super::op::{Op, Scalar};
use super::recurrence::{infer_recurrence, Recurrence};
use super::shapes::check_numel;
use super::wide_matmul::infer_wide_matmul;

/// How `scatter` combines a scattered value with what is already there (torch's `reduce=`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterReduce {
    /// `torch.scatter`: the value replaces the element (duplicate indices: the last in index
    /// order wins, deterministically).
    Assign = 0,
    /// `scatter_add` / `scatter_reduce("sum")`.
    Sum = 1,
    /// `scatter_reduce("prod")`.
    Prod = 2,
    /// `scatter_reduce("amax")`; propagates NaN.
    Amax = 3,
    /// `scatter_reduce("amin")`; propagates NaN.
    Amin = 4,
    /// `scatter_reduce("mean")`: the sum divided by how many values met there (counting the
    /// original element with `include_self`); integers divide with floor, like torch.
    Mean = 5,
}

impl ScatterReduce {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [ScatterReduce; 6] = [
        ScatterReduce::Assign,
        ScatterReduce::Sum,
        ScatterReduce::Prod,
        ScatterReduce::Amax,
        ScatterReduce::Amin,
        ScatterReduce::Mean,
    ];

    /// Decodes an ABI number; `None` for an unknown value, so callers can report it.
    pub fn from_u32(v: u32) -> Option<ScatterReduce> {
        ScatterReduce::ALL.get(v as usize).copied()
    }
}

/// The running operation of a scan (`cumsum`, `cumprod`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// Running sum (`cumsum`).
    Sum = 0,
    /// Running product (`cumprod`).
    Prod = 1,
}

impl ScanOp {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [ScanOp; 2] = [ScanOp::Sum, ScanOp::Prod];

    /// Decodes an ABI number; `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<ScanOp> {
        ScanOp::ALL.get(v as usize).copied()
    }
}

/// The distribution `Random` draws from.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RandomDist {
    /// Uniform on [0, 1) (`torch.rand`).
    Uniform = 0,
    /// Standard normal (`torch.randn`), by Box-Muller.
    Normal = 1,
}

impl RandomDist {
    /// Every variant, indexed by its ABI number.
    pub const ALL: [RandomDist; 2] = [RandomDist::Uniform, RandomDist::Normal];

    /// Decodes an ABI number; `None` for an unknown value.
    pub fn from_u32(v: u32) -> Option<RandomDist> {
        RandomDist::ALL.get(v as usize).copied()
    }
}

/// A non-elementwise op that runs as a host routine. Dims are already wrapped (non-negative).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelOp {
    /// `torch.gather(src, dim, index)`: operands src, index (int64 or int32, same rank);
    /// `out[..i..] = src[..index[..i..]..]` along `dim`; the result has the index's shape.
    Gather {
        /// The dim indexed along.
        dim: usize,
    },
    /// Functional `scatter` / `scatter_add` / `scatter_reduce`: operands self, index, then
    /// src (a tensor) or a scalar value; the result is a copy of self with src scattered along
    /// `dim`. Without `include_self` an element that receives values starts from them alone.
    Scatter {
        /// The dim values are scattered along.
        dim: usize,
        /// How values meeting at one element combine.
        reduce: ScatterReduce,
        /// Whether the original element of self takes part in the reduction.
        include_self: bool,
        /// float16/bfloat16 sums, means and products accumulate in float32, each element
        /// rounded once (CPU's `scatter_add` and `scatter_reduce`; a mean divides the rounded
        /// sum by the count rounded to the dtype, as there); else every step is rounded to the
        /// dtype (CPU's `index_put_` accumulate, 1-D `index_add`). Other dtypes ignore it.
        wide: bool,
    },
    /// `cumsum` / `cumprod` along `dim`; `dtype` is torch's `dtype=` argument (the input is
    /// cast to it first). Without it integer and bool inputs give int64.
    Scan {
        /// Running sum or product.
        op: ScanOp,
        /// The dim scanned along.
        dim: usize,
        /// The result dtype asked for, if any.
        dtype: Option<DType>,
    },
    /// `argsort(stable=True)`: int64 indices of a stable sort along `dim`; NaN sorts as the
    /// largest value. With a `limit`, only each row's first `limit` positions (`topk`).
    Sort {
        /// The dim sorted along.
        dim: usize,
        /// Largest first.
        descending: bool,
        /// How many leading positions of each sorted row to produce (the output's size along
        /// `dim`); None: all of them.
        limit: Option<usize>,
    },
    /// A tensor of `sizes` and float `dtype` drawn from `dist`; operands are the int scalars
    /// seed and offset. Element e's value depends only on (seed, offset, e) (Philox4x32-10).
    Random {
        /// The distribution drawn from.
        dist: RandomDist,
        /// Shape of the result.
        sizes: Dims,
        /// Dtype of the result (a float dtype).
        dtype: DType,
    },
    /// A depthwise convolution's forward or one of its gradients (`depthwise.rs`); boxed, as
    /// its geometry is several times the size of the other variants.
    Depthwise(Box<Depthwise>),
    /// A grouped matrix product (`torch._grouped_mm`, `grouped_matmul.rs`): operands a, b and
    /// the int offsets that cut one of their dims into groups; the result has a's dtype.
    GroupedMatmul(GroupedMatmul),
    /// A part of the CTC loss (`ctc.rs`): its alphas, its per-sample loss or its gradient.
    Ctc(Ctc),
    /// A dense stride-1 convolution (`conv.rs`), whose columns are never written; boxed like
    /// `Depthwise`.
    Conv(Box<Conv>),
    /// The steps of one LSTM or GRU layer's direction, forward or backward (`recurrence.rs`).
    Recurrence(Recurrence),
    /// `a @ b` of float16/bfloat16 operands summed and returned in float32 (`wide_matmul.rs`):
    /// a half-precision convolution's input gradient, whose overlapping windows are added in
    /// float32. Append-only position: the C ABI numbers kernel ops by kind, not by index.
    WideMatmul,
}

impl KernelOp {
    /// The PyTorch-style name used in errors, logs and dumps.
    pub fn name(&self) -> &'static str {
        match self {
            KernelOp::Gather { .. } => "gather",
            KernelOp::Scatter {
                reduce: ScatterReduce::Assign,
                ..
            } => "scatter",
            KernelOp::Scatter { .. } => "scatter_reduce",
            KernelOp::Scan {
                op: ScanOp::Sum, ..
            } => "cumsum",
            KernelOp::Scan {
                op: ScanOp::Prod, ..
            } => "cumprod",
            KernelOp::Sort { .. } => "argsort",
            KernelOp::Random {
                dist: RandomDist::Uniform,
                ..
            } => "rand",
            KernelOp::Random {
                dist: RandomDist::Normal,
                ..
            } => "randn",
            KernelOp::Depthwise(_) => "depthwise_conv",
            KernelOp::GroupedMatmul(_) => "grouped_mm",
            KernelOp::Ctc(_) => "ctc_loss",
            KernelOp::Conv(c) if c.part == super::conv::ConvPart::ColumnsToInput => "col2im",
            KernelOp::Conv(c) if c.part == super::conv::ConvPart::InputToColumns => "im2col",
            KernelOp::Conv(_) => "conv",
            KernelOp::Recurrence(r) => r.part.name(),
            KernelOp::WideMatmul => "wide_matmul",
        }
    }

    /// The same op with what a backend does not need to compile it left out: a region is
    /// keyed by it, and random's sizes arrive with the output (a new shape compiles nothing).
    pub fn canonical(&self) -> KernelOp {
        match self {
            KernelOp::Random { dist, dtype, .. } => KernelOp::Random {
                dist: *dist,
                sizes: Dims::new(),
                dtype: *dtype,
            },
            other => other.clone(),
        }
    }

    /// The dtype the op computes its result in, given its first tensor operand's dtype
    /// (`None` for random, which has none).
    pub fn result_dtype(&self, first: Option<DType>) -> DType {
        let first = first.unwrap_or(DType::F32);
        match self {
            KernelOp::Gather { .. } | KernelOp::Scatter { .. } => first,
            KernelOp::Scan { dtype: Some(d), .. } => *d,
            KernelOp::Scan { .. } if first.is_float() => first,
            KernelOp::Scan { .. } | KernelOp::Sort { .. } => DType::I64,
            KernelOp::Random { dtype, .. } => *dtype,
            KernelOp::Depthwise(_) | KernelOp::GroupedMatmul(_) => first,
            // im2col copies its operand; the products sum bfloat16 operands into float32.
            KernelOp::Conv(c) if c.part == super::conv::ConvPart::InputToColumns => first,
            KernelOp::Conv(_) => DType::F32,
            // Grad's first operand is the gradient, of log_probs' dtype too.
            KernelOp::Ctc(_) => first,
            KernelOp::Recurrence(_) | KernelOp::WideMatmul => DType::F32,
        }
    }
}

/// The tensor operand `i` of a kernel op, or an error naming it.
pub(super) fn tensor<'a>(
    name: &str,
    args: &'a [ArgMeta],
    i: usize,
    what: &str,
) -> OpResult<(DType, &'a Dims)> {
    match args.get(i) {
        Some(ArgMeta::Tensor { dtype, sizes }) => Ok((*dtype, sizes)),
        other => Err(OpError::new(
            name,
            format!("input {i} ({what})"),
            "a tensor",
            match other {
                Some(a) => format!("{a:?}"),
                None => "nothing".into(),
            },
        )),
    }
}

fn expect_count(name: &str, args: &[ArgMeta], n: usize, what: &str) -> OpResult<()> {
    if args.len() != n {
        return Err(OpError::new(
            name,
            "inputs",
            format!("{n} operands ({what})"),
            format!("{}", args.len()),
        ));
    }
    Ok(())
}

/// `dim` must name a dim of a tensor of `rank` (a 0-dim tensor has the one dim 0, like torch).
fn check_dim(name: &str, dim: usize, rank: usize) -> OpResult<()> {
    wrap_dim(name, dim as i64, rank).map(|_| ())
}

/// An index operand: int64 or int32, of the same rank as the tensor it indexes.
fn check_index(name: &str, dtype: DType, sizes: &[usize], rank: usize) -> OpResult<()> {
    if !matches!(dtype, DType::I64 | DType::I32) {
        return Err(OpError::new(
            name,
            "input 1 (index)",
            "an int64 or int32 tensor",
            format!("dtype {dtype}"),
        )
        .hint("cast the index with .long() first"));
    }
    if sizes.len() != rank {
        return Err(OpError::new(
            name,
            "input 1 (index)",
            format!("{rank} dims (as many as input 0)"),
            format!("shape {}", fmt_dims(sizes)),
        )
        .hint("index and input must have the same number of dimensions"));
    }
    Ok(())
}

/// torch's rule: `index.size(d) <= of.size(d)` for every dim `d` except `skip`.
fn check_index_fits(
    name: &str,
    index: &[usize],
    of: &[usize],
    of_name: &str,
    skip: Option<usize>,
) -> OpResult<()> {
    for d in 0..index.len() {
        if Some(d) != skip && index[d] > of[d] {
            return Err(OpError::new(
                name,
                "input 1 (index)",
                format!("size <= {} in dim {d} (the size of {of_name})", of[d]),
                format!("shape {} against {}", fmt_dims(index), fmt_dims(of)),
            ));
        }
    }
    Ok(())
}

/// Output dtype and shape of a kernel op, or why it is invalid.
pub(super) fn infer_kernel(op: &Op, k: &KernelOp, args: &[ArgMeta]) -> OpResult<Inferred> {
    let name = op.name();
    match k {
        KernelOp::Gather { dim } => {
            expect_count(name, args, 2, "src, index")?;
            let (sd, src) = tensor(name, args, 0, "src")?;
            let (id, index) = tensor(name, args, 1, "index")?;
            check_dim(name, *dim, src.len())?;
            check_index(name, id, index, src.len())?;
            check_index_fits(name, index, src, "input 0", Some(*dim))?;
            Ok(Inferred {
                dtype: sd,
                sizes: index.clone(),
                compute: sd,
            })
        }
        KernelOp::Scatter { dim, reduce, .. } => {
            expect_count(name, args, 3, "self, index, src or value")?;
            let (sd, this) = tensor(name, args, 0, "self")?;
            let (id, index) = tensor(name, args, 1, "index")?;
            check_dim(name, *dim, this.len())?;
            check_index(name, id, index, this.len())?;
            check_index_fits(name, index, this, "input 0", Some(*dim))?;
            match &args[2] {
                ArgMeta::Tensor { dtype, sizes } => {
                    if *dtype != sd {
                        return Err(OpError::new(
                            name,
                            "input 2 (src)",
                            format!("dtype {sd} (the dtype of input 0)"),
                            format!("{dtype}"),
                        ));
                    }
                    if sizes.len() != this.len() {
                        return Err(OpError::new(
                            name,
                            "input 2 (src)",
                            format!("{} dims (as many as input 0)", this.len()),
                            format!("shape {}", fmt_dims(sizes)),
                        ));
                    }
                    check_index_fits(name, index, sizes, "input 2", None)?;
                }
                ArgMeta::Scalar(_) => {}
                ArgMeta::Absent => {
                    return Err(OpError::new(
                        name,
                        "input 2 (src)",
                        "a tensor or a scalar",
                        "nothing",
                    ))
                }
            }
            if *reduce == ScatterReduce::Mean && sd == DType::Bool {
                return Err(OpError::new(
                    name,
                    "input 0",
                    "a numeric dtype for reduce=mean",
                    "dtype bool",
                ));
            }
            Ok(Inferred {
                dtype: sd,
                sizes: this.clone(),
                compute: sd,
            })
        }
        KernelOp::Scan { dim, .. } => {
            expect_count(name, args, 1, "input")?;
            let (dt, sizes) = tensor(name, args, 0, "input")?;
            check_dim(name, *dim, sizes.len())?;
            let out = k.result_dtype(Some(dt));
            Ok(Inferred {
                dtype: out,
                sizes: sizes.clone(),
                compute: out,
            })
        }
        KernelOp::Sort { dim, limit, .. } => {
            expect_count(name, args, 1, "input")?;
            let (dt, sizes) = tensor(name, args, 0, "input")?;
            check_dim(name, *dim, sizes.len())?;
            let mut sizes = sizes.clone();
            if let Some(k) = *limit {
                if k > sizes[*dim] {
                    return Err(OpError::new(
                        name,
                        "limit",
                        format!("at most {} (the size of dim {dim})", sizes[*dim]),
                        format!("{k}"),
                    )
                    .hint("ask for no more positions than the sorted dim holds"));
                }
                sizes[*dim] = k;
            }
            Ok(Inferred {
                dtype: DType::I64,
                sizes,
                compute: dt,
            })
        }
        KernelOp::Random { sizes, dtype, .. } => {
            expect_count(name, args, 2, "seed, offset")?;
            for (i, what) in [(0, "seed"), (1, "offset")] {
                if !matches!(args[i], ArgMeta::Scalar(Scalar::Int(_))) {
                    return Err(OpError::new(
                        name,
                        format!("input {i} ({what})"),
                        "an int scalar",
                        format!("{:?}", args[i]),
                    ));
                }
            }
            if !dtype.is_float() {
                return Err(OpError::new(
                    name,
                    "dtype",
                    "a floating dtype",
                    format!("{dtype}"),
                ));
            }
            check_numel(name, sizes)?;
            Ok(Inferred {
                dtype: *dtype,
                sizes: sizes.clone(),
                compute: *dtype,
            })
        }
        KernelOp::Depthwise(d) => infer_depthwise(d, args),
        KernelOp::GroupedMatmul(g) => infer_grouped_matmul(*g, args),
        KernelOp::Ctc(c) => infer_ctc(c, args),
        KernelOp::Conv(c) => infer_conv(c, args),
        KernelOp::Recurrence(r) => infer_recurrence(r, args),
        KernelOp::WideMatmul => infer_wide_matmul(args),
    }
}

impl std::fmt::Display for KernelOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())?;
        match self {
            KernelOp::Gather { dim } => write!(f, ".dim{dim}"),
            KernelOp::Scatter {
                dim,
                reduce,
                include_self,
                wide,
            } => {
                write!(f, ".{reduce:?}.dim{dim}.include_self={include_self}")?;
                if *wide {
                    f.write_str(".wide")?;
                }
                Ok(())
            }
            KernelOp::Scan { dim, dtype, .. } => {
                write!(f, ".dim{dim}")?;
                match dtype {
                    Some(d) => write!(f, ".{d}"),
                    None => Ok(()),
                }
            }
            KernelOp::Sort {
                dim,
                descending,
                limit,
            } => {
                write!(
                    f,
                    ".dim{dim}{}",
                    if *descending { ".descending" } else { "" }
                )?;
                match limit {
                    Some(k) => write!(f, ".first{k}"),
                    None => Ok(()),
                }
            }
            KernelOp::Random { sizes, dtype, .. } => write!(f, ".{dtype}{:?}", sizes.as_slice()),
            KernelOp::Depthwise(d) => write!(f, "{d}"),
            KernelOp::GroupedMatmul(g) => write!(f, ".{g}"),
            KernelOp::Ctc(c) => write!(f, "{c}"),
            KernelOp::Conv(c) => write!(f, "{c}"),
            KernelOp::Recurrence(r) => write!(f, "{r}"),
            KernelOp::WideMatmul => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::infer;
    use smallvec::smallvec;

    fn t(d: DType, s: &[usize]) -> ArgMeta {
        ArgMeta::tensor(d, s)
    }

    fn gather(dim: usize) -> Op {
        Op::Kernel(KernelOp::Gather { dim })
    }

    #[test]
    fn gather_takes_the_index_shape_and_the_source_dtype() {
        let r = infer(
            &gather(1),
            &[t(DType::F16, &[3, 5, 2]), t(DType::I32, &[2, 7, 1])],
        )
        .unwrap();
        assert_eq!((r.dtype, r.sizes.as_slice()), (DType::F16, &[2, 7, 1][..]));
    }

    #[test]
    fn gather_rejects_an_index_larger_than_the_source_outside_dim() {
        let e = infer(
            &gather(1),
            &[t(DType::F32, &[3, 5]), t(DType::I64, &[4, 1])],
        )
        .unwrap_err();
        assert_eq!(e.operand, "input 1 (index)");
        assert!(e.expected.contains("size <= 3 in dim 0"), "{e}");
    }

    #[test]
    fn gather_rejects_a_float_index_and_another_rank() {
        let e = infer(&gather(0), &[t(DType::F32, &[3]), t(DType::F32, &[3])]).unwrap_err();
        assert!(e.to_string().contains("an int64 or int32 tensor"), "{e}");
        let e = infer(&gather(0), &[t(DType::F32, &[3]), t(DType::I64, &[3, 1])]).unwrap_err();
        assert!(e.to_string().contains("1 dims (as many as input 0)"), "{e}");
        let e = infer(
            &gather(2),
            &[t(DType::F32, &[3, 2]), t(DType::I64, &[3, 1])],
        )
        .unwrap_err();
        assert_eq!(e.operand, "dim");
    }

    #[test]
    fn scatter_needs_src_of_the_self_dtype() {
        let op = Op::Kernel(KernelOp::Scatter {
            dim: 0,
            reduce: ScatterReduce::Sum,
            include_self: true,
            wide: false,
        });
        let e = infer(
            &op,
            &[
                t(DType::F32, &[4]),
                t(DType::I64, &[2]),
                t(DType::F64, &[2]),
            ],
        )
        .unwrap_err();
        assert_eq!(e.operand, "input 2 (src)");
        let ok = infer(
            &op,
            &[
                t(DType::F32, &[4]),
                t(DType::I64, &[2]),
                ArgMeta::Scalar(Scalar::Float(1.0)),
            ],
        )
        .unwrap();
        assert_eq!(ok.sizes.as_slice(), &[4]);
    }

    #[test]
    fn integer_cumsum_gives_int64_unless_a_dtype_is_given() {
        let scan = |dtype| {
            Op::Kernel(KernelOp::Scan {
                op: ScanOp::Sum,
                dim: 0,
                dtype,
            })
        };
        assert_eq!(
            infer(&scan(None), &[t(DType::U8, &[3])]).unwrap().dtype,
            DType::I64
        );
        assert_eq!(
            infer(&scan(None), &[t(DType::BF16, &[3])]).unwrap().dtype,
            DType::BF16
        );
        let d = infer(&scan(Some(DType::F64)), &[t(DType::I32, &[3])]).unwrap();
        assert_eq!(d.dtype, DType::F64);
    }

    #[test]
    fn random_needs_int_seed_and_offset_and_a_float_dtype() {
        let op = |dtype| {
            Op::Kernel(KernelOp::Random {
                dist: RandomDist::Normal,
                sizes: smallvec![2, 3],
                dtype,
            })
        };
        let int = ArgMeta::Scalar(Scalar::Int(1));
        assert!(infer(&op(DType::F32), &[int.clone(), int.clone()]).is_ok());
        assert!(infer(&op(DType::I64), &[int.clone(), int.clone()]).is_err());
        let e = infer(&op(DType::F32), &[int, ArgMeta::Scalar(Scalar::Float(1.0))]).unwrap_err();
        assert_eq!(e.operand, "input 1 (offset)");
    }

    #[test]
    fn canonical_random_leaves_its_sizes_to_the_output() {
        let k = KernelOp::Random {
            dist: RandomDist::Uniform,
            sizes: smallvec![7],
            dtype: DType::F32,
        };
        assert!(matches!(k.canonical(), KernelOp::Random { sizes, .. } if sizes.is_empty()));
    }
}
