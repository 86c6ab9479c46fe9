//! The numbers and structs of the ABI: enums whose values C passes as `uint32_t` (so a bad value
//! is an error we can report, never undefined behaviour), and the `repr(C)` structs.
//!
//! Every enum here mirrors one in the runtime or fusion crates with the same numbers; the tests
//! at the bottom pin them, so a renumbering on either side fails the build's tests.

use crate::error::{invalid, Result};
use deferfuse_fusion::ir::{DType, Scalar};
use deferfuse_runtime::{Input, Mode};

/// `DfuseConfig.mode` value meaning "read the mode from `TORCH_TPU_DEFER_AND_FUSE` and
/// `TORCH_TPU_LAUNCH_BLOCKING`" (what a runtime created with a NULL config does).
pub const DFUSE_MODE_FROM_ENV: u32 = 0xFFFF_FFFF;

/// `DfuseConfig.backend` value meaning "read `DEFERFUSE_BACKEND`" (`cpu` or `pjrt`; unset means
/// cpu). What `dfuse_config_default` fills in.
pub const DFUSE_BACKEND_FROM_ENV: u32 = 0xFFFF_FFFF;

/// How many dims `DfuseAttrs.dims` holds (reductions over more dims are not supported).
pub const DFUSE_MAX_REDUCE_DIMS: usize = 8;

/// How many entries `DfuseStats.sync_points` has (one per `DfuseSyncReason`).
pub const DFUSE_SYNC_REASON_COUNT: usize = 8;

/// How many entries `DfuseStats.cuts` has (one per `DfuseCutReason`).
pub const DFUSE_CUT_REASON_COUNT: usize = 5;

/// Eager modes, passed as `uint32_t`. The mode is per thread: `dfuse_mode_set`/`push`/`pop`
/// change the calling thread's mode only, and that mode applies to every runtime the thread
/// uses (a thread that never set one uses each runtime's default mode).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseMode {
    /// Each op is its own program, launched asynchronously (like CUDA eager).
    Strict = 0,
    /// Each op waits for completion, so errors surface at the op (`TORCH_TPU_LAUNCH_BLOCKING=1`).
    Debug = 1,
    /// Ops are recorded and run fused at sync points (`TORCH_TPU_DEFER_AND_FUSE=1`).
    Defer = 2,
}

/// Backends, passed as `DfuseConfig.backend` (or `DFUSE_BACKEND_FROM_ENV`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseBackend {
    /// The Cranelift-compiled CPU backend.
    Cpu = 0,
    /// StableHLO compiled by a PJRT plugin (`DfuseConfig.pjrt_plugin` or
    /// `DEFERFUSE_PJRT_PLUGIN`): XLA on CPU, TPU or GPU.
    Pjrt = 1,
}

/// Element types, passed as `uint32_t`; the numbers are the runtime's dtype numbers.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseDtype {
    /// torch.float32
    F32 = 0,
    /// torch.float64
    F64 = 1,
    /// torch.float16
    F16 = 2,
    /// torch.bfloat16
    Bf16 = 3,
    /// torch.int32
    I32 = 4,
    /// torch.int64
    I64 = 5,
    /// torch.uint8
    U8 = 6,
    /// torch.bool (one byte, 0 or 1)
    Bool = 7,
}

/// Where a tensor's buffer is in its life (`dfuse_tensor_state`); for tests and debugging.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseBufferState {
    /// Written by ops still recorded in a trace; nothing has run.
    Deferred = 0,
    /// A program writing it is queued or running.
    Executing = 1,
    /// Its contents are final until the next write.
    Materialized = 2,
}

/// Why pending work was run or waited for; indexes `DfuseStats.sync_points`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseSyncReason {
    /// A host read (to_host, item).
    HostRead = 0,
    /// An explicit stream or device synchronize.
    Synchronize = 1,
    /// An event was recorded on or waited for by the stream.
    Event = 2,
    /// The trace reached `max_pending_ops`.
    MaxPending = 3,
    /// Another stream read a value this stream had not produced yet.
    CrossStream = 4,
    /// A non-deferred op was issued while deferred ops were pending.
    ModeSwitch = 5,
    /// Deferred ops created more bytes of buffers than `max_pending_bytes`.
    MemoryBound = 6,
    /// A host read whose values decide an output's size (`dfuse_tensor_to_host_for_size`:
    /// nonzero, boolean masks, unique).
    DataDependentSize = 7,
}

