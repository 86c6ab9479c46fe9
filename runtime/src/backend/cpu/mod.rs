//! The CPU backend: a Cranelift JIT. A loop region becomes one native function (see
//! `codegen`); matmul calls the GEMM crate; arange is a host loop.

mod arc_trig;
#[cfg(target_arch = "x86_64")]
mod bf16_gemm;
#[cfg(target_arch = "x86_64")]
mod bf16_gemv;
pub(crate) mod block_math;
mod codegen;
mod column_sums;
pub(crate) mod columns;
#[cfg(target_arch = "x86_64")]
mod gemm_program;
#[cfg(target_arch = "x86_64")]
mod gemv_avx512;
#[cfg(target_arch = "x86_64")]
mod gemv_dot;
mod gemv_rows_avx2;
pub(crate) mod half_gemm;
mod jit_calls;
mod lanes;
pub(crate) mod matmul;
mod packed_gemm;
#[cfg(target_arch = "x86_64")]
mod packed_gemm_avx512;
mod parallel;
mod row_groups;
mod small_gemm;
mod stash;
mod sweep;
mod tiny_gemm;
mod trig;
mod vhalf;
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
use deferfuse_fusion::{Binding, Region};
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
            blocks: schedule.blocked() && region.reduces.is_empty(),
            groups_rows: schedule.groups_rows(),
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
                    let kernel = columns::ColumnKernel::new(self.compile_loop(&v)?, l, transposed);
                    program.columns = Some(Box::new(kernel));
                }
                Arc::new(program)
            }
            Region::Matmul { dtype, epilogue } => Arc::new(gemm_program::MatmulProgram {
                dtype: *dtype,
                epilogue: match epilogue {
                    Some(l) => Some(gemm_program::Epilogue {
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
            Region::Kernel(k) => super::host_kernels::program_on(k, self.side_by_side()),
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
    /// Whether the loop runs block by block (an elementwise loop with block phases): its
    /// scratch rows hold one block, not a row.
    blocks: bool,
    /// Whether rows shorter than a block run in groups (`row_groups`), sharing scratch rows.
    groups_rows: bool,
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
        let longer = match self.stash.is_empty() && self.columns.is_none() {
            true => walk::with_longer_rows(iter),
            false => None,
        };
        let iter = longer.as_ref().unwrap_or(iter);
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
            // A block, or the rows of a group of short rows (`row_groups`): at most a block.
            let row_len = if self.blocks || (self.groups_rows && len < sweep::BLOCK) {
                len.saturating_mul(rows).min(sweep::BLOCK)
            } else {
                len
            };
            let operands = ptrs.len();
            stash::with_rows(&self.stash, row_len, |scratch| {
                ptrs.extend_from_slice(scratch);
                run(ptrs);
            });
            ptrs.truncate(operands);
        }
    }
}

struct ArangeProgram(DType);

impl HostProgram for ArangeProgram {
    unsafe fn run_host(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
        let out = &binding.operands[0];
        let n = out.layout.numel();
        let st = out.layout.strides.first().copied().unwrap_or(1);
        let first = out.layout.offset as isize;
        let p = bases[0];
        if Region::arange_in_integers(self.0) {
            // i64 start and step, each value in i64 (wrapping) and then wrapped to the dtype,
            // as CPU's kernel computes in int64 and casts: in f64, `arange(2**53, 2**53 + 4)`
            // repeated values, and an int32 past 2^31 saturated where CPU wraps.
            let (start, step) = (binding.scalars[0] as i64, binding.scalars[1] as i64);
            let value = |i: usize| start.wrapping_add(step.wrapping_mul(i as i64));
            let at = |i: usize| first + i as isize * st;
            match self.0 {
                DType::I64 => (0..n).for_each(|i| *(p as *mut i64).offset(at(i)) = value(i)),
                DType::I32 => (0..n).for_each(|i| *(p as *mut i32).offset(at(i)) = value(i) as i32),
                DType::U8 => (0..n).for_each(|i| *p.offset(at(i)) = value(i) as u8),
                other => unreachable!("{other} is not an integer dtype"),
            }
            return Ok(());
        }
        let (start, step) = (
            f64::from_bits(binding.scalars[0]),
            f64::from_bits(binding.scalars[1]),
        );
        // One loop per dtype, each element start + i * step in f64, converted as `write_f64`
        // does (i counted in f64: exact below 2^53, and no integer conversion per element): a
        // dtype dispatch per element made arange(262144) take ~5 ns an element (against
        // ~0.4 for CPU eager), and transformers build position ids with it.
        unsafe fn fill<T>(p: *mut u8, first: isize, st: isize, n: usize, f: impl Fn(f64) -> T) {
            let p = (p as *mut T).offset(first);
            let mut i = 0.0f64;
            for k in 0..n as isize {
                *p.offset(k * st) = f(i);
                i += 1.0;
            }
        }
        let value = |i: f64| start + i * step;
        match self.0 {
            DType::F32 => fill(p, first, st, n, |i| value(i) as f32),
            DType::F64 => fill(p, first, st, n, value),
            // As CPU's kernel for half types: start, step and the index in f32 (its `acc_type`),
            // `start + step * i` there, then rounded to the half type (rounded once from f64,
            // `arange(1 + 2**-8 + 2**-30, ...)` gave bf16 1.0078125 where CPU gives 1.0).
            DType::BF16 => {
                let (start, step) = (start as f32, step as f32);
                fill(p, first, st, n, |i| {
                    half::bf16::from_f32(start + step * i as f32).to_bits()
                })
            }
            DType::F16 => {
                let (start, step) = (start as f32, step as f32);
                fill(p, first, st, n, |i| {
                    half::f16::from_f32(start + step * i as f32).to_bits()
                })
            }
            other => {
                (0..n).for_each(|i| write_f64(other, p, first + i as isize * st, value(i as f64)))
            }
        }
        Ok(())
    }
}
