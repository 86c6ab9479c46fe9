"""torch.compile on the PJRT backend (XLA's CPU plugin): each captured graph is planned as a
PJRT flush is, so a launch runs one XLA program. Runs in a fresh process (the device's
runtime reads DEFERFUSE_BACKEND when it starts). Skipped unless DEFERFUSE_PJRT_PLUGIN names
the plugin (CI installs it: see .ci/run)."""

import json
import os
import subprocess
import sys

import pytest

PLUGIN = os.environ.get("DEFERFUSE_PJRT_PLUGIN", "")
pytestmark = pytest.mark.skipif(not os.path.isfile(PLUGIN),
                                reason="DEFERFUSE_PJRT_PLUGIN is not set (pip install xla-cpu-pjrt)")

# Trains an MLP 5 steps with the model and the default AdamW's step compiled; prints, per
# step, the programs each compiled call ran (synchronized around it) and the losses, with
# CPU eager's.
SCRIPT = """
import copy, json, torch, torch.nn as nn, torch.nn.functional as F
import deferfuse_torch
from deferfuse_torch import compile_backend

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                      nn.Linear(64, 10))
batches = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(5)]


def train(device, compiled):
    m = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    forward = torch.compile(m, backend="tpu") if compiled else m
    step = torch.compile(opt.step, backend="tpu") if compiled else opt.step
    losses, programs = [], []

    def counted(f):
        if device == "cpu":
            return f()
        torch.tpu.synchronize()
        before = deferfuse_torch.stats()["programs_run"]
        out = f()
        torch.tpu.synchronize()
        programs[-1].append(deferfuse_torch.stats()["programs_run"] - before)
        return out

    for x, y in batches:
        programs.append([])
        opt.zero_grad()
        x, y = x.to(device), y.to(device)
        out = counted(lambda: forward(x))
        loss = F.cross_entropy(out, y)
        counted(loss.backward)
        counted(step)
        losses.append(loss.item())
    return losses, programs


cpu, _ = train("cpu", False)
with deferfuse_torch.mode("defer"):  # the loss's eager ops: one flush, not one program each
    losses, programs = train("tpu", True)
print(json.dumps({"cpu": cpu, "losses": losses, "programs": programs,
                  "counts": compile_backend.counts}))
"""


def test_each_compiled_graph_launch_on_pjrt_is_one_xla_program_with_cpu_losses():
    env = dict(os.environ, DEFERFUSE_BACKEND="pjrt", TF_CPP_MIN_LOG_LEVEL="2")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.splitlines()[-1])
    import torch
    torch.testing.assert_close(r["losses"], r["cpu"], rtol=1e-4, atol=1e-5)
    assert r["counts"]["refused"] == 0
    # After the first two steps (their calls compile and capture: the optimizer's state is
    # made at the first), every call is one launch of one program:
    # the forward, the backward (after the loss's backward, eager ops still pending when it
    # launches, flushed first as one program of their own) and the optimizer step's device
    # part.
    for forward, backward, step in r["programs"][2:]:
        assert (forward, step) == (1, 1), r["programs"]
        assert backward <= 2, r["programs"]
