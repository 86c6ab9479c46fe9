"""ctypes mirror of deferfuse's C ABI (ffi/include/deferfuse.h) for the peers benchmark: the
structs field by field (check_layouts() pins sizes and offsets), the library, a runtime, and a
Recorder that issues ops and releases intermediates the way benches/workloads.rs does."""

import ctypes
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
BUILD_HINT = "cd {} && cargo build --release -p deferfuse-ffi".format(REPO)

# ---------------------------------------------------------------------------------------------
# The C ABI (ffi/include/deferfuse.h), mirrored field by field. A wrong layout corrupts memory,
# so check_layouts() pins every size and offset against the header's C layout (x86-64/aarch64).
# ---------------------------------------------------------------------------------------------

DFUSE_STATUS_NAMES = [
    "OK", "INVALID_ARGUMENT", "INVALID_HANDLE", "BAD_OP", "OUT_OF_MEMORY", "BACKEND",
    "CONFIG", "INTERNAL",
]
DFUSE_MODE_STRICT, DFUSE_MODE_DEFER = 0, 2
DFUSE_BACKEND_CPU = 0
DFUSE_DTYPE_F32 = 0
DFUSE_MAX_REDUCE_DIMS = 8
DFUSE_SYNC_REASON_COUNT = 7
DFUSE_CUT_REASON_COUNT = 6
# DfuseOperandKind
OPERAND_TENSOR, OPERAND_FLOAT = 0, 1
# DfuseOpKind
OP_UNARY, OP_BINARY, OP_REDUCE = 0, 1, 6
# DfuseUnaryOp
U_ABS, U_EXP, U_SQRT, U_RSQRT, U_TANH = 1, 2, 6, 7, 10
# DfuseBinaryOp
B_ADD, B_SUB, B_MUL, B_DIV, B_MAXIMUM = 0, 1, 2, 3, 5
# DfuseReduceOp
R_SUM, R_MEAN, R_AMAX = 0, 1, 3


