//! The grouped matrix product's host routine (`KernelOp::GroupedMatmul`): the offsets are read
//! when the op runs, and each group is one product of its own block through the CPU backend's
//! GEMM (`cpu::matmul`, the same kernels and summation order as `mm` on that block).

use super::elem::{read_i64, write_f64};
use super::View;
use crate::backend::cpu::matmul::{matmul, Mat};
use crate::backend::SideBySide;
use crate::error::Result;
use deferfuse_fusion::ir::{GroupedMatmul, Layout};
use smallvec::smallvec;

/// Fewest multiply-adds worth splitting over threads (~a millisecond's work at 1 thread).
const SERIAL_BELOW_MACS: usize = 1 << 22;

/// Output rows per job: each job packs all of its group's B, so few rows make packing count.
const ROWS_PER_JOB: usize = 128;

/// Most jobs one group is cut into.
const MAX_PIECES: usize = 4;

/// A 2-D block of `v` starting at element `[r0, c0]` of its last two dims, `batch` picking
/// the index of a leading dim (3-D operands).
fn block(
    v: &View,
    batch: Option<usize>,
    (r0, c0): (usize, usize),
    rows: usize,
    cols: usize,
) -> Layout {
    let d = v.sizes.len();
    let (rs, cs) = (v.strides[d - 2], v.strides[d - 1]);
    let lead = batch.map_or(0, |g| g as isize * v.strides[0]);
    let offset = v.offset + lead + r0 as isize * rs + c0 as isize * cs;
    Layout {
        sizes: smallvec![rows, cols],
        strides: smallvec![rs, cs],
        offset: offset as usize,
    }
}

/// `out = grouped product of a and b` cut by `offs` (see [`GroupedMatmul`] for the cases and
/// how out-of-range offsets are clamped); what no group covers is zero. Split over `threads`
/// by windows of each group's output rows when there is work enough.
///
/// # Safety
/// Every view must lie inside its buffer; `out` must not overlap `a`, `b` or `offs`.
pub(super) unsafe fn run(
    case: GroupedMatmul,
    (a, b, offs): (&View, &View, &View),
    out: &View,
    threads: Option<&dyn SideBySide>,
) -> Result<()> {
    let extent = match case {
        GroupedMatmul::Rows => a.sizes[0],
        GroupedMatmul::Cols => b.sizes[1],
        GroupedMatmul::Contraction => a.sizes[1],
    };
    let (m_all, k_all, n_all) = match case {
        GroupedMatmul::Rows => (a.sizes[0], a.sizes[1], b.sizes[2]),
        GroupedMatmul::Cols => (a.sizes[1], a.sizes[2], b.sizes[1]),
        GroupedMatmul::Contraction => (a.sizes[0], a.sizes[1], b.sizes[1]),
    };
    let ranges = group_ranges(offs, extent);
    // Only what no product writes is zeroed (a pass over the whole output cost as much as the
    // products of a 1024-token expert layer).
    match case {
        GroupedMatmul::Rows | GroupedMatmul::Cols => {
            let mut covered = vec![false; extent];
            for r in &ranges {
                covered[r.clone()].fill(true);
            }
            let mut p = 0;
            while p < extent {
                let len = covered[p..]
                    .iter()
                    .take_while(|&&c| c == covered[p])
                    .count();
                if !covered[p] {
                    zero(
                        &match case {
                            GroupedMatmul::Rows => block(out, None, (p, 0), len, n_all),
                            _ => block(out, None, (0, p), m_all, len),
                        },
                        out,
                    );
                }
                p += len;
            }
        }
        GroupedMatmul::Contraction => {
            for (g, r) in ranges.iter().enumerate() {
                if r.is_empty() {
                    zero(&block(out, Some(g), (0, 0), m_all, n_all), out);
                }
            }
        }
    }
    // Each group's product as (A, B, C) blocks; a job computes a window of one group's
    // output rows.
    let blocks: Vec<(Layout, Layout, Layout)> = ranges
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.is_empty())
        .map(|(g, r)| {
            let (lo, len) = (r.start, r.len());
            match case {
                GroupedMatmul::Rows => (
                    block(a, None, (lo, 0), len, k_all),
                    block(b, Some(g), (0, 0), k_all, n_all),
                    block(out, None, (lo, 0), len, n_all),
                ),
                GroupedMatmul::Cols => (
                    block(a, Some(g), (0, 0), m_all, k_all),
                    block(b, None, (0, lo), k_all, len),
                    block(out, None, (0, lo), m_all, len),
                ),
                GroupedMatmul::Contraction => (
                    block(a, None, (0, lo), m_all, len),
                    block(b, None, (lo, 0), len, n_all),
                    block(out, Some(g), (0, 0), m_all, n_all),
                ),
            }
        })
        .collect();
    let jobs: Vec<(usize, std::ops::Range<usize>)> = blocks
        .iter()
        .enumerate()
        .flat_map(|(i, (_, _, c))| {
            let rows = c.sizes[0];
            let pieces = (rows / ROWS_PER_JOB).clamp(1, MAX_PIECES);
            (0..pieces).map(move |p| (i, rows * p / pieces..rows * (p + 1) / pieces))
        })
        .collect();
    let product = |&(i, ref part): &(usize, std::ops::Range<usize>)| {
        let (la, lb, lc) = &blocks[i];
        let (la, lc) = (
            la.slice(0, part.start, part.len(), 1),
            lc.slice(0, part.start, part.len(), 1),
        );
        // beta = 0: the block is written without being read. The group's whole row count picks
        // the summation order, so a window's bits do not depend on the split.
        // SAFETY: the caller's contract; the window lies inside the group's blocks.
        unsafe {
            matmul(
                out.dtype,
                Mat {
                    ptr: a.base,
                    layout: &la,
                },
                Mat {
                    ptr: b.base,
                    layout: lb,
                },
                Mat {
                    ptr: out.base,
                    layout: &lc,
                },
                1.0,
                0.0,
                blocks[i].2.sizes[0],
            )
        };
    };
    let macs: usize = blocks
        .iter()
        .map(|(la, _, lc)| lc.numel() * la.sizes[1])
        .sum();
    // Groups whose ranges overlap write the same rows (or columns) in group order: serial.
    let disjoint = case == GroupedMatmul::Contraction || ranges_disjoint(&ranges);
    match threads.filter(|_| jobs.len() > 1 && macs >= SERIAL_BELOW_MACS && disjoint) {
        Some(threads) => {
            let shared = Shared(&jobs, &product);
            threads.run_all(jobs.len(), &|j| {
                let Shared(jobs, product) = &shared;
                product(&jobs[j]);
                Ok(())
            })
        }
        None => {
            jobs.iter().for_each(product);
            Ok(())
        }
    }
}

