//! The CPU backend: a Cranelift JIT. A loop region becomes one native function (see
//! `codegen`); matmul calls the GEMM crate; arange is a host loop.

mod block_math;
mod codegen;
mod columns;
#[cfg(target_arch = "x86_64")]
mod gemv_avx512;
#[cfg(target_arch = "x86_64")]
mod gemv_dot;
#[cfg(target_arch = "x86_64")]
mod gemv_rows_avx2;
mod jit_calls;
mod lanes;
mod matmul;
mod packed_gemm;
#[cfg(target_arch = "x86_64")]
mod packed_gemm_avx512;
mod parallel;
mod small_gemm;
mod stash;
mod sweep;
mod vmath;
mod walk;

pub use block_math::limit_lanes as limit_row_routine_lanes;
pub use jit_calls::erf64;
pub use parallel::SERIAL_BELOW;

use parallel::{Pool, CHUNK_ALIGN};

use super::host_kernels::elem::write_f64;
use super::{Backend, HostProgram, Program};
use crate::error::{Error, Result};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::Context;
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module};
use deferfuse_fusion::ir::DType;
use deferfuse_fusion::region::LoopRegion;
use deferfuse_fusion::{Binding, IterSpace, Region, StrideKind, TensorRef};
use smallvec::SmallVec;
use std::sync::{Arc, Mutex};

/// Kernel entry: `(ptrs, strides, scalars, n_outer, n_inner)`, see `codegen`.
type KernelFn = unsafe extern "C" fn(*const *mut u8, *const i64, *const u64, i64, i64);

/// One entry per operand of a program; most have at most 8.
type OperandList<T> = SmallVec<[T; 8]>;

/// Compiles regions to native code for the host CPU.
pub struct CpuBackend {
    isa: OwnedTargetIsa,
    identity: String,
    /// Keep each program's Cranelift IR for dumps (`DEFERFUSE_DUMP_DIR`).
    keep_listing: bool,
    /// Reused across compiles to avoid reallocating the builder's tables.
    builder_ctx: Mutex<cranelift_frontend::FunctionBuilderContext>,
    /// The threads every program of this backend splits its loops over.
    pool: Arc<Pool>,
    /// Let loops call the 8-lane row routines of `block_math` (the host has AVX2 and FMA).
    block_math: bool,
}

impl CpuBackend {
    /// A backend for the host CPU whose programs use `threads` threads (the calling stream
    /// worker included); `keep_listing` keeps each program's IR for dumps.
    pub fn new(keep_listing: bool, threads: usize) -> Result<CpuBackend> {
        let mut flags = settings::builder();
        let set = |f: &mut settings::Builder, k: &str, v: &str| {
            f.set(k, v)
                .map_err(|e| Error::Backend(format!("cranelift flag {k}={v}: {e}")))
        };
        set(&mut flags, "opt_level", "speed")?;
        set(&mut flags, "is_pic", "false")?;
        set(&mut flags, "use_colocated_libcalls", "false")?;
        // The verifier costs ~35% of compile time; run it in debug builds only.
        set(
            &mut flags,
            "enable_verifier",
            if cfg!(debug_assertions) {
                "true"
            } else {
                "false"
            },
        )?;
        let isa_builder = cranelift_native::builder()
            .map_err(|e| Error::Backend(format!("host CPU not supported by Cranelift: {e}")))?;
        let isa = isa_builder
            .finish(settings::Flags::new(flags))
            .map_err(|e| Error::Backend(format!("building the Cranelift ISA: {e}")))?;
        let features: Vec<String> = isa
            .isa_flags()
            .iter()
            .filter(|f| f.as_bool() == Some(true))
            .map(|f| f.name.to_string())
            .collect();
        let identity = format!("cpu-cranelift:{}:{}", isa.triple(), features.join(","));
        Ok(CpuBackend {
            isa,
            identity,
            keep_listing,
            builder_ctx: Mutex::new(codegen::new_builder_context()),
            pool: Arc::new(Pool::new(threads)?),
            block_math: block_math::available(),
        })
    }

