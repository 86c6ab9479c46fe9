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


def run_steps(name, cache_dir=None, steps=4, mode="defer", **extra_env):
    """pjrt_steps.py's JSON for `steps` steps of zoo model `name` in `mode`, on PJRT."""
    env = dict(os.environ, DEFERFUSE_BACKEND="pjrt", TF_CPP_MIN_LOG_LEVEL="2", **extra_env)
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DEFERFUSE_CACHE_DIR", None)
    if cache_dir is not None:
        env["DEFERFUSE_CACHE_DIR"] = str(cache_dir)
    out = subprocess.run([sys.executable, os.path.join(HERE, "pjrt_steps.py"), name, str(steps), mode],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", ["mlp_small", "gpt2", "llama"])
def test_a_deferred_training_step_is_at_most_three_xla_programs_with_cpu_losses(name):
    r = run_steps(name)
    assert r["fallbacks"] == {}
    # The first step also runs the setup the optimizer records (its state's first values).
    # Each flush a host read runs is two programs, the read value's and the rest, which runs
    # while Python records the next step: the MLP and Llama read one loss per step (two
    # programs), GPT-2 two values (three programs: its first read is its flush's last value).
    assert all(p <= 3 for p in r["programs"][1:]), r["programs"]
    for k, (got, want) in enumerate(zip(r["losses"], r["cpu"])):
        assert abs(got - want) <= LOSS_ATOL + LOSS_RTOL * abs(want), (k, got, want)
    # The step's modules are compiled once.
    assert r["compiled"][2:] == [0] * (len(r["compiled"]) - 2), r["compiled"]


def test_the_loss_read_splits_the_mlp_step_into_two_programs_unless_turned_off():
    # On: the loss's program, which .item() waits for, and the backward and AdamW after it.
    # DEFERFUSE_PJRT_SPLIT_READS=0: the whole flush is one program; the losses are CPU's
    # either way.
    for flag, want in [("1", 2), ("0", 1)]:
        r = run_steps("mlp_small", DEFERFUSE_PJRT_SPLIT_READS=flag)
        assert r["programs"][1:] == [want] * (len(r["programs"]) - 1), (flag, r["programs"])
        for k, (got, cpu) in enumerate(zip(r["losses"], r["cpu"])):
            assert abs(got - cpu) <= LOSS_ATOL + LOSS_RTOL * abs(cpu), (flag, k, got, cpu)


def test_a_second_process_trains_from_the_disk_cache_without_compiling(tmp_path):
    cold = run_steps("mlp_small", tmp_path)
    warm = run_steps("mlp_small", tmp_path)
    assert cold["total_compiled"] > 0
    assert warm["total_compiled"] == 0, warm["compiled"]
    assert warm["losses"] == cold["losses"]


# pjrt_steps.py on mlp_small with each step's batch cut to its size: a training loop whose
# batch changes (the last, smaller batch of an epoch).
VARYING_BATCH = r"""
import sys
sys.path.insert(0, sys.argv[1])
import model_zoo
import pjrt_steps
sizes = [int(s) for s in sys.argv[2].split(",")]
build = model_zoo.build
def cut(name, size, steps):
    w = build(name, size, steps)
    w.batches = [{k: v[:n] for k, v in b.items()} for b, n in zip(w.batches, sizes)]
    return w
model_zoo.build = cut
pjrt_steps.main("mlp_small", len(sizes))
"""


def test_a_changing_batch_size_compiles_one_module_per_bucket_with_cpu_losses():
    env = dict(os.environ, DEFERFUSE_BACKEND="pjrt", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DEFERFUSE_CACHE_DIR", None)
    # The first step also records the optimizer's setup: the steady step starts at the second.
    sizes = [64, 64, 50, 33, 64]
    out = subprocess.run([sys.executable, "-c", VARYING_BATCH, HERE, ",".join(map(str, sizes))],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.splitlines()[-1])
    assert r["fallbacks"] == {}
    for k, (got, want) in enumerate(zip(r["losses"], r["cpu"])):
        assert abs(got - want) <= LOSS_ATOL + LOSS_RTOL * abs(want), (k, got, want)
    # 50 finds the batch and compiles bucket 64's modules (one per program: the step reads
    # its loss, so it is the loss's program and the rest); 33 is in that bucket, and 64 has
    # its exact modules already. 33 compiles one small relayout of its input batch: the copy
    # to the device left it as a flat [784 * 33] array padded to its own power of two (32768,
    # where 50's and 64's are 65536), and the step's module takes it padded to 784 * 64.
    assert r["compiled"][2] <= r["programs"][2], r["compiled"]
    assert r["compiled"][3] <= 1, r["compiled"]
    assert r["compiled"][4] == 0, r["compiled"]
