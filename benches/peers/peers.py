#!/usr/bin/env python3
"""deferfuse against its Python peers on the workloads of shared/notes/workloads.md.

Runs chain10, gelu, softmax, layernorm, adamw and tiny (the exact op sequences of
benches/workloads.rs) through:

  deferfuse-defer   libdeferfuse.so over its C ABI via ctypes, DFUSE_MODE_DEFER (ops recorded,
                    fused and compiled at the sync point)
  deferfuse-strict  the same, DFUSE_MODE_STRICT (each op its own program)
  numpy             one numpy call per op (temporaries), single-threaded
  numexpr           chain10 and gelu as one numexpr expression; tiny as 1000 evaluate calls
  torch             torch eager on CPU, the same op sequence (adamw with torch._foreach_* ops)
  torch.compile     Inductor on CPU (chain10, gelu, softmax, layernorm); compiled and warmed up
                    before timing, so compile time is excluded

A peer that is not installed is printed as "skipped (not installed: pip install X)".
Install all peers with:  pip install numpy numexpr torch
Build the library with:  cargo build --release -p deferfuse-ffi   (in the repository root)

What one timed iteration is, per peer:
  * deferfuse: recording every op (ctypes calls included, as a Python front end pays them),
    releasing the intermediates exactly as workloads.rs does, then dfuse_stream_synchronize on
    the default stream, so the work has really run, then releasing the output handle. Inputs
    were copied in with dfuse_tensor_from_host before timing; the output is NOT copied back,
    except for tiny, whose iteration ends by reading its 8 elements with dfuse_tensor_to_host
    (as workloads.rs does: that read is the sync point).
  * numpy / numexpr / torch / torch.compile: one call computing the output (CPU work is
    synchronous, so returning means it ran). Outputs are freshly allocated, as in deferfuse.
  * adamw updates p, m and v in place (every peer has its own copy of the state).

Every peer's result is checked against numpy (np.allclose, rtol=1e-4, atol=1e-5, float32)
before any timing; a mismatch aborts the run with exit status 1. The check iteration and one
more warm-up iteration (which compile, for deferfuse and torch.compile) are not timed.

Reps are interleaved: each round runs every peer once, in a rotating order, and the table
shows the median over the rounds. Effective GB/s counts each input and output once (the
`bytes` of workloads.rs). "X/defer" is X's median time / deferfuse-defer's median time: above
1 means deferfuse defer mode is faster than X. For deferfuse rows, "alloc B/it" is the buffer
bytes the runtime allocated per timed iteration (from dfuse_stats): in defer mode it shows
that dead intermediates were never materialized.

Threads: --threads N (default: every core this process may use) is applied to every peer:
deferfuse's DfuseConfig.num_threads, torch.set_num_threads, numexpr.set_num_threads; numpy's
elementwise ops are single-threaded.

Usage:  python3 benches/peers/peers.py [--quick] [--json] [--threads N] [--reps N]
            [--peers deferfuse,numpy,numexpr,torch,torch.compile] [--only chain10,gelu,...]
            [--lib PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_LIB = REPO / "target" / "release" / "libdeferfuse.so"
BUILD_HINT = "cd {} && cargo build --release -p deferfuse-ffi".format(REPO)

# Tolerance of the correctness check (float32; summation order and tanh/exp/sqrt
# implementations differ between peers).
RTOL, ATOL = 1e-4, 1e-5

ALL_PEERS = ["deferfuse", "numpy", "numexpr", "torch", "torch.compile"]
ALL_WORKLOADS = ["chain10", "gelu", "softmax", "layernorm", "adamw", "tiny"]
DEFER, STRICT = "deferfuse-defer", "deferfuse-strict"

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
        ("keepdim", ctypes.c_bool),
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
    DfuseConfig: (64, {"mode": 0, "max_pending_ops": 8, "cache_capacity": 16,
                       "max_pending_bytes": 24, "max_ops_per_region": 32,
                       "host_cache_bytes": 40, "backend": 48, "num_threads": 56}),
    DfuseStats: (216, {"ops_recorded": 0, "bytes_allocated": 56, "host_cached_bytes": 104,
                       "cuts": 112, "sync_points": 160}),
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
        a.sub_op, a.n_dims, a.keepdim = sub, 1, True
        a.dims[0] = 1
        self._set(0, x)
        h = self._call(OP_REDUCE, 1, 0)
        a.n_dims, a.keepdim = 0, False
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


# --- the workloads as deferfuse op sequences (benches/workloads.rs, op for op) ---------------

def df_chain10(r: Recorder, a, b, c):
    # max(((a*b + c)*0.5 - a) / (abs(b) + 1), 0) * c + a*a
    x = r.bin(B_MUL, a, b)
    x = r.bin(B_ADD, x, c)
    x = r.bin(B_MUL, x, 0.5)
    x = r.bin(B_SUB, x, a)
    y = r.un(U_ABS, b)
    y = r.bin(B_ADD, y, 1.0)
    x = r.bin(B_DIV, x, y)
    x = r.bin(B_MAXIMUM, x, 0.0)
    x = r.bin(B_MUL, x, c)
    z = r.bin(B_MUL, a, a)
    return r.bin(B_ADD, x, z)


def df_gelu(r: Recorder, a):
    # 0.5*a*(1 + tanh(0.7978845608*(a + 0.044715*a^3)))
    a3 = r.bin(B_MUL, a, a)
    a3 = r.bin(B_MUL, a3, a)
    x = r.bin(B_MUL, a3, 0.044715)
    x = r.bin(B_ADD, a, x)
    x = r.bin(B_MUL, x, 0.7978845608)
    x = r.un(U_TANH, x)
    x = r.bin(B_ADD, x, 1.0)
    h = r.bin(B_MUL, a, 0.5)
    return r.bin(B_MUL, h, x)


def df_softmax(r: Recorder, x):
    m = r.red(R_AMAX, x)
    e = r.bin(B_SUB, x, m)
    e = r.un(U_EXP, e)
    s = r.red(R_SUM, e)
    return r.bin(B_DIV, e, s)


def df_layernorm(r: Recorder, x, w, b):
    mu = r.red(R_MEAN, x)
    d = r.bin(B_SUB, x, mu)
    d2 = r.bin(B_MUL, d, d)
    var = r.red(R_MEAN, d2)
    v = r.bin(B_ADD, var, 1e-5)
    rs = r.un(U_RSQRT, v)
    y = r.bin(B_MUL, d, rs)
    y = r.bin(B_MUL, y, w)
    return r.bin(B_ADD, y, b)


ADAMW = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01)


def df_adamw(r: Recorder, *state):
    lr, b1, b2, eps, wd = (ADAMW[k] for k in ("lr", "b1", "b2", "eps", "wd"))
    last = 0
    for i in range(0, len(state), 4):
        p, g, m, v = state[i:i + 4]
        r.inplace(B_MUL, p, 1.0 - lr * wd, p)
        r.inplace(B_MUL, m, b1, m)
        g1 = r.bin(B_MUL, g, 1.0 - b1)
        r.inplace(B_ADD, m, g1, m)
        r.inplace(B_MUL, v, b2, v)
        g2 = r.bin(B_MUL, g, g)
        g2 = r.bin(B_MUL, g2, 1.0 - b2)
        r.inplace(B_ADD, v, g2, v)
        d = r.un(U_SQRT, v)
        d = r.bin(B_ADD, d, eps)
        u = r.bin(B_DIV, m, d)
        u = r.bin(B_MUL, u, lr)
        r.inplace(B_SUB, p, u, p)
        last = p
    # The iteration's "output" is the last p, with its own reference (workloads.rs retains it).
    r.rt.retain(last)
    return last


def df_tiny(r: Recorder, x):
    for _ in range(1000):
        x = r.bin(B_ADD, x, 1.0)
    return x


# --- the same workloads in numpy (also the reference every peer is checked against) ---------

def np_chain10(a, b, c):
    return np.maximum(((a * b + c) * 0.5 - a) / (np.abs(b) + 1.0), 0.0) * c + a * a


def np_gelu(a):
    # a*a*a, not a**3: the same op sequence as the other peers.
    return 0.5 * a * (1.0 + np.tanh(0.7978845608 * (a + 0.044715 * (a * a * a))))


def np_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def np_layernorm(x, w, b):
    d = x - x.mean(axis=1, keepdims=True)
    var = (d * d).mean(axis=1, keepdims=True)
    return d * (1.0 / np.sqrt(var + 1e-5)) * w + b


def np_adamw(*state):
    lr, b1, b2, eps, wd = (ADAMW[k] for k in ("lr", "b1", "b2", "eps", "wd"))
    for i in range(0, len(state), 4):
        p, g, m, v = state[i:i + 4]
        p *= 1.0 - lr * wd
        m *= b1
        m += g * (1.0 - b1)
        v *= b2
        v += (g * g) * (1.0 - b2)
        u = m / (np.sqrt(v) + eps)
        u *= lr
        p -= u
    return state[-4]


def np_tiny(x):
    for _ in range(1000):
        x = x + 1.0
    return x


# --- torch eager / torch.compile (built lazily: torch is optional) --------------------------

def torch_impls(torch):
    def chain10(a, b, c):
        return torch.clamp_min(((a * b + c) * 0.5 - a) / (torch.abs(b) + 1.0), 0.0) * c + a * a

    def gelu(a):
        return 0.5 * a * (1.0 + torch.tanh(0.7978845608 * (a + 0.044715 * (a * a * a))))

    def softmax(x):
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True)

    def layernorm(x, w, b):
        d = x - x.mean(dim=1, keepdim=True)
        var = (d * d).mean(dim=1, keepdim=True)
        return d * torch.rsqrt(var + 1e-5) * w + b

    def adamw(*state):
        # The multi-tensor (foreach) form torch.optim.AdamW uses on CPU lists, op for op.
        lr, b1, b2, eps, wd = (ADAMW[k] for k in ("lr", "b1", "b2", "eps", "wd"))
        p, g, m, v = (list(state[i::4]) for i in range(4))
        torch._foreach_mul_(p, 1.0 - lr * wd)
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, torch._foreach_mul(g, 1.0 - b1))
        torch._foreach_mul_(v, b2)
        g2 = torch._foreach_mul(g, g)
        torch._foreach_mul_(g2, 1.0 - b2)
        torch._foreach_add_(v, g2)
        d = torch._foreach_sqrt(v)
        torch._foreach_add_(d, eps)
        u = torch._foreach_div(m, d)
        torch._foreach_mul_(u, lr)
        torch._foreach_sub_(p, u)
        return p[-1]

    def tiny(x):
        for _ in range(1000):
            x = x + 1.0
        return x

    return dict(chain10=chain10, gelu=gelu, softmax=softmax, layernorm=layernorm,
                adamw=adamw, tiny=tiny)


# numexpr: one expression per workload. Constants are float32 variables because numexpr
# upcasts float32 arrays to float64 when mixed with Python float literals. numexpr's
# maximum() is float64-only, so max(x, 0) is where(x > 0, x, 0); numexpr collapses the
# repeated subexpression, so x is computed once.
_NE_X = "((a*b + c)*h - a) / (abs(b) + one)"
NUMEXPR_EXPRS = {
    "chain10": (f"where({_NE_X} > z, {_NE_X}, z) * c + a*a", ("a", "b", "c")),
    "gelu": ("h*a*(one + tanh(k1*(a + k2*(a*a*a))))", ("a",)),
}
NUMEXPR_CONSTS = dict(h=np.float32(0.5), one=np.float32(1.0), z=np.float32(0.0),
                      k1=np.float32(0.7978845608), k2=np.float32(0.044715))


# ---------------------------------------------------------------------------------------------
# Workloads, cases, timing
# ---------------------------------------------------------------------------------------------

@dataclass
class Workload:
    name: str
    size_label: str
    bytes: int          # each input and output counted once (workloads.rs `bytes`)
    inputs: list        # float32 numpy arrays
    mutates: bool = False  # adamw: each peer needs its own copy of the state
    elems: int = 0         # elements per input, to pick fewer reps for the 16M cases


@dataclass
class Case:
    """One peer's prepared workload: `run` is one timed iteration, `result` one untimed
    iteration returning host arrays (the check), `close` frees what it holds."""
    peer: str
    run: Callable[[], None]
    result: Callable[[], list]
    close: Callable[[], None] = lambda: None
    runtime: DfuseRuntime | None = None
    times: list = field(default_factory=list)


def data(shape, seed: int, nonneg: bool = False) -> np.ndarray:
    """Deterministic f32 data in [-2, 2) like workloads.rs (a different generator)."""
    x = np.random.default_rng(seed).uniform(-2.0, 2.0, shape).astype(np.float32)
    return np.abs(x) if nonneg else x


def size_label(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def make_workloads(quick: bool, only: list[str]):
    """Yields workloads one at a time, so only one workload's arrays are alive at once."""
    elems = [1 << 16, 1 << 20] if quick else [1 << 20, 1 << 24]
    rows, cols = (512 if quick else 4096), 1024
    if "chain10" in only:
        for n in elems:
            yield Workload("chain10", size_label(n), 4 * n * 4, [data(n, i) for i in range(3)],
                           elems=n)
    if "gelu" in only:
        for n in elems:
            yield Workload("gelu", size_label(n), 2 * n * 4, [data(n, 7)], elems=n)
    if "softmax" in only:
        yield Workload("softmax", f"{rows}x{cols}", 2 * rows * cols * 4, [data((rows, cols), 3)])
    if "layernorm" in only:
        yield Workload("layernorm", f"{rows}x{cols}", 2 * rows * cols * 4,
                       [data((rows, cols), 4), data(cols, 5), data(cols, 6)])
    if "adamw" in only:
        state, elems_total = [], 0
        for k in range(8, 18):
            for j in range(10):
                n = 1 << k
                elems_total += n
                for part in range(4):
                    # v (part 3) is a second moment: non-negative, so sqrt(v) is not NaN.
                    state.append(data(n, k * 100 + j * 4 + part, nonneg=(part == 3)))
        # One pass reads p, g, m, v and writes p, m, v.
        yield Workload("adamw", "100 params", elems_total * 4 * 7, state, mutates=True)
    if "tiny" in only:
        yield Workload("tiny", "1000 ops x 8", 0, [data(8, 9)])


