//! The GEMM program: a matrix product, split over the pool by output rows (or, for few rows,
//! by columns), optionally followed by a fused epilogue loop that runs block of rows by block
//! of rows while the block is still in cache.

use super::matmul;
use super::parallel::{Pool, SERIAL_BELOW};
use super::{HostProgram, LoopProgram};
use crate::error::{Error, Result};
use deferfuse_fusion::ir::DType;
use deferfuse_fusion::{Binding, IterSpace, StrideKind, TensorRef};
use std::sync::Arc;

/// A GEMM, optionally followed by a fused epilogue loop run block of rows by block of rows.
pub(super) struct MatmulProgram {
    pub(super) dtype: DType,
    pub(super) epilogue: Option<Epilogue>,
    pub(super) pool: Arc<Pool>,
}

/// The loop fused after a GEMM, compiled for the stride kinds its operands had.
pub(super) struct Epilogue {
    pub(super) program: LoopProgram,
    /// The stride kinds the epilogue was compiled for (inputs then outputs).
    pub(super) kinds: Vec<StrideKind>,
    /// How many of its operands are inputs (the GEMM's output is the first).
    pub(super) inputs: usize,
}

/// Output elements per block: the block's rows stay in L2 between the GEMM and the epilogue.
const EPILOGUE_BLOCK_ELEMS: usize = 16 * 1024;

/// Fewest output rows per GEMM call: each call packs all of B again, which costs as much as
/// the arithmetic of a few rows (a 64-row batch cut into 16-row blocks ran 3.6x slower).
const GEMM_MIN_ROWS: usize = 128;

/// Fewest output rows a thread takes: below this, a second thread's own packing of B costs
/// more than the rows it computes.
const GEMM_MIN_ROWS_PER_THREAD: usize = 16;

/// Output rows per thread below which a GEMM is split by columns instead: each thread then
/// packs only its share of B. A 64-row batch split by rows had each of 2 threads pack all of a
/// 1024x1024 B, as long as its share of the arithmetic: 2 threads ran no faster than 1.
const GEMM_COLUMN_SPLIT_BELOW_ROWS: usize = 64;

/// Fewest output columns a thread takes when split by columns (a multiple of the GEMM's
/// register tile widths).
const GEMM_MIN_COLS_PER_THREAD: usize = 64;

/// The part of a GEMM's output one call computes.
#[derive(Clone, Debug)]
enum Part {
    Rows(std::ops::Range<usize>),
    Cols(std::ops::Range<usize>),
    /// Whole matrices: a range of the first batch dim.
    Batches(std::ops::Range<usize>),
}

impl MatmulProgram {
    /// The GEMM for output part `part` of every batch. Splitting rows or columns does not
    /// change any element's sum: each is still one dot product in the same order.
    unsafe fn gemm(&self, binding: &Binding, bases: &[usize], out: usize, part: Part) {
        let ops = &binding.operands;
        let s = |i: usize| f64::from_bits(binding.scalars[i]);
        let d = ops[out].layout.rank() - 2;
        let (al, bl, ol) = match part {
            Part::Rows(r) => (
                ops[0].layout.slice(d, r.start, r.len(), 1),
                ops[1].layout.clone(),
                ops[out].layout.slice(d, r.start, r.len(), 1),
            ),
            Part::Cols(c) => (
                ops[0].layout.clone(),
                ops[1].layout.slice(d + 1, c.start, c.len(), 1),
                ops[out].layout.slice(d + 1, c.start, c.len(), 1),
            ),
            Part::Batches(b) => {
                // An operand broadcast along the dim (size 1) is read whole by every range.
                let cut = |l: &deferfuse_fusion::ir::Layout| match l.sizes[0] {
                    1 => l.clone(),
                    _ => l.slice(0, b.start, b.len(), 1),
                };
                (
                    cut(&ops[0].layout),
                    cut(&ops[1].layout),
                    ops[out].layout.slice(0, b.start, b.len(), 1),
                )
            }
        };
        let a = matmul::Mat {
            ptr: bases[0] as *mut u8,
            layout: &al,
        };
        let b = matmul::Mat {
            ptr: bases[1] as *mut u8,
            layout: &bl,
        };
        let c = matmul::Mat {
            ptr: bases[out] as *mut u8,
            layout: &ol,
        };
        let whole_rows = ops[out].layout.sizes[d];
        matmul::matmul(self.dtype, a, b, c, s(0), s(1), whole_rows);
    }

    /// Runs `f` over the output rows in one chunk per thread (each chunk's GEMM packs B once),
    /// serially when the product is small.
    fn for_row_chunks(
        &self,
        binding: &Binding,
        out: usize,
        f: &(dyn Fn(std::ops::Range<usize>) -> Result<()> + Sync),
    ) -> Result<()> {
        let ops = &binding.operands;
        let d = ops[out].layout.rank() - 2;
        let m = ops[out].layout.sizes[d];
        let flops = ops[out].layout.numel() * ops[0].layout.sizes[d + 1];
        if flops < 64 * SERIAL_BELOW {
            return f(0..m);
        }
        self.pool
            .split(m, GEMM_MIN_ROWS_PER_THREAD, self.pool.threads(), 1, f)
    }

    /// True when the GEMM has too few rows per thread to split by rows, and more (and enough)
    /// columns to split by columns instead: then each thread packs all of A, the smaller
    /// operand, rather than all of B.
    fn splits_columns(&self, binding: &Binding, out: usize) -> bool {
        let l = &binding.operands[out].layout;
        let d = l.rank() - 2;
        let (m, n, k) = (
            l.sizes[d],
            l.sizes[d + 1],
            binding.operands[0].layout.sizes[d + 1],
        );
        let threads = self.pool.threads();
        threads > 1
            && l.numel() * k >= 64 * SERIAL_BELOW
            && m < threads * GEMM_COLUMN_SPLIT_BELOW_ROWS
            && n > m
            && n >= 2 * GEMM_MIN_COLS_PER_THREAD
    }