    /// True when loops call the 8-lane row routines (the host has AVX2 and FMA).
    pub fn row_routines(&self) -> bool {
        self.block_math
    }

    /// This backend with every transcendental computed inline, 4 lanes at a time, even where
    /// the host could run the 8-lane row routines: the two give the same bits, and tests
    /// compare them.
    pub fn without_row_routines(mut self) -> CpuBackend {
        self.block_math = false;
        self
    }

    /// Threads each program may use.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    fn compile_loop(&self, region: &LoopRegion) -> Result<LoopProgram> {
        let mut jb =
            JITBuilder::with_isa(self.isa.clone(), cranelift_module::default_libcall_names());
        for (name, ptr) in jit_calls::symbols()
            .into_iter()
            .chain(block_math::symbols())
        {
            jb.symbol(name, ptr);
        }
        let mut module = JITModule::new(jb);
        let sig = codegen::signature(&module);
        // Named after the region (cranelift-jit lists JIT functions in /tmp/perf-PID.map), so
        // `perf report` shows which fused loop the time went to, not one "kernel" for all.
        let name = format!("df {}", crate::timeline::label::loop_label(region));
        let id = module
            .declare_function(&name, Linkage::Export, &sig)
            .map_err(|e| Error::Backend(format!("declaring kernel: {e}")))?;
        let mut ctx = Context::new();
        ctx.func.signature = sig;
        let schedule = sweep::schedule(region, self.block_math);
        {
            let mut fctx = self.builder_ctx.lock().unwrap_or_else(|p| p.into_inner());
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            codegen::build(region, &schedule, &mut b, &mut module);
            b.finalize(self.isa.frontend_config());
        }
        let mut listing = if self.keep_listing {
            ctx.set_disasm(true);
            ctx.func.display().to_string()
        } else {
            String::new()
        };
        module
            .define_function(id, &mut ctx)
            .map_err(|e| Error::Backend(format!("compiling loop region: {e:?}\n{region}")))?;
        if self.keep_listing {
            listing.push_str("\n; ---- optimized IR ----\n");
            listing.push_str(&ctx.func.display().to_string());
        }
        if let Some(asm) = ctx.compiled_code().and_then(|c| c.vcode.as_ref()) {
            // The machine code as Cranelift emitted it: what to read when a loop is slow.
            listing.push_str("\n; ---- machine code ----\n");
            listing.push_str(asm);
        }
        module
            .finalize_definitions()
            .map_err(|e| Error::Backend(format!("finalizing kernel: {e}")))?;
        let code = module.get_finalized_function(id);
        // SAFETY: the function was built with `codegen::signature`, which matches KernelFn.
        let func: KernelFn = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
        Ok(LoopProgram {
            func,
            module: Some(module),
            listing,
            pool: self.pool.clone(),
            stash_rows: if schedule.blocked() && region.reduces.is_empty() {
                Some(sweep::BLOCK)
            } else {
                None
            },
            stash: schedule.slots,
            columns: None,
        })
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn side_by_side(&self) -> Option<Arc<dyn super::SideBySide>> {
        (self.pool.threads() > 1).then(|| self.pool.clone() as Arc<dyn super::SideBySide>)
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn compile(&self, region: &Region) -> Result<Arc<dyn Program>> {
        Ok(match region {
            Region::Loop(l) => {
                let mut program = self.compile_loop(l)?;
                if let Some((v, transposed)) = columns::variant(l) {
                    let kernel = columns::ColumnKernel::new(self.compile_loop(&v)?, transposed);
                    program.columns = Some(Box::new(kernel));
                }
                Arc::new(program)
            }
            Region::Matmul { dtype, epilogue } => Arc::new(MatmulProgram {
                dtype: *dtype,
                epilogue: match epilogue {
                    Some(l) => Some(Epilogue {
                        program: self.compile_loop(l)?,
                        kinds: l
                            .inputs
                            .iter()
                            .chain(l.outputs.iter().map(|(_, o)| o))
                            .map(|o| o.inner)
                            .collect(),
                        inputs: l.inputs.len(),
                    }),
                    None => None,
                },
                pool: self.pool.clone(),
            }),
            Region::Arange { dtype } => Arc::new(ArangeProgram(*dtype)),
            Region::Kernel(k) => super::host_kernels::program(k),
            Region::Graph(_) => {
                return Err(Error::Backend(
                    "the CPU backend compiles loop regions; its capabilities never ask the \
                     planner for a whole-program region"
                        .into(),
                ))
            }
        })
    }
}

/// A compiled loop and the JIT module that owns its code.
struct LoopProgram {
    func: KernelFn,
    module: Option<JITModule>,
    listing: String,
    pool: Arc<Pool>,
    /// The dtypes of the scratch rows each call passes after the operands (see `stash`).
    stash: Vec<DType>,
    /// Elements per scratch row when the loop runs block by block (else a row's length).
    stash_rows: Option<usize>,
    /// For a reduction over leading dims, the kernel that takes its rows gathered.
    columns: Option<Box<columns::ColumnKernel>>,
}

// SAFETY: after finalization the module's code is immutable; it is only freed on drop.
unsafe impl Send for LoopProgram {}
unsafe impl Sync for LoopProgram {}

impl Drop for LoopProgram {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: no caller can hold `func` past the program's lifetime (it is private).
            unsafe { m.free_memory() };
        }
    }
}