DF_FUNCS = dict(chain10=df_chain10, gelu=df_gelu, softmax=df_softmax, layernorm=df_layernorm,
                adamw=df_adamw, tiny=df_tiny)
NP_FUNCS = dict(chain10=np_chain10, gelu=np_gelu, softmax=np_softmax, layernorm=np_layernorm,
                adamw=np_adamw, tiny=np_tiny)
COMPILED_WORKLOADS = ("chain10", "gelu", "softmax", "layernorm")


def state_outputs(w: Workload, arrays) -> list:
    """What adamw is checked on: every p, m and v (g is read only)."""
    return [a for i, a in enumerate(arrays) if i % 4 != 1]


def dfuse_case(peer: str, rt: DfuseRuntime, w: Workload) -> Case:
    fn = DF_FUNCS[w.name]
    handles = [rt.from_host(a) for a in w.inputs]
    tiny_out = np.empty(8, np.float32)

    def record() -> int:
        r = Recorder(rt)
        return r.finish(fn(r, *handles))

    def run():
        out = record()
        if w.name == "tiny":
            rt.to_host(out, tiny_out)  # the workload's sync point: read its 8 elements
        else:
            rt.sync()
        rt.release(out)

    def result():
        out = record()
        rt.sync()
        if w.mutates:
            rt.release(out)
            return [rt.to_host(h) for h in state_outputs(w, handles)]
        res = rt.to_host(out)
        rt.release(out)
        return [res]

    def close():
        for h in handles:
            rt.release(h)
        rt.sync()
        rt.release_cached_memory()

    return Case(peer, run, result, close, runtime=rt)