/// Why the planner ended a fused loop region; indexes `DfuseStats.cuts`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseCutReason {
    /// The next op is not a loop op (arange, a batched matmul) and runs as its own program.
    Unfusable = 0,
    /// The next op iterates over another shape (or reduces over other dims).
    Shape = 1,
    /// The next op reads or writes a buffer of the loop through another view.
    Layout = 2,
    /// A reduction could not join the loop before it.
    Reduction = 3,
    /// The loop reached `max_ops_per_region`.
    MaxOps = 4,
}

/// `DfuseScalar.kind`: which field of the scalar holds its value.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseScalarKind {
    /// A Python float; the value is in `f`.
    Float = 0,
    /// A Python int; the value is in `i`.
    Int = 1,
    /// A Python bool; the value is `i != 0`.
    Bool = 2,
}

/// `DfuseOperand.kind`: what one op input is.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DfuseOperandKind {
    /// A tensor; the handle is in `tensor`.
    Tensor = 0,
    /// A Python float scalar in `f`.
    Float = 1,
    /// A Python int scalar in `i`.
    Int = 2,
    /// A Python bool scalar, `i != 0`.
    Bool = 3,
    /// An optional operand left out (a missing clamp bound).
    Absent = 4,
}

/// A Python number: what `dfuse_tensor_full` fills with and `dfuse_tensor_item` returns.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DfuseScalar {
    /// A `DfuseScalarKind`.
    pub kind: u32,
    /// The value when `kind` is `DFUSE_SCALAR_KIND_FLOAT`.
    pub f: f64,
    /// The value when `kind` is `DFUSE_SCALAR_KIND_INT` (or `DFUSE_SCALAR_KIND_BOOL`: 0 or 1).
    pub i: i64,
}

/// One input of `dfuse_op`: a tensor handle, a scalar, or an absent optional operand.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DfuseOperand {
    /// A `DfuseOperandKind`.
    pub kind: u32,
    /// The tensor handle when `kind` is `DFUSE_OPERAND_KIND_TENSOR`.
    pub tensor: u64,
    /// The value when `kind` is `DFUSE_OPERAND_KIND_FLOAT`.
    pub f: f64,
    /// The value when `kind` is `DFUSE_OPERAND_KIND_INT` or `DFUSE_OPERAND_KIND_BOOL`.
    pub i: i64,
}

/// Counters of one runtime (`dfuse_stats`): what was recorded, compiled and run, and why work ran.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DfuseStats {
    /// Ops recorded (including internal copies, e.g. one per `cat` input).
    pub ops_recorded: u64,
    /// Programs compiled by the backend (cache misses that compiled).
    pub programs_compiled: u64,
    /// Programs launched.
    pub programs_run: u64,
    /// Program cache hits.
    pub cache_hits: u64,
    /// Program cache misses.
    pub cache_misses: u64,
    /// Programs dropped from the cache to stay within `cache_capacity`.
    pub cache_evictions: u64,
    /// Nanoseconds spent compiling.
    pub compile_ns: u64,
    /// Bytes of buffers allocated so far.
    pub bytes_allocated: u64,
    /// Deferred ops dropped because nothing could observe their result.
    pub dead_nodes: u64,
    /// Deferred values computed in registers and never written to memory.
    pub unmaterialized: u64,
    /// Flushes whose plan was reused from an earlier trace of the same structure.
    pub plans_reused: u64,
    /// Host allocations served from the cache of freed blocks.
    pub host_cache_hits: u64,
    /// Host allocations that went to the system allocator.
    pub host_cache_misses: u64,
    /// Bytes of freed host blocks held for reuse.
    pub host_cached_bytes: u64,
    /// Defer-mode traces handed to the stream's worker once they held the pipelining
    /// threshold's ops (`dfuse_pipeline_ops_set`); not sync points.
    pub pipelined_flushes: u64,
    /// Planner cuts, indexed by `DfuseCutReason`.
    pub cuts: [u64; DFUSE_CUT_REASON_COUNT],
    /// Sync points, indexed by `DfuseSyncReason`.
    pub sync_points: [u64; DFUSE_SYNC_REASON_COUNT],
}