impl HostProgram for LoopProgram {
    unsafe fn run_host(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
        let iter = binding
            .iter
            .as_ref()
            .ok_or_else(|| Error::Internal("loop without iteration space".into()))?;
        if iter
            .sizes
            .iter()
            .take(iter.rank() - iter.reduced)
            .any(|&s| s == 0)
        {
            return Ok(()); // nothing to write
        }
        let r = iter.rank();
        let (n_outer, n_inner) = (iter.sizes[r - 2], iter.sizes[r - 1]);
        // Inline lists: a cache-hit flush of a small region spent a quarter of its allocator
        // calls here.
        let elem: OperandList<isize> = binding
            .operands
            .iter()
            .map(|t| t.dtype.size() as isize)
            .collect();
        let mut strides: SmallVec<[i64; 16]> = SmallVec::with_capacity(2 * elem.len());
        for (j, es) in elem.iter().enumerate() {
            strides.push((iter.strides[j][r - 2] * es) as i64);
            strides.push((iter.strides[j][r - 1] * es) as i64);
        }
        for d in &self.stash {
            // Every row of a call reuses the same scratch row.
            strides.push(0);
            strides.push(d.size() as i64);
        }
        // Addresses, not pointers, so that chunks on other threads can share them.
        let starts: OperandList<usize> = binding
            .operands
            .iter()
            .zip(bases)
            .zip(&elem)
            .map(|((t, &b), &es)| b.offset(t.layout.offset as isize * es) as usize)
            .collect();
        if let Some(c) = &self.columns {
            if c.applies(iter, &elem) {
                return c.run(binding, iter, &starts, &strides, &elem);
            }
        }
        let outer_dims = r - 2;
        let walked: usize = iter.sizes[..outer_dims].iter().product();
        // The operands' pointers at byte offsets `at(j)` from their starts, written over the
        // previous call's (one list per chunk, no copy per call).
        let place = |ptrs: &mut OperandList<*mut u8>, at: &dyn Fn(usize) -> isize| {
            for (j, (p, &s)) in ptrs.iter_mut().zip(&starts).enumerate() {
                *p = (s as *mut u8).offset(at(j));
            }
        };
        let new_ptrs =
            || -> OperandList<*mut u8> { starts.iter().map(|&s| s as *mut u8).collect() };
        if walked == 1 && n_outer == 1 && iter.reduced == 0 {
            // One long elementwise row: split it into cache-line-aligned pieces.
            return self.pool.for_chunks(n_inner, 1, CHUNK_ALIGN, &|c| {
                let mut ptrs = new_ptrs();
                place(&mut ptrs, &|j| {
                    c.start as isize * strides[2 * j + 1] as isize
                });
                self.call(&mut ptrs, &strides, &binding.scalars, 1, c.len());
                Ok(())
            });
        }
        // Whole rows (a reduced row is never split); unit `u` is row `u % n_outer` of the
        // `u / n_outer`-th index of the dims the kernel does not walk.
        self.pool.for_chunks(walked * n_outer, n_inner, 1, &|c| {
            let mut u = c.start;
            let mut walk = walk::Walk::at(iter, &elem, u / n_outer);
            let mut row = u % n_outer;
            let mut ptrs = new_ptrs();
            loop {
                let rows = (n_outer - row).min(c.end - u);
                for (j, (p, &s)) in ptrs.iter_mut().zip(&starts).enumerate() {
                    let at = walk.offsets[j] + row as isize * strides[2 * j] as isize;
                    *p = (s as *mut u8).offset(at);
                }
                self.call(&mut ptrs, &strides, &binding.scalars, rows, n_inner);
                u += rows;
                if u >= c.end {
                    return Ok(());
                }
                walk.step();
                row = 0;
            }
        })
    }

