"""Runs PyTorch's own OpInfo sample inputs (torch.testing._internal's op_db: every ATen op
PyTorch tests, with its edge cases: 0-dim and empty tensors, keepdim, odd strides) on "tpu"
and on CPU, and lists where tpu differs:

  internal  tpu raised an internal error (a caught panic): always a bug
  wrong     a value, dtype or shape differs from CPU's (rtol/atol 1e-4, float16/bfloat16 by
            torch.testing's tolerances for them; NaNs equal)
  error     tpu raised where CPU did not
  aliasing  an output shares storage with an input on one device and not on the other

Each op stops at its first differing sample. Random ops are skipped; samples whose ops draw
random numbers (dropout_p > 0) or read storage outside the view they were given (as_strided's
partial views: the copy to tpu holds only the view) show up as "wrong" and are not bugs; nor
are complex, sparse, int8/int16 and uint64 errors (the device has no such dtypes or layouts),
nor tensor_split's refusal of a tpu tensor of split points (PyTorch's own check: the sweep
moves every tensor argument).
Needs `pip install expecttest` (torch.testing._internal imports it).

Usage: python opinfo_sweep.py [--dtype float32] [--samples 4] [--ops name,name]"""

import argparse
import collections
import signal
import warnings

import torch

import deferfuse_torch  # noqa: F401

RANDOM = ("dropout", "bernoulli", "multinomial", "normal", "rand", "uniform", "empty",
          "exponential", "geometric", "log_normal", "cauchy", "rrelu", "nonzero_static",
          "fractional_max_pool")


def to_tpu(x):
    if isinstance(x, torch.Tensor):
        # With the sample's strides where they allow it: a non-contiguous input stays one.
        try:
            t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="tpu")
            return t.copy_(x.detach())
        except RuntimeError:
            return x.detach().to("tpu")
    if isinstance(x, (list, tuple)):
        return type(x)(to_tpu(y) for y in x)
    if isinstance(x, dict):
        return {k: to_tpu(v) for k, v in x.items()}
    return x


def tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in tensors(y)]
    return []


def aliasing(inputs, outputs):
    """For each output, the inputs whose storage it shares."""
    ptrs = [t.untyped_storage().data_ptr() for t in inputs]
    return tuple(tuple(i for i, p in enumerate(ptrs)
                       if p and o.numel() and o.untyped_storage().data_ptr() == p)
                 for o in outputs)


def check_sample(op, s):
    """None when tpu agrees with CPU on this sample, else (class, message)."""
    args = [s.input] + list(s.args)
    try:
        want = op(*args, **s.kwargs)
    except Exception:
        return None  # CPU refuses it too
    targs, tkw = to_tpu(args), to_tpu(s.kwargs)
    try:
        got = op(*targs, **tkw)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return ("internal" if "panic" in msg else "error", msg)
    w, g = tensors(want), tensors(got)
    try:
        assert len(w) == len(g), f"{len(g)} outputs, CPU {len(w)}"
        for a, b in zip(w, g):
            # float16/bfloat16: PyTorch's own tolerances for them (about one rounding of the
            # type: the device rounds each op of a composed kernel where CPU rounds once).
            tol = {} if a.dtype in (torch.float16, torch.bfloat16) else dict(atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(b.cpu(), a, equal_nan=True, **tol)
    except AssertionError as e:
        return ("wrong", str(e).strip().splitlines()[0])
    cpu_alias = aliasing(tensors(args) + tensors(s.kwargs), w)
    tpu_alias = aliasing(tensors(targs) + tensors(tkw), g)
    if cpu_alias != tpu_alias:
        return ("aliasing", f"outputs share inputs' storage: CPU {cpu_alias}, tpu {tpu_alias}")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--samples", type=int, default=4, help="samples per op (default 4)")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    a = ap.parse_args()
    from torch.testing._internal.common_methods_invocations import op_db
    warnings.filterwarnings("ignore")
    dtype = getattr(torch, a.dtype)
    only = set(a.ops.split(",")) if a.ops else None

    def timeout(*_):
        raise TimeoutError()

    signal.signal(signal.SIGALRM, timeout)
    found = collections.defaultdict(list)
    checked = 0
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if (only and op.name not in only) or any(r in op.name for r in RANDOM):
            continue
        if dtype not in op.supported_dtypes("cpu"):
            continue
        checked += 1
        signal.alarm(20)
        try:
            for s in list(op.sample_inputs("cpu", dtype, requires_grad=False))[:a.samples]:
                r = check_sample(op, s)
                if r:
                    shapes = [tuple(t.shape) for t in tensors([s.input] + list(s.args))][:3]
                    found[r[0]].append(f"{name} {shapes}: {r[1][:160]}")
                    break
        except TimeoutError:
            found["timeout"].append(name)
        except Exception as e:  # building the samples failed
            found["skipped"].append(f"{name}: {type(e).__name__}")
        finally:
            signal.alarm(0)
    print(f"{checked} ops checked on {a.dtype}")
    for kind in ("internal", "wrong", "error", "aliasing", "timeout", "skipped"):
        print(f"== {kind}: {len(found[kind])}")
        for line in found[kind]:
            print("  ", line)


if __name__ == "__main__":
    main()