/// Decodes an ABI dtype number (`name` is the parameter, for the message).
pub(crate) fn dtype_from(v: u32, name: &str) -> Result<DType> {
    DType::from_u32(v).ok_or_else(|| {
        invalid(format!(
            "{name} = {v} is not a DfuseDtype; expected 0..=7 (F32, F64, F16, BF16, I32, I64, \
             U8, BOOL)"
        ))
    })
}

/// Decodes an ABI mode number.
pub(crate) fn mode_from(v: u32, name: &str) -> Result<Mode> {
    Mode::from_u32(v).ok_or_else(|| {
        invalid(format!(
            "{name} = {v} is not a DfuseMode; expected 0 (STRICT), 1 (DEBUG) or 2 (DEFER)"
        ))
    })
}

/// Converts a scalar (`name` is the parameter, for the message).
pub(crate) fn scalar_from(s: &DfuseScalar, name: &str) -> Result<Scalar> {
    match s.kind {
        0 => Ok(Scalar::Float(s.f)),
        1 => Ok(Scalar::Int(s.i)),
        2 => Ok(Scalar::Bool(s.i != 0)),
        k => Err(invalid(format!(
            "{name}.kind = {k} is not a DfuseScalarKind; expected 0 (FLOAT), 1 (INT) or 2 (BOOL)"
        ))),
    }
}

/// The ABI form of a scalar.
pub(crate) fn scalar_to(s: Scalar) -> DfuseScalar {
    match s {
        Scalar::Float(f) => DfuseScalar {
            kind: DfuseScalarKind::Float as u32,
            f,
            i: 0,
        },
        Scalar::Int(i) => DfuseScalar {
            kind: DfuseScalarKind::Int as u32,
            f: 0.0,
            i,
        },
        Scalar::Bool(b) => DfuseScalar {
            kind: DfuseScalarKind::Bool as u32,
            f: 0.0,
            i: b as i64,
        },
    }
}

/// Converts input `index` of an op call.
pub(crate) fn operand_from(o: &DfuseOperand, index: usize) -> Result<Input> {
    Ok(match o.kind {
        0 => Input::Tensor(o.tensor),
        1 => Input::Scalar(Scalar::Float(o.f)),
        2 => Input::Scalar(Scalar::Int(o.i)),
        3 => Input::Scalar(Scalar::Bool(o.i != 0)),
        4 => Input::Absent,
        k => {
            return Err(invalid(format!(
                "inputs[{index}].kind = {k} is not a DfuseOperandKind; expected 0..=4 (TENSOR, \
                 FLOAT, INT, BOOL, ABSENT)"
            )))
        }
    })
}

