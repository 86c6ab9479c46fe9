//! The CPU backend: a Cranelift JIT. A loop region becomes one native function (see
//! `codegen`); matmul calls the GEMM crate; arange is a host loop.

mod codegen;
mod helpers;
mod lanes;
mod matmul;
mod sweep;
mod vmath;

pub use helpers::erf64;

use super::{Backend, Program};
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
use half::{bf16, f16};
use std::sync::{Arc, Mutex};

/// Kernel entry: `(ptrs, strides, scalars, n_outer, n_inner)`, see `codegen`.
type KernelFn = unsafe extern "C" fn(*const *mut u8, *const i64, *const u64, i64, i64);

/// Compiles regions to native code for the host CPU.
pub struct CpuBackend {
    isa: OwnedTargetIsa,
    identity: String,
    /// Keep each program's Cranelift IR for dumps (`DEFERFUSE_DUMP_DIR`).
    keep_listing: bool,
    /// Reused across compiles to avoid reallocating the builder's tables.
    builder_ctx: Mutex<cranelift_frontend::FunctionBuilderContext>,
}

impl CpuBackend {
    /// A backend for the host CPU; `keep_listing` keeps each program's IR for dumps.
    pub fn new(keep_listing: bool) -> Result<CpuBackend> {
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
        })
    }

    fn compile_loop(&self, region: &LoopRegion) -> Result<LoopProgram> {
        let mut jb =
            JITBuilder::with_isa(self.isa.clone(), cranelift_module::default_libcall_names());
        for (name, ptr) in helpers::symbols() {
            jb.symbol(name, ptr);
        }
        let mut module = JITModule::new(jb);
        let sig = codegen::signature(&module);
        let id = module
            .declare_function("kernel", Linkage::Export, &sig)
            .map_err(|e| Error::Backend(format!("declaring kernel: {e}")))?;
        let mut ctx = Context::new();
        ctx.func.signature = sig;
        {
            let mut fctx = self.builder_ctx.lock().unwrap_or_else(|p| p.into_inner());
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            codegen::build(region, &mut b, &mut module);
            b.finalize(self.isa.frontend_config());
        }
        let listing = if self.keep_listing {
            ctx.func.display().to_string()
        } else {
            String::new()
        };
        module
            .define_function(id, &mut ctx)
            .map_err(|e| Error::Backend(format!("compiling loop region: {e:?}\n{region}")))?;
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
        })
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn compile(&self, region: &Region) -> Result<Arc<dyn Program>> {
        Ok(match region {
            Region::Loop(l) => Arc::new(self.compile_loop(l)?),
            Region::Matmul { dtype } => Arc::new(MatmulProgram(*dtype)),
            Region::Arange { dtype } => Arc::new(ArangeProgram(*dtype)),
        })
    }
}

/// A compiled loop and the JIT module that owns its code.
struct LoopProgram {
    func: KernelFn,
    module: Option<JITModule>,
    listing: String,
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

impl Program for LoopProgram {
    unsafe fn run(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
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
        let (n_outer, n_inner) = (iter.sizes[r - 2] as i64, iter.sizes[r - 1] as i64);
        let sizes: Vec<isize> = binding
            .operands
            .iter()
            .map(|t| t.dtype.size() as isize)
            .collect();
        let mut strides = Vec::with_capacity(2 * sizes.len());
        for (j, es) in sizes.iter().enumerate() {
            strides.push((iter.strides[j][r - 2] * es) as i64);
            strides.push((iter.strides[j][r - 1] * es) as i64);
        }
        let starts: Vec<*mut u8> = binding
            .operands
            .iter()
            .zip(bases)
            .zip(&sizes)
            .map(|((t, &b), &es)| b.offset(t.layout.offset as isize * es))
            .collect();
        // Walk the dims the kernel does not (all but the last two).
        let outer_dims = r - 2;
        let mut idx = vec![0usize; outer_dims];
        let mut ptrs = starts.clone();
        loop {
            (self.func)(
                ptrs.as_ptr(),
                strides.as_ptr(),
                binding.scalars.as_ptr(),
                n_outer,
                n_inner,
            );
            let mut d = outer_dims;
            loop {
                if d == 0 {
                    return Ok(());
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < iter.sizes[d] {
                    break;
                }
                idx[d] = 0;
            }
            for (j, p) in ptrs.iter_mut().enumerate() {
                let off: isize = (0..outer_dims)
                    .map(|k| idx[k] as isize * iter.strides[j][k])
                    .sum();
                *p = starts[j].offset(off * sizes[j]);
            }
        }
    }

    fn listing(&self) -> String {
        self.listing.clone()
    }
}

struct MatmulProgram(DType);

impl Program for MatmulProgram {
    unsafe fn run(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
        let ops = &binding.operands;
        let m = |i: usize| matmul::Mat {
            ptr: bases[i],
            layout: &ops[i].layout,
        };
        let s = |i: usize| f64::from_bits(binding.scalars[i]);
        matmul::matmul(self.0, m(0), m(1), m(2), s(0), s(1));
        Ok(())
    }
}

struct ArangeProgram(DType);

impl Program for ArangeProgram {
    unsafe fn run(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
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

/// Stores `v` converted to `dtype` at element `off`.
unsafe fn write_f64(dtype: DType, p: *mut u8, off: isize, v: f64) {
    match dtype {
        DType::F32 => *(p as *mut f32).offset(off) = v as f32,
        DType::F64 => *(p as *mut f64).offset(off) = v,
        DType::F16 => *(p as *mut u16).offset(off) = f16::from_f64(v).to_bits(),
        DType::BF16 => *(p as *mut u16).offset(off) = bf16::from_f64(v).to_bits(),
        DType::I32 => *(p as *mut i32).offset(off) = v as i32,
        DType::I64 => *(p as *mut i64).offset(off) = v as i64,
        DType::U8 => *p.offset(off) = v as i64 as u8,
        DType::Bool => *p.offset(off) = (v != 0.0) as u8,
    }
}
