//! Loops whose values come from row routines, over rows shorter than a block.
//!
//! Such a loop runs each block of a row in phases (see `stash`): a pass storing a routine's
//! operand to a scratch row, one routine call, then the pass computing the outputs. Row by
//! row, a row of a few elements paid a whole call and three short passes: a per-channel scale
//! and SiLU over EfficientNet's 2x2 feature maps (rows of 4) cost ~17 ns an element. Here the
//! rows are taken in groups that fill a block: each phase's pass runs over every row of the
//! group, writing the group's operands one after another in the scratch row, then one call
//! covers them all, then the output pass runs row by row again. Each element goes through the
//! same operations as row by row, so the bits are the same. A per-channel scale, SiLU and
//! sigmoid over rows of 4 / 9 / 16 / 32 elements: 17.5 / 10.3 / 4.0 / 2.4 ns an element row
//! by row, 2.7 / 2.0 / 1.6 / 1.4 in groups (1.1 on rows of 1024, one block a row).
//!
//! A row kernel (a loop with reductions) is grouped the same way when all its routine calls
//! are in its first sweep, before any reduction (a SiLU whose mean it takes: squeeze-and-
//! excitation's pooling); the rest of each row (its reduction sweeps, its late sweep) then runs
//! row by row, reading the group's scratch rows at that row's place.

use super::codegen::{counted_loop, Kernel, Operand};
use super::lanes::Emitter;
use super::stash::RowSchedule;
use super::sweep::{phase_call, phase_pass, row_after_group_phases, BLOCK};
use cranelift_codegen::ir::types::I64;
use cranelift_codegen::ir::{InstBuilder, Value};
use deferfuse_fusion::region::{LoopOperand, LoopRegion};

/// What a kernel needs to address any row: the operands' descriptions and (base, outer
/// stride, inner stride) values, the scratch rows' first operand index, the loaded scalar
/// parameters and the row length.
pub struct Rows<'a> {
    pub region: &'a LoopRegion,
    pub descs: &'a [LoopOperand],
    pub bases: &'a [(Value, Value, Value)],
    pub stash_base: usize,
    pub params: &'a [Value],
    pub n_inner: Value,
}

impl Rows<'_> {
    /// Emits the loop over `n_outer` rows of `n_inner` (below [`BLOCK`]) in groups of
    /// `BLOCK / n_inner` rows; returns in the block after the last group.
    pub fn emit(&self, e: &mut Emitter, schedule: &RowSchedule, n_outer: Value) {
        let block = e.b.ins().iconst(I64, BLOCK as i64);
        let per_group = e.b.ins().udiv(block, self.n_inner);
        counted_loop(e, n_outer, per_group, &mut |e, first| {
            let left = e.b.ins().isub(n_outer, first);
            let count = e.b.ins().smin(left, per_group);
            let len = e.b.ins().imul(count, self.n_inner);
            for ph in &schedule.sweeps[0].phases {
                self.each_row(e, first, count, &mut |k, e| {
                    phase_pass(k, e, self.n_inner, ph, &[])
                });
                let zero = e.b.ins().iconst(I64, 0);
                let k = self.kernel(e, first, zero);
                phase_call(&k, e, len, ph);
            }
            self.each_row(e, first, count, &mut |k, e| {
                row_after_group_phases(k, e, self.n_inner, schedule)
            });
        });
    }

    /// Emits `f` for each of the `count` rows from row `first`, on a kernel addressing it.
    fn each_row(
        &self,
        e: &mut Emitter,
        first: Value,
        count: Value,
        f: &mut dyn FnMut(&Kernel, &mut Emitter),
    ) {
        let one = e.b.ins().iconst(I64, 1);
        counted_loop(e, count, one, &mut |e, r| {
            let k = self.kernel(e, first, r);
            f(&k, e);
        });
    }

    /// The kernel at row `first + r`, its scratch rows at the `r`-th row's place in them.
    fn kernel(&self, e: &mut Emitter, first: Value, r: Value) -> Kernel<'_> {
        let row = e.b.ins().iadd(first, r);
        let at = e.b.ins().imul(r, self.n_inner);
        let ops = self
            .descs
            .iter()
            .zip(self.bases)
            .enumerate()
            .map(|(j, (d, &(p, outer, inner)))| {
                // Scratch rows: outer stride 0 (one row for every call), elements `inner` apart.
                let (index, stride) = if j < self.stash_base {
                    (row, outer)
                } else {
                    (at, inner)
                };
                let off = e.b.ins().imul(index, stride);
                Operand {
                    desc: *d,
                    row: e.b.ins().iadd(p, off),
                    inner,
                }
            })
            .collect();
        Kernel {
            region: self.region,
            ops,
            stash_base: self.stash_base,
            params: self.params.to_vec(),
        }
    }
}