/// Whether no two non-empty ranges share a position.
fn ranges_disjoint(ranges: &[std::ops::Range<usize>]) -> bool {
    let mut end = 0;
    ranges.iter().filter(|r| !r.is_empty()).all(|r| {
        let ok = r.start >= end;
        end = end.max(r.end);
        ok
    })
}

/// The jobs and the routine shared by the threads.
struct Shared<'a, F>(&'a [(usize, std::ops::Range<usize>)], &'a F);

// SAFETY: every job reads the operands and writes only its own window of one group's output
// rows; windows of different jobs (and groups, checked disjoint) do not overlap.
unsafe impl<F> Sync for Shared<'_, F> {}

/// Each group's range of the cut dim: `[offs[g - 1], offs[g])` from 0, each end clamped to
/// `[0, extent]` (empty when the end comes first).
unsafe fn group_ranges(offs: &View, extent: usize) -> Vec<std::ops::Range<usize>> {
    let clamp = |v: i64| v.clamp(0, extent as i64) as usize;
    let mut start = 0i64;
    (0..offs.sizes[0])
        .map(|g| {
            let end = read_i64(
                offs.dtype,
                offs.base,
                offs.offset + g as isize * offs.strides[0],
            );
            let r = clamp(start)..clamp(end).max(clamp(start));
            start = end;
            r
        })
        .collect()
}

/// Writes zero to every element of the 2-D block `l` of `of`'s buffer (all-zero bytes, which is
/// zero in every dtype).
unsafe fn zero(l: &Layout, of: &View) {
    let size = of.dtype.size();
    let (rows, cols) = (l.sizes[0], l.sizes[1]);
    let (rs, cs) = (l.strides[0], l.strides[1]);
    for i in 0..rows as isize {
        let row = l.offset as isize + i * rs;
        if cs == 1 {
            std::ptr::write_bytes(of.base.offset(row * size as isize), 0, cols * size);
        } else {
            for j in 0..cols as isize {
                write_f64(of.dtype, of.base, row + j * cs, 0.0);
            }
        }
    }
}