class DfuseAttrs(ctypes.Structure):
    _fields_ = [
        ("sub_op", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("dims", ctypes.c_int64 * DFUSE_MAX_REDUCE_DIMS),
        ("n_dims", ctypes.c_size_t),
        ("keepdim", ctypes.c_uint8),
        ("dim", ctypes.c_int64),
    ]


class DfuseOperand(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("tensor", ctypes.c_uint64),
        ("f", ctypes.c_double),
        ("i", ctypes.c_int64),
    ]


class DfuseConfig(ctypes.Structure):
    _fields_ = [
        ("mode", ctypes.c_uint32),
        ("max_pending_ops", ctypes.c_uint64),
        ("cache_capacity", ctypes.c_uint64),
        ("max_pending_bytes", ctypes.c_uint64),
        ("max_ops_per_region", ctypes.c_uint64),
        ("host_cache_bytes", ctypes.c_uint64),
        ("backend", ctypes.c_uint32),
        ("num_threads", ctypes.c_uint64),
        ("pjrt_plugin", ctypes.c_char_p),
    ]


class DfuseStats(ctypes.Structure):
    _fields_ = [
        ("ops_recorded", ctypes.c_uint64),
        ("programs_compiled", ctypes.c_uint64),
        ("programs_run", ctypes.c_uint64),
        ("cache_hits", ctypes.c_uint64),
        ("cache_misses", ctypes.c_uint64),
        ("cache_evictions", ctypes.c_uint64),
        ("compile_ns", ctypes.c_uint64),
        ("bytes_allocated", ctypes.c_uint64),
        ("dead_nodes", ctypes.c_uint64),
        ("unmaterialized", ctypes.c_uint64),
        ("plans_reused", ctypes.c_uint64),
        ("host_cache_hits", ctypes.c_uint64),
        ("host_cache_misses", ctypes.c_uint64),
        ("host_cached_bytes", ctypes.c_uint64),
        ("pipelined_flushes", ctypes.c_uint64),
        ("cuts", ctypes.c_uint64 * DFUSE_CUT_REASON_COUNT),
        ("sync_points", ctypes.c_uint64 * DFUSE_SYNC_REASON_COUNT),
    ]


class DfuseScalar(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("f", ctypes.c_double),
        ("i", ctypes.c_int64),
    ]


# (sizeof, {field: offsetof}) as a C compiler lays out the header's structs on LP64.
EXPECTED_LAYOUTS = {
    DfuseAttrs: (96, {"sub_op": 0, "dtype": 4, "dims": 8, "n_dims": 72, "keepdim": 80, "dim": 88}),
    DfuseOperand: (32, {"kind": 0, "tensor": 8, "f": 16, "i": 24}),
    DfuseConfig: (72, {"mode": 0, "max_pending_ops": 8, "cache_capacity": 16,
                       "max_pending_bytes": 24, "max_ops_per_region": 32,
                       "host_cache_bytes": 40, "backend": 48, "num_threads": 56,
                       "pjrt_plugin": 64}),
    DfuseStats: (224, {"ops_recorded": 0, "bytes_allocated": 56, "host_cached_bytes": 104,
                       "pipelined_flushes": 112, "cuts": 120, "sync_points": 168}),
    DfuseScalar: (24, {"kind": 0, "f": 8, "i": 16}),
}


def check_layouts() -> None:
    """Fails if a ctypes struct drifted from the header's layout (only meaningful on LP64)."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return
    for cls, (size, offsets) in EXPECTED_LAYOUTS.items():
        assert ctypes.sizeof(cls) == size, f"sizeof({cls.__name__}) = {ctypes.sizeof(cls)}, want {size}"
        for name, off in offsets.items():
            got = getattr(cls, name).offset
            assert got == off, f"offsetof({cls.__name__}, {name}) = {got}, want {off}"


class DfuseError(RuntimeError):
    pass


class DfuseLib:
    """libdeferfuse.so loaded with ctypes, with argtypes/restypes from the header."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = lib = ctypes.CDLL(str(path))
        u32, u64, i64p = ctypes.c_uint32, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int64)
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        # The runtime pointer is opaque (a token, never dereferenced): c_void_p. Struct pointers
        # are passed as c_void_p addresses too (cheaper per call than byref in the op loop).
        sigs = {
            "dfuse_last_error": (ctypes.c_char_p, []),
            "dfuse_version": (ctypes.c_char_p, []),
            "dfuse_config_default": (ctypes.c_int32, [vp]),
            "dfuse_runtime_create": (ctypes.c_int32, [vp, ctypes.POINTER(vp)]),
            "dfuse_runtime_destroy": (ctypes.c_int32, [vp]),
            "dfuse_mode_get": (ctypes.c_int32, [vp, ctypes.POINTER(u32)]),
            "dfuse_op": (ctypes.c_int32, [vp, u64, u32, vp, vp, sz, u64, vp]),
            "dfuse_stats": (ctypes.c_int32, [vp, vp]),
            "dfuse_release_cached_memory": (ctypes.c_int32, [vp, ctypes.POINTER(u64)]),
            "dfuse_stream_synchronize": (ctypes.c_int32, [vp, u64]),
            "dfuse_tensor_from_host": (ctypes.c_int32, [vp, vp, sz, u32, i64p, sz, ctypes.POINTER(u64)]),
            "dfuse_tensor_to_host": (ctypes.c_int32, [vp, u64, vp, sz]),
            "dfuse_tensor_ndim": (ctypes.c_int32, [vp, u64, ctypes.POINTER(sz)]),
            "dfuse_tensor_shape": (ctypes.c_int32, [vp, u64, i64p, sz]),
            "dfuse_tensor_dtype": (ctypes.c_int32, [vp, u64, ctypes.POINTER(u32)]),
            "dfuse_tensor_retain": (ctypes.c_int32, [vp, u64]),
            "dfuse_tensor_release": (ctypes.c_int32, [vp, u64]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.version = lib.dfuse_version().decode()

    def check(self, status: int, what: str) -> None:
        if status != 0:
            name = DFUSE_STATUS_NAMES[status] if 0 <= status < len(DFUSE_STATUS_NAMES) else "?"
            msg = self.lib.dfuse_last_error().decode(errors="replace")
            raise DfuseError(f"{what} failed: DFUSE_STATUS_{name} ({status}): {msg}")


class DfuseRuntime:
    """One deferfuse runtime in a fixed mode; handles are Python ints, scalars Python floats."""

    def __init__(self, lib: DfuseLib, mode: int, threads: int):
        self.lib, self.L = lib, lib.lib
        cfg = DfuseConfig()
        # A library built before DfuseConfig had num_threads writes 8 bytes less: catch that
        # stale build instead of silently running on the wrong thread count.
        cfg.num_threads = 0xDEADBEEF
        lib.check(self.L.dfuse_config_default(ctypes.addressof(cfg)), "dfuse_config_default")
        if cfg.num_threads == 0xDEADBEEF:
            raise DfuseError(
                f"{lib.path} predates DfuseConfig.num_threads (stale build); rebuild: {BUILD_HINT}")
        cfg.mode = mode
        cfg.num_threads = threads
        ptr = ctypes.c_void_p()
        lib.check(self.L.dfuse_runtime_create(ctypes.addressof(cfg), ctypes.byref(ptr)),
                  "dfuse_runtime_create")
        self.rt = ptr.value
        got = ctypes.c_uint32(99)
        lib.check(self.L.dfuse_mode_get(self.rt, ctypes.byref(got)), "dfuse_mode_get")
        if got.value != mode:
            raise DfuseError(f"runtime mode is {got.value}, asked for {mode}")
        # Reused per call so the op loop allocates no ctypes objects.
        self._attrs = DfuseAttrs()
        self._ins = (DfuseOperand * 2)()
        self._res = ctypes.c_uint64()
        self._attrs_p = ctypes.addressof(self._attrs)
        self._ins_p = ctypes.addressof(self._ins)
        self._res_p = ctypes.addressof(self._res)
        self._op = self.L.dfuse_op
        self._release = self.L.dfuse_tensor_release

    # -- tensors ---------------------------------------------------------------------------
    def from_host(self, arr: np.ndarray) -> int:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        sizes = (ctypes.c_int64 * arr.ndim)(*arr.shape)
        out = ctypes.c_uint64()
        self.lib.check(self.L.dfuse_tensor_from_host(
            self.rt, arr.ctypes.data, arr.nbytes, DFUSE_DTYPE_F32, sizes, arr.ndim,
            ctypes.byref(out)), "dfuse_tensor_from_host")
        return out.value

    def shape(self, h: int) -> tuple[int, ...]:
        nd = ctypes.c_size_t()
        self.lib.check(self.L.dfuse_tensor_ndim(self.rt, h, ctypes.byref(nd)), "dfuse_tensor_ndim")
        sizes = (ctypes.c_int64 * max(nd.value, 1))()
        self.lib.check(self.L.dfuse_tensor_shape(self.rt, h, sizes, len(sizes)), "dfuse_tensor_shape")
        return tuple(sizes[: nd.value])

    def to_host(self, h: int, arr: np.ndarray | None = None) -> np.ndarray:
        if arr is None:
            dt = ctypes.c_uint32()
            self.lib.check(self.L.dfuse_tensor_dtype(self.rt, h, ctypes.byref(dt)), "dfuse_tensor_dtype")
            if dt.value != DFUSE_DTYPE_F32:
                raise DfuseError(f"tensor {h} has dtype {dt.value}, expected F32")
            arr = np.empty(self.shape(h), np.float32)
        self.lib.check(self.L.dfuse_tensor_to_host(self.rt, h, arr.ctypes.data, arr.nbytes),
                       "dfuse_tensor_to_host")
        return arr

    def retain(self, h: int) -> None:
        self.lib.check(self.L.dfuse_tensor_retain(self.rt, h), "dfuse_tensor_retain")

    def release(self, h: int) -> None:
        st = self._release(self.rt, h)
        if st:
            self.lib.check(st, "dfuse_tensor_release")

    # -- ops -------------------------------------------------------------------------------
    def _set(self, slot: int, v: int | float) -> None:
        o = self._ins[slot]
        if isinstance(v, float):
            o.kind, o.f = OPERAND_FLOAT, v
        else:
            o.kind, o.tensor = OPERAND_TENSOR, v

    def _call(self, kind: int, n: int, out: int) -> int:
        st = self._op(self.rt, 0, kind, self._attrs_p, self._ins_p, n, out, self._res_p)
        if st:
            self.lib.check(st, "dfuse_op")
        return self._res.value

    def binary(self, sub: int, x: int | float, y: int | float, out: int = 0) -> int:
        self._attrs.sub_op = sub
        self._set(0, x)
        self._set(1, y)
        return self._call(OP_BINARY, 2, out)

    def unary(self, sub: int, x: int) -> int:
        self._attrs.sub_op = sub
        self._set(0, x)
        return self._call(OP_UNARY, 1, 0)

    def reduce_rows(self, sub: int, x: int) -> int:
        """Reduces dim 1 with keepdim, as workloads.rs's red(op, true) does."""
        a = self._attrs
        a.sub_op, a.n_dims, a.keepdim = sub, 1, 1
        a.dims[0] = 1
        self._set(0, x)
        h = self._call(OP_REDUCE, 1, 0)
        a.n_dims, a.keepdim = 0, 0
        return h

    # -- runtime ---------------------------------------------------------------------------
    def sync(self) -> None:
        st = self.L.dfuse_stream_synchronize(self.rt, 0)
        if st:
            self.lib.check(st, "dfuse_stream_synchronize")

    def stats(self) -> DfuseStats:
        s = DfuseStats()
        self.lib.check(self.L.dfuse_stats(self.rt, ctypes.addressof(s)), "dfuse_stats")
        return s

    def release_cached_memory(self) -> None:
        freed = ctypes.c_uint64()
        self.lib.check(self.L.dfuse_release_cached_memory(self.rt, ctypes.byref(freed)),
                       "dfuse_release_cached_memory")

    def destroy(self) -> None:
        if self.rt:
            self.lib.check(self.L.dfuse_runtime_destroy(self.rt), "dfuse_runtime_destroy")
            self.rt = None


class Recorder:
    """Records one iteration's ops, keeping every new handle so that all but the output can
    be released at the end, before the sync point: exactly workloads.rs's `record`."""

    def __init__(self, rt: DfuseRuntime):
        self.rt, self.live = rt, []

    def bin(self, sub, x, y):
        h = self.rt.binary(sub, x, y)
        self.live.append(h)
        return h

    def un(self, sub, x):
        h = self.rt.unary(sub, x)
        self.live.append(h)
        return h

    def red(self, sub, x):
        h = self.rt.reduce_rows(sub, x)
        self.live.append(h)
        return h

    def inplace(self, sub, x, y, out):
        # Writes into `out`; no new reference, nothing to release.
        self.rt.binary(sub, x, y, out=out)

    def finish(self, out: int) -> int:
        for h in self.live:
            if h != out:
                self.rt.release(h)
        return out