    fn listing(&self) -> String {
        self.listing.clone()
    }
}

impl LoopProgram {
    /// Calls the kernel on `rows` rows of `len` elements at `ptrs`, with `strides` (per
    /// operand, then per scratch row), after appending this program's scratch rows when it
    /// stashes values (see `stash`; removed again after the call).
    ///
    /// # Safety
    /// As [`HostProgram::run_host`]: `ptrs` and `strides` address live memory for the call.
    unsafe fn call(
        &self,
        ptrs: &mut OperandList<*mut u8>,
        strides: &[i64],
        scalars: &[u64],
        rows: usize,
        len: usize,
    ) {
        let run = |ptrs: &OperandList<*mut u8>| {
            (self.func)(
                ptrs.as_ptr(),
                strides.as_ptr(),
                scalars.as_ptr(),
                rows as i64,
                len as i64,
            )
        };
        if self.stash.is_empty() {
            run(ptrs);
        } else {
            let row_len = self.stash_rows.map_or(len, |b| b.min(len));
            let operands = ptrs.len();
            stash::with_rows(&self.stash, row_len, |scratch| {
                ptrs.extend_from_slice(scratch);
                run(ptrs);
            });
            ptrs.truncate(operands);
        }
    }
}

/// A GEMM, optionally followed by a fused epilogue loop run block of rows by block of rows.
struct MatmulProgram {
    dtype: DType,
    epilogue: Option<Epilogue>,
    pool: Arc<Pool>,
}

struct Epilogue {
    program: LoopProgram,
    /// The stride kinds the epilogue was compiled for (inputs then outputs).
    kinds: Vec<StrideKind>,
    inputs: usize,
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

    /// The GEMM with its output rows (or, for few rows, its columns) split over the pool.
    unsafe fn parallel_gemm(&self, binding: &Binding, bases: &[usize], out: usize) {
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

struct ArangeProgram(DType);

impl HostProgram for ArangeProgram {
    unsafe fn run_host(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
        let out = &binding.operands[0];
        let (start, step) = (
            f64::from_bits(binding.scalars[0]),
            f64::from_bits(binding.scalars[1]),
        );
        let n = out.layout.numel();
        let st = out.layout.strides.first().copied().unwrap_or(1);
        for i in 0..n {
            let v = start + i as f64 * step;
            let off = out.layout.offset as isize + i as isize * st;
            write_f64(self.0, bases[0], off, v);
        }
        Ok(())
    }
}