    /// The first batch dim's size when a batched GEMM is better split by whole matrices than
    /// by each matrix's rows: every operand has the batch dims, the first splits evenly enough
    /// over the threads (a multiple of them, or 4 per thread), and the product is large enough
    /// to split at all. Split by rows, each thread ran its share of every matrix, a few rows
    /// each (attention's `[16, 4, 64, 32] @ [16, 4, 32, 64]`: 32 rows a thread, on the kernel
    /// for few rows), and 2 threads were slower than 1.
    fn batches_to_split(&self, binding: &Binding, out: usize) -> Option<usize> {
        let l = &binding.operands[out].layout;
        let (threads, rank) = (self.pool.threads(), l.rank());
        let ranks = binding.operands[..2]
            .iter()
            .all(|o| o.layout.rank() == rank);
        if threads < 2 || rank < 3 || !ranks {
            return None;
        }
        let (batches, k) = (l.sizes[0], binding.operands[0].layout.sizes[rank - 1]);
        let even = batches % threads == 0 || batches >= 4 * threads;
        (even && batches >= threads && l.numel() * k >= 64 * SERIAL_BELOW).then_some(batches)
    }

    /// The GEMM with its output rows (or, for few rows, its columns; or for a batch, its
    /// matrices) split over the pool.
    unsafe fn parallel_gemm(&self, binding: &Binding, bases: &[usize], out: usize) {
        if let Some(batches) = self.batches_to_split(binding, out) {
            let _ = self.pool.split(batches, 1, self.pool.threads(), 1, &|b| {
                self.gemm(binding, bases, out, Part::Batches(b));
                Ok::<(), Error>(())
            });
            return;
        }
        if self.splits_columns(binding, out) {
            let l = &binding.operands[out].layout;
            let n = l.sizes[l.rank() - 1];
            let threads = self.pool.threads();
            let _ = self
                .pool
                .split(n, GEMM_MIN_COLS_PER_THREAD, threads, 16, &|c| {
                    self.gemm(binding, bases, out, Part::Cols(c));
                    Ok::<(), Error>(())
                });
            return;
        }
        let _ = self.for_row_chunks(binding, out, &|r| {
            self.gemm(binding, bases, out, Part::Rows(r));
            Ok(())
        });
    }
}

impl HostProgram for MatmulProgram {
    unsafe fn run_host(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
        let addrs: Vec<usize> = bases.iter().map(|&p| p as usize).collect();
        let Some(e) = &self.epilogue else {
            self.parallel_gemm(binding, &addrs, 2);
            return Ok(());
        };
        let ops = &binding.operands;
        let out = 2 + e.inputs;
        let idx: Vec<usize> = (2..out).chain(out + 1..ops.len()).collect();
        let e_bases: Vec<*mut u8> = idx.iter().map(|&j| bases[j]).collect();
        let (m, n) = (ops[out].layout.sizes[0], ops[out].layout.sizes[1]);
        let block_rows = (EPILOGUE_BLOCK_ELEMS / n.max(1)).max(GEMM_MIN_ROWS);
        let block = |r0: usize, rows: usize| {
            let operands: Vec<TensorRef> = idx
                .iter()
                .map(|&j| TensorRef {
                    layout: ops[j].layout.slice(0, r0, rows, 1),
                    ..ops[j].clone()
                })
                .collect();
            let strides: Vec<_> = operands.iter().map(|t| t.layout.strides.clone()).collect();
            let iter = IterSpace::coalesce(&[rows, n], &strides, 0);
            Binding {
                operands,
                iter: Some(iter),
                scalars: binding.scalars[2..].to_vec(),
                n_inputs: e.inputs,
                parts: Vec::new(),
            }
        };
        // Blocks must walk their rows like the compiled epilogue expects; otherwise, or when
        // the GEMM has so few rows that its threads split the columns, run the whole GEMM,
        // then the whole epilogue (same results, less cache reuse).
        let fits = |b: &Binding| {
            let it = b.iter.as_ref().expect("blocks have an iteration space");
            (0..e.kinds.len()).all(|j| it.inner_kind(j) == e.kinds[j])
        };
        if m == 0
            || n <= 1
            || self.splits_columns(binding, out)
            || !fits(&block(0, block_rows.min(m)))
            || !fits(&block(m - 1, 1))
        {
            self.parallel_gemm(binding, &addrs, out);
            let whole = Binding {
                operands: idx.iter().map(|&j| ops[j].clone()).collect(),
                iter: binding.iter.clone(),
                scalars: binding.scalars[2..].to_vec(),
                n_inputs: e.inputs,
                parts: Vec::new(),
            };
            return e.program.run_host(&whole, &e_bases);
        }
        let e_addrs: Vec<usize> = e_bases.iter().map(|&p| p as usize).collect();
        // Each thread takes a run of rows and walks it block by block: GEMM, then the
        // epilogue on the block's rows while they are still in cache.
        self.for_row_chunks(binding, out, &|c| {
            let mut r0 = c.start;
            while r0 < c.end {
                let rows = block_rows.min(c.end - r0);
                self.gemm(binding, &addrs, out, Part::Rows(r0..r0 + rows));
                let ptrs: Vec<*mut u8> = e_addrs.iter().map(|&a| a as *mut u8).collect();
                e.program.run_host(&block(r0, rows), &ptrs)?;
                r0 += rows;
            }
            Ok(())
        })
    }
}