/// Converts C sizes (`int64_t`) to the runtime's, rejecting negative ones.
pub(crate) fn sizes_from(sizes: &[i64], name: &str) -> Result<Vec<usize>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            usize::try_from(s).map_err(|_| {
                invalid(format!(
                    "{name}[{i}] = {s} is not a valid size; sizes must be >= 0"
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use deferfuse_runtime::{BufferState, SyncReason};

    #[test]
    fn enum_numbers_match_the_runtime() {
        let dts = [
            DfuseDtype::F32,
            DfuseDtype::F64,
            DfuseDtype::F16,
            DfuseDtype::Bf16,
            DfuseDtype::I32,
            DfuseDtype::I64,
            DfuseDtype::U8,
            DfuseDtype::Bool,
        ];
        assert_eq!(dts.len(), DType::ALL.len());
        for (d, r) in dts.iter().zip(DType::ALL) {
            assert_eq!(*d as u32, r as u32);
            assert_eq!(
                format!("{d:?}").to_lowercase(),
                format!("{r:?}").to_lowercase()
            );
        }
        for (m, r) in [
            (DfuseMode::Strict, Mode::Strict),
            (DfuseMode::Debug, Mode::Debug),
            (DfuseMode::Defer, Mode::Defer),
        ] {
            assert_eq!(m as u32, r as u32);
        }
        assert_eq!(Mode::from_u32(3), None);
        for (s, r) in [
            (DfuseBufferState::Deferred, BufferState::Deferred),
            (DfuseBufferState::Executing, BufferState::Executing),
            (DfuseBufferState::Materialized, BufferState::Materialized),
        ] {
            assert_eq!(s as u32, r as u32);
        }
        let reasons = [
            (DfuseSyncReason::HostRead, SyncReason::HostRead),
            (DfuseSyncReason::Synchronize, SyncReason::Synchronize),
            (DfuseSyncReason::Event, SyncReason::Event),
            (DfuseSyncReason::MaxPending, SyncReason::MaxPending),
            (DfuseSyncReason::CrossStream, SyncReason::CrossStream),
            (DfuseSyncReason::ModeSwitch, SyncReason::ModeSwitch),
            (DfuseSyncReason::MemoryBound, SyncReason::MemoryBound),
            (
                DfuseSyncReason::DataDependentSize,
                SyncReason::DataDependentSize,
            ),
        ];
        assert_eq!(reasons.len(), SyncReason::COUNT);
        assert_eq!(DFUSE_SYNC_REASON_COUNT, SyncReason::COUNT);
        for (s, r) in reasons {
            assert_eq!(s as u32, r as u32);
        }
    }

    #[test]
    fn operands_convert() {
        let o = |kind, tensor, f, i| DfuseOperand { kind, tensor, f, i };
        assert_eq!(operand_from(&o(0, 7, 0.0, 0), 0).unwrap(), Input::Tensor(7));
        assert_eq!(
            operand_from(&o(1, 0, 2.5, 9), 0).unwrap(),
            Input::Scalar(Scalar::Float(2.5))
        );
        assert_eq!(
            operand_from(&o(2, 0, 2.5, -9), 0).unwrap(),
            Input::Scalar(Scalar::Int(-9))
        );
        assert_eq!(
            operand_from(&o(3, 0, 0.0, 5), 0).unwrap(),
            Input::Scalar(Scalar::Bool(true))
        );
        assert_eq!(operand_from(&o(4, 3, 0.0, 0), 0).unwrap(), Input::Absent);
        let e = operand_from(&o(5, 0, 0.0, 0), 3).unwrap_err();
        assert!(e.to_string().contains("inputs[3].kind = 5"), "{e}");
    }

    #[test]
    fn scalars_round_trip() {
        for s in [
            Scalar::Float(-1.5),
            Scalar::Int(i64::MIN),
            Scalar::Bool(true),
        ] {
            assert_eq!(scalar_from(&scalar_to(s), "value").unwrap(), s);
        }
        let bad = DfuseScalar {
            kind: 3,
            f: 0.0,
            i: 0,
        };
        assert!(scalar_from(&bad, "value")
            .unwrap_err()
            .to_string()
            .contains("value.kind = 3"));
    }

    #[test]
    fn negative_sizes_and_unknown_numbers_are_rejected() {
        assert_eq!(sizes_from(&[2, 0, 3], "sizes").unwrap(), vec![2, 0, 3]);
        let e = sizes_from(&[2, -1], "sizes").unwrap_err();
        assert!(e.to_string().contains("sizes[1] = -1"), "{e}");
        assert!(dtype_from(8, "dtype").is_err());
        assert_eq!(dtype_from(3, "dtype").unwrap(), DType::BF16);
        assert!(mode_from(3, "mode")
            .unwrap_err()
            .to_string()
            .contains("mode = 3"));
    }
}