def host_case(peer: str, fn: Callable, args: list, w: Workload, to_np=np.asarray) -> Case:
    def run():
        fn(*args)

    def result():
        out = fn(*args)
        if w.mutates:
            return [to_np(a) for a in state_outputs(w, args)]
        return [to_np(out)]

    return Case(peer, run, result)


def numexpr_case(ne, w: Workload) -> Case | None:
    if w.name == "tiny":
        # Per-call cost: 1000 dependent evaluate calls on 8 elements.
        x0 = w.inputs[0]

        def tiny():
            x = x0
            for _ in range(1000):
                x = ne.evaluate("x + one", local_dict={"x": x, "one": NUMEXPR_CONSTS["one"]})
            return x
        return host_case("numexpr", tiny, [], w)
    if w.name not in NUMEXPR_EXPRS:
        return None
    expr, names = NUMEXPR_EXPRS[w.name]
    local = dict(NUMEXPR_CONSTS, **dict(zip(names, w.inputs)))
    return host_case("numexpr", lambda: ne.evaluate(expr, local_dict=local), [], w)


def copies(w: Workload) -> list:
    return [a.copy() for a in w.inputs] if w.mutates else w.inputs


def build_cases(w: Workload, peers: dict, runtimes: dict) -> list[Case]:
    cases = []
    for peer, rt in runtimes.items():
        cases.append(dfuse_case(peer, rt, w))
    if "numpy" in peers:
        cases.append(host_case("numpy", NP_FUNCS[w.name], copies(w), w))
    if "numexpr" in peers:
        c = numexpr_case(peers["numexpr"], w)
        if c:
            cases.append(c)
    if "torch" in peers or "torch.compile" in peers:
        torch, impls = peers.get("torch") or peers["torch.compile"]
        to_np = lambda t: t.numpy()
        if "torch" in peers:
            args = [torch.from_numpy(a) for a in copies(w)]  # shares memory; no copy
            cases.append(host_case("torch", impls[w.name], args, w, to_np))
        if "torch.compile" in peers and w.name in COMPILED_WORKLOADS:
            # One compiled function per workload and size: static shapes, as a model would use.
            fn = torch.compile(impls[w.name], dynamic=False)
            args = [torch.from_numpy(a) for a in copies(w)]
            cases.append(host_case("torch.compile", fn, args, w, to_np))
    return cases


