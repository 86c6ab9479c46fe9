//! Runs a generated [`Program`] on one runtime: a handle per slot, a full-buffer handle per
//! storage, host reads where the program asks, and (outside the trace run) mode switches.

use super::*;
use crate::harness::{read_raw, runtime, upload, view, Raw};
use crate::reference::views::RefLayout;
use crate::reference::RefTensor;
use deferfuse::{Handle, Input, Mode, Op, Runtime, Scalar, View};

/// A program running on one runtime: handles per slot, a full-buffer handle per storage.
pub struct Exec<'a> {
    pub rt: &'a Runtime,
    pub n: usize,
    pub slots: Vec<SlotInfo>,
    pub handles: Vec<Handle>,
    pub bases: Vec<Handle>,
    /// Release handles on `Release` (the trace run keeps them to read everything).
    pub release: bool,
    /// Follow `Ins::Mode` (the trace run stays strict to check each op against the reference).
    pub switch_modes: bool,
}

impl<'a> Exec<'a> {
    pub fn new(rt: &'a Runtime, p: &Program, release: bool) -> (Exec<'a>, Vec<RefTensor>) {
        let mut e = Exec {
            rt,
            n: p.n,
            slots: vec![],
            handles: vec![],
            bases: vec![],
            release,
            switch_modes: release,
        };
        let mut storages = Vec::new();
        for (i, (t, strided)) in p.inputs.iter().enumerate() {
            let (big, layout) = input_layouts(t, *strided);
            let mut st = RefTensor::new(t.dtype, &big, vec![-777.0; big.iter().product()]);
            layout.scatter(&mut st, t);
            let base = upload(rt, &st);
            let h = if big == t.sizes {
                base
            } else {
                let end = 2 * t.sizes[t.rank() - 1] as i64;
                view(
                    rt,
                    base,
                    View::Slice {
                        dim: -1,
                        start: 0,
                        end,
                        step: 2,
                    },
                )
            };
            e.slots.push(SlotInfo {
                dtype: t.dtype,
                layout,
                storage: i,
                alive: true,
            });
            e.handles.push(h);
            e.bases.push(base);
            storages.push(st);
        }
        (e, storages)
    }

    fn input(&self, o: Other) -> Input {
        match o {
            Other::Slot(s) => Input::Tensor(self.handles[s]),
            Other::Scalar(v) => Input::Scalar(v),
        }
    }

    fn op(&mut self, op: Op, ins: &[Input], into: Option<usize>) {
        let out = into.map(|t| self.handles[t]);
        let h = self
            .rt
            .op(0, op.clone(), ins, out)
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        if into.is_none() {
            let sizes = self.rt.sizes(h).unwrap().to_vec();
            self.slots.push(SlotInfo {
                dtype: self.rt.dtype(h).unwrap(),
                layout: RefLayout::contiguous(&sizes),
                storage: self.bases.len(),
                alive: true,
            });
            self.handles.push(h);
            self.bases.push(h);
        }
    }

    /// Runs one instruction; returns the bytes of a host read.
    pub fn step(&mut self, ins: &Ins) -> Option<Raw> {
        let t = |s: usize| Input::Tensor(self.handles[s]);
        let f = |v: Option<f64>| v.map_or(Input::Absent, |v| Input::Scalar(Scalar::Float(v)));
        match ins {
            Ins::Unary(u, s, into) => self.op(Op::Unary(*u), &[t(*s)], *into),
            Ins::Binary(b, s, o, into) => self.op(Op::Binary(*b), &[t(*s), self.input(*o)], *into),
            Ins::Where(c, x, y) => self.op(Op::Where, &[t(*c), t(*x), self.input(*y)], None),
            Ins::Clamp(s, lo, hi) => self.op(Op::Clamp, &[t(*s), f(*lo), f(*hi)], None),
            Ins::Cast(s, d) => self.op(Op::Cast(*d), &[t(*s)], None),
            Ins::Reduce(r, s, dims, k) => self.op(red_op(*r, dims, *k), &[t(*s)], None),
            Ins::View(s, v) => {
                let rv = match v {
                    ViewKind::Transpose => View::Transpose(0, 1),
                    ViewKind::Select { dim, index } => View::Select {
                        dim: *dim as i64,
                        index: *index as i64,
                    },
                    ViewKind::Unsqueeze(d) => View::Unsqueeze(*d as i64),
                    ViewKind::SqueezeAll => View::Squeeze(None),
                    ViewKind::ExpandToN => View::Expand(
                        expand_target(&self.slots[*s].layout.sizes, self.n)
                            .into_iter()
                            .map(|x| x as i64)
                            .collect(),
                    ),
                    ViewKind::Narrow { dim, start } => View::Slice {
                        dim: *dim as i64,
                        start: *start as i64,
                        end: *start as i64 + 1,
                        step: 1,
                    },
                    ViewKind::Alias => View::Slice {
                        dim: 0,
                        start: 0,
                        end: i64::MAX,
                        step: 1,
                    },
                    ViewKind::SliceStep { dim, start } => View::Slice {
                        dim: *dim as i64,
                        start: *start as i64,
                        end: i64::MAX,
                        step: 2,
                    },
                    ViewKind::Reverse => View::Permute(vec![2, 1, 0]),
                    ViewKind::Diagonal | ViewKind::Flatten => {
                        let (sizes, strides, offset) =
                            as_strided_args(v, &self.slots[*s].layout, self.n);
                        View::AsStrided {
                            sizes: sizes.iter().map(|&x| x as usize).collect(),
                            strides: strides.iter().map(|&x| x as isize).collect(),
                            offset: offset as usize,
                        }
                    }
                };
                let h = view(self.rt, self.handles[*s], rv);
                let layout = apply_view(&self.slots[*s].layout, v, self.n);
                self.slots.push(SlotInfo {
                    layout,
                    ..self.slots[*s].clone()
                });
                self.handles.push(h);
            }
            Ins::Sync(s) => return Some(read_raw(self.rt, self.handles[*s])),
            Ins::Flush => self.rt.synchronize(0).unwrap(),
            Ins::Release(s) => {
                self.slots[*s].alive = false;
                if self.release {
                    self.rt.release(self.handles[*s]).unwrap();
                }
            }
            Ins::Mode(m) if self.switch_modes => self.rt.set_mode(*m),
            Ins::Mode(_) => {}
        }
        None
    }

    pub fn finals(&self) -> Vec<(usize, Raw)> {
        (0..self.slots.len())
            .filter(|&s| self.slots[s].alive)
            .map(|s| (s, read_raw(self.rt, self.handles[s])))
            .collect()
    }
}

/// Runs `p` in `mode`: the host reads, then every live slot.
pub fn run_mode(p: &Program, mode: Mode) -> (Vec<Raw>, Vec<(usize, Raw)>) {
    run_on(&runtime(mode), p)
}

pub fn run_on(rt: &Runtime, p: &Program) -> (Vec<Raw>, Vec<(usize, Raw)>) {
    // The thread's mode overrides the runtime's default: start from the runtime's own, and
    // restore what the thread had before, whatever `Ins::Mode` set meanwhile.
    rt.push_mode(rt.default_mode());
    let (mut e, _) = Exec::new(rt, p, true);
    let syncs = p.ins.iter().filter_map(|i| e.step(i)).collect();
    let finals = e.finals();
    rt.pop_mode().unwrap();
    (syncs, finals)
}
