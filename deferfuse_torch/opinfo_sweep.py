"""Runs PyTorch's own OpInfo sample inputs (torch.testing._internal's op_db: every ATen op
PyTorch tests, with its edge cases: 0-dim and empty tensors, keepdim, odd strides) on "tpu"
and on CPU, and lists where tpu differs:

  internal  tpu raised an internal error (a caught panic): always a bug
  wrong     a value, dtype or shape differs from CPU's (rtol/atol 1e-4, float16/bfloat16 by
            torch.testing's tolerances for them; NaNs equal)
  error     tpu raised where CPU did not
  aliasing  an output shares storage with an input on one device and not on the other

Each op stops at its first differing sample. Random ops are skipped, and so is a sample whose
CPU result changes with the seed (dropout_p > 0, training=True). Samples that read storage
outside the view they were given (as_strided's partial views: the copy to tpu holds only the
view) show up as "wrong" and are not bugs; nor
are complex, sparse, int8/int16 and uint64 errors (the device has no such dtypes or layouts),
nor tensor_split's refusal of a tpu tensor of split points (PyTorch's own check: the sweep
moves every tensor argument).
Needs `pip install expecttest` (torch.testing._internal imports it).

With --grad it compares the inputs' gradients instead (ops that support autograd; the outputs
weighted by the same pseudo-random cotangents on both devices).

With --out it calls each op that supports out= with outs of the result's dtype and shape and
compares what they hold; one more class lists the ops whose out= call ran on the CPU fallback
where the call without out= did not:

  fallback  the out= overload has no tpu path (neither a kernel nor a functional overload's)

Usage: python opinfo_sweep.py [--dtype float32] [--samples 4] [--ops name,name] [--grad | --out]"""

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
            t.copy_(x.detach())
        except RuntimeError:
            t = x.detach().to("tpu")
        # A leaf like the sample's, so --grad can ask for its gradient.
        return t.requires_grad_(x.requires_grad)
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


def same(a, b):
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x.nan_to_num(), y.nan_to_num())
        if x.dtype.is_floating_point else torch.equal(x, y) for x, y in zip(a, b))


def gradients(outputs, inputs):
    """The inputs' gradients of the float outputs weighted by fixed pseudo-random cotangents
    (drawn on CPU from one seed, so both devices get the same ones)."""
    outs = [o for o in outputs if o.requires_grad and o.dtype.is_floating_point]
    wrt = [i for i in inputs if i.requires_grad]
    if not outs or not wrt:
        return []
    gen = torch.Generator().manual_seed(0)
    cot = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
    grads = torch.autograd.grad(outs, wrt, cot, allow_unused=True)
    return [torch.zeros_like(i) if g is None else g for i, g in zip(wrt, grads)]


def check_out_sample(op, s):
    """check_sample for the op's out= form: None when the tpu outs hold CPU's values and the
    call ran on the device wherever the call without out= did, else (class, message)."""
    args = [s.input] + list(s.args)
    try:
        want = op(*args, **s.kwargs)
        w = tensors(want)
        if not w or not same(w, tensors(op(*args, **s.kwargs))):
            return None  # no tensor result, or a random one
        cpu_outs = [torch.empty_like(t) for t in w]
        op(*args, **s.kwargs, out=cpu_outs[0] if isinstance(want, torch.Tensor) else
           tuple(cpu_outs))
    except Exception:
        return None  # CPU refuses it
    targs, tkw = to_tpu(args), to_tpu(s.kwargs)
    if "device" in tkw:  # a factory (arange, zeros): its out= must be on the device it makes
        tkw["device"] = "tpu"
    outs = [torch.empty(t.shape, dtype=t.dtype, device="tpu") for t in w]
    try:
        deferfuse_torch.reset_fallback_counts()
        op(*targs, **tkw)
        plain = deferfuse_torch.fallback_counts()
        deferfuse_torch.reset_fallback_counts()
        op(*targs, **tkw, out=outs[0] if isinstance(want, torch.Tensor) else tuple(outs))
        with_out = deferfuse_torch.fallback_counts()
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return ("internal" if "panic" in msg else "error", msg)
    try:
        for a, b in zip(cpu_outs, outs):
            tol = {} if a.dtype in (torch.float16, torch.bfloat16) else dict(atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(b.cpu(), a, equal_nan=True, **tol)
    except AssertionError as e:
        return ("wrong", str(e).strip().splitlines()[0])
    if with_out and not plain:
        return ("fallback", ", ".join(sorted(with_out)))
    return None


def check_sample(op, s, grad=False):
    """None when tpu agrees with CPU on this sample, else (class, message). With grad, the
    inputs' gradients are compared instead of the outputs' values."""
    args = [s.input] + list(s.args)

    def on_cpu(seed):
        torch.manual_seed(seed)
        out = op(*args, **s.kwargs)
        return gradients(tensors(out), tensors(args) + tensors(s.kwargs)) if grad else out

    try:
        want = on_cpu(0)
        if not same(tensors(want), tensors(on_cpu(1))):
            return None  # the sample draws random numbers (dropout_p > 0, training=True, ...)
    except Exception:
        return None  # CPU refuses it too
    targs, tkw = to_tpu(args), to_tpu(s.kwargs)
    try:
        got = op(*targs, **tkw)
        if grad:
            got = gradients(tensors(got), tensors(targs) + tensors(tkw))
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
    if grad:
        return None
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
    ap.add_argument("--grad", action="store_true",
                    help="compare the inputs' gradients (ops that support autograd)")
    ap.add_argument("--out", action="store_true",
                    help="call the ops that support out= with outs and compare those")
    a = ap.parse_args()
    from torch.testing._internal import common_methods_invocations as cmi
    from torch.testing._internal.common_methods_invocations import op_db
    # OpInfo wraps ops that draw random numbers in a fixed seed; without it their CPU result
    # changes with the seed, which check_sample uses to skip them.
    cmi.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
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
        if a.out and not op.supports_out:
            continue
        if a.grad and (not op.supports_autograd
                       or dtype not in op.supported_backward_dtypes("cpu")):
            continue
        checked += 1
        signal.alarm(20)
        try:
            for s in list(op.sample_inputs("cpu", dtype, requires_grad=a.grad))[:a.samples]:
                r = check_out_sample(op, s) if a.out else check_sample(op, s, a.grad)
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
    print(f"{checked} ops checked on {a.dtype}" + (", gradients" if a.grad else "")
          + (", out=" if a.out else ""))
    for kind in ("internal", "wrong", "error", "aliasing", "fallback", "timeout", "skipped"):
        print(f"== {kind}: {len(found[kind])}")
        for line in found[kind]:
            print("  ", line)


if __name__ == "__main__":
    main()