def check(w: Workload, cases: list[Case]) -> list[Case]:
    """Checks every case's result against numpy; returns the cases that can be timed.
    Exits on a mismatch. A torch.compile failure (e.g. no C++ compiler) skips that peer."""
    if w.mutates:
        state = copies(w)
        NP_FUNCS[w.name](*state)
        ref = state_outputs(w, state)
    else:
        ref = [NP_FUNCS[w.name](*w.inputs)]
    ok = []
    for c in cases:
        try:
            got = c.result()
        except Exception as e:  # noqa: BLE001 - reported, then the run continues without it
            if c.peer == "torch.compile":
                print(f"torch.compile: skipped for {w.name} (compile failed: "
                      f"{str(e).strip().splitlines()[0][:200]})", file=sys.stderr)
                continue
            raise
        if len(got) != len(ref):
            fail(w, c, f"{len(got)} outputs, numpy has {len(ref)}")
        for g, r in zip(got, ref):
            if g.shape != r.shape:
                fail(w, c, f"shape {g.shape}, numpy has {r.shape}")
            if not np.allclose(g, r, rtol=RTOL, atol=ATOL):
                err = np.abs(g.astype(np.float64) - r)
                i = int(np.nanargmax(err)) if np.isfinite(err).any() else 0
                fail(w, c, f"max |diff| {np.nanmax(err):.3g} at flat index {i} "
                           f"(got {g.ravel()[i]!r}, numpy {r.ravel()[i]!r}); "
                           f"tolerance rtol={RTOL} atol={ATOL}")
        ok.append(c)
    return ok


