"""The tpu device on the PJRT backend (XLA's CPU plugin): a deferred training step of the MLP,
GPT-2 and Llama is at most 3 XLA programs with CPU's losses, and a second process with the
disk cache starts training without compiling. Each case runs pjrt_steps.py in a fresh process
(the device's runtime reads DEFERFUSE_BACKEND when it starts). Skipped unless
DEFERFUSE_PJRT_PLUGIN names the plugin (CI installs it: see .ci/run)."""

import json
import os
import subprocess
import sys

import pytest

PLUGIN = os.environ.get("DEFERFUSE_PJRT_PLUGIN", "")
pytestmark = pytest.mark.skipif(not os.path.isfile(PLUGIN),
                                reason="DEFERFUSE_PJRT_PLUGIN is not set (pip install xla-cpu-pjrt)")

HERE = os.path.dirname(os.path.abspath(__file__))
# As test_model_zoo.py: f32 training on two backends drifts apart by rounding only.
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-5


def run_steps(name, cache_dir=None, steps=4):
    env = dict(os.environ, DEFERFUSE_BACKEND="pjrt", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DEFERFUSE_CACHE_DIR", None)
    if cache_dir is not None:
        env["DEFERFUSE_CACHE_DIR"] = str(cache_dir)
    out = subprocess.run([sys.executable, os.path.join(HERE, "pjrt_steps.py"), name, str(steps)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", ["mlp_small", "gpt2", "llama"])
def test_a_deferred_training_step_is_at_most_three_xla_programs_with_cpu_losses(name):
    r = run_steps(name)
    assert r["fallbacks"] == {}
    # The first step also runs the setup the optimizer records (its state's first values).
    assert all(p <= 3 for p in r["programs"][1:]), r["programs"]
    for k, (got, want) in enumerate(zip(r["losses"], r["cpu"])):
        assert abs(got - want) <= LOSS_ATOL + LOSS_RTOL * abs(want), (k, got, want)
    # The step's module is compiled once.
    assert r["compiled"][2:] == [0] * (len(r["compiled"]) - 2), r["compiled"]


def test_a_second_process_trains_from_the_disk_cache_without_compiling(tmp_path):
    cold = run_steps("mlp_small", tmp_path)
    warm = run_steps("mlp_small", tmp_path)
    assert cold["total_compiled"] > 0
    assert warm["total_compiled"] == 0, warm["compiled"]
    assert warm["losses"] == cold["losses"]
