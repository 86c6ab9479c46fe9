"""The benchmark workloads (benches/workloads.rs, op for op) for each peer: deferfuse through
the Recorder, numpy (also the reference every peer is checked against), torch eager and
torch.compile (built lazily: torch is optional), numexpr expressions."""

import numpy as np

from dfuse_ctypes import *  # noqa: F401,F403 (op and kind constants, Recorder)

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