def fail(w: Workload, c: Case, why: str) -> None:
    print(f"MISMATCH: {c.peer} on {w.name} {w.size_label} disagrees with numpy: {why}",
          file=sys.stderr)
    sys.exit(1)


def time_cases(cases: list[Case], reps: int) -> dict:
    """Interleaved timing: each round runs every case once, the order rotating per round.
    Returns deferfuse buffer bytes allocated per timed iteration, by peer."""
    for c in cases:
        c.run()  # one more warm-up (compiles deferfuse programs for this exact trace)
    before = {c.peer: c.runtime.stats().bytes_allocated for c in cases if c.runtime}
    gc.collect()
    gc.disable()  # a collection inside a timed iteration would be charged to one peer
    try:
        for rep in range(reps):
            k = rep % len(cases)
            for c in cases[k:] + cases[:k]:
                t0 = time.perf_counter()
                c.run()
                c.times.append((time.perf_counter() - t0) * 1e3)
    finally:
        gc.enable()
    return {c.peer: (c.runtime.stats().bytes_allocated - before[c.peer]) / reps
            for c in cases if c.runtime}


# ---------------------------------------------------------------------------------------------
# Peers, output, main
# ---------------------------------------------------------------------------------------------

def try_import(name: str, emit_note, peer_names: list[str]):
    """Imports an installed but possibly broken module; a failure skips its peers."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any import failure means "peer unavailable"
        for p in peer_names:
            emit_note(p, f"skipped (import failed: {type(e).__name__}: {e}; "
                         f"reinstall: pip install {name})")
        return None


def load_peers(wanted: list[str], threads: int, emit_note) -> dict:
    """Imports the optional peers; returns {name: module or (torch, impls)}."""
    peers = {}
    if "numpy" in wanted:
        peers["numpy"] = np
    if "numexpr" in wanted:
        if importlib.util.find_spec("numexpr") is None:
            emit_note("numexpr", "skipped (not installed: pip install numexpr)")
        else:
            ne = try_import("numexpr", emit_note, ["numexpr"])
            if ne is not None:
                ne.set_num_threads(threads)
                peers["numexpr"] = ne
    if "torch" in wanted or "torch.compile" in wanted:
        if importlib.util.find_spec("torch") is None:
            for p in ("torch", "torch.compile"):
                if p in wanted:
                    emit_note(p, "skipped (not installed: pip install torch)")
        elif (torch := try_import("torch", emit_note,
                                  [p for p in ("torch", "torch.compile") if p in wanted])):
            torch.set_num_threads(threads)
            impls = torch_impls(torch)
            if "torch" in wanted:
                peers["torch"] = (torch, impls)
            if "torch.compile" in wanted:
                if hasattr(torch, "compile"):
                    peers["torch.compile"] = (torch, impls)
                else:
                    emit_note("torch.compile", "skipped (needs torch >= 2.0: pip install -U torch)")
    return peers


def peer_versions(peers: dict, lib: DfuseLib | None) -> str:
    parts = []
    if lib:
        parts.append(f"deferfuse {lib.version}")
    for name, p in peers.items():
        mod = p[0] if isinstance(p, tuple) else p
        if name != "torch.compile" or "torch" not in peers:
            parts.append(f"{name} {getattr(mod, '__version__', '?')}")
    return ", ".join(parts)


def find_lib(path: Path) -> DfuseLib:
    if not path.exists():
        print(f"error: {path} not found. Build it with:\n  {BUILD_HINT}\n"
              f"or pass --lib PATH (or leave deferfuse out: --peers numpy,numexpr,torch)",
              file=sys.stderr)
        sys.exit(2)
    if path.resolve() == DEFAULT_LIB.resolve():
        # A library older than its sources measures old code: say so (the build is quick).
        srcs = [p for d in ("ffi/src", "runtime/src", "fusion/src", "src", "cache/src")
                for p in (REPO / d).rglob("*.rs")]
        if srcs and max(p.stat().st_mtime for p in srcs) > path.stat().st_mtime:
            print(f"warning: {path} is older than the Rust sources; rebuild with:\n  {BUILD_HINT}",
                  file=sys.stderr)
    return DfuseLib(path)


def main() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and 5 reps (smoke run)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--threads", type=int, default=cores, help=f"threads per peer (default {cores})")
    ap.add_argument("--reps", type=int, default=None, help="timed rounds (default 9, quick 5, 16M 3)")
    ap.add_argument("--peers", default=",".join(ALL_PEERS), help="comma list of " + ",".join(ALL_PEERS))
    ap.add_argument("--only", default=",".join(ALL_WORKLOADS), help="comma list of workloads")
    ap.add_argument("--lib", type=Path, default=DEFAULT_LIB, help="libdeferfuse.so path")
    args = ap.parse_args()
    wanted = [p.strip() for p in args.peers.split(",") if p.strip()]
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    for bad in set(wanted) - set(ALL_PEERS):
        ap.error(f"unknown peer {bad!r}; choose from {','.join(ALL_PEERS)}")
    for bad in set(only) - set(ALL_WORKLOADS):
        ap.error(f"unknown workload {bad!r}; choose from {','.join(ALL_WORKLOADS)}")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    check_layouts()

    def emit_note(peer: str, text: str) -> None:
        if args.json:
            print(json.dumps({"peer": peer, "status": text}), flush=True)
        else:
            print(f"{peer}: {text}", flush=True)

    lib, runtimes = None, {}
    if "deferfuse" in wanted:
        lib = find_lib(args.lib)
        # Defer first: it is the baseline of every ratio.
        runtimes = {DEFER: DfuseRuntime(lib, DFUSE_MODE_DEFER, args.threads),
                    STRICT: DfuseRuntime(lib, DFUSE_MODE_STRICT, args.threads)}
    peers = load_peers(wanted, args.threads, emit_note)

    header = ("{:<10} {:<13} {:<17} {:>10} {:>8} {:>9} {:>12}"
              .format("workload", "size", "peer", "median ms", "GB/s", "X/defer", "alloc B/it"))
    if not args.json:
        print(f"peers.py: {peer_versions(peers, lib)}; threads={args.threads}; "
              f"{'quick sizes' if args.quick else 'full sizes'}; medians of interleaved reps")
        print("X/defer = peer median / deferfuse-defer median (>1: deferfuse defer is faster)")
        print(header)
        print("-" * len(header))
    try:
        for w in make_workloads(args.quick, only):
            reps = args.reps or (3 if w.elems >= 1 << 24 else 5 if args.quick else 9)
            cases = build_cases(w, peers, runtimes)
            try:
                cases = check(w, cases)
                alloc = time_cases(cases, reps)
            finally:
                for c in cases:
                    c.close()
            report(args, w, cases, alloc, reps)
    finally:
        for rt in runtimes.values():
            rt.destroy()


def report(args, w: Workload, cases: list[Case], alloc: dict, reps: int) -> None:
    med = {c.peer: statistics.median(c.times) for c in cases}
    base = med.get(DEFER)
    for c in cases:
        ms = med[c.peer]
        gbps = w.bytes / (ms * 1e-3) / 1e9 if w.bytes else None
        ratio = ms / base if base else None
        if args.json:
            print(json.dumps({
                "workload": w.name, "size": w.size_label, "peer": c.peer,
                "threads": args.threads, "reps": reps, "median_ms": round(ms, 5),
                "min_ms": round(min(c.times), 5),
                "gbps": round(gbps, 3) if gbps is not None else None,
                "defer_speedup": round(ratio, 3) if ratio is not None else None,
                "alloc_bytes_per_iter": alloc.get(c.peer),
            }), flush=True)
        else:
            print("{:<10} {:<13} {:<17} {:>10.3f} {:>8} {:>9} {:>12}".format(
                w.name, w.size_label, c.peer, ms,
                f"{gbps:.2f}" if gbps is not None else "-",
                f"{ratio:.2f}x" if ratio is not None and c.peer != DEFER else "-",
                human_bytes(alloc[c.peer]) if c.peer in alloc else ""), flush=True)


def human_bytes(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


if __name__ == "__main__":
    main()
