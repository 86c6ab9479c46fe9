"""bench_models.py measures what it says: every runner gets timed steps, and the tpu runners'
per-step counters come from the runtime (an MLP step records ops, runs fewer programs than ops,
syncs at loss.item(), can hand its trace to the worker before that (pipelined flushes) and
sends nothing to the CPU fallback; its strict step runs each compound ATen op, AdamW's lerp_ for
one, as one program)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_models  # noqa: E402
import torch  # noqa: E402


def test_mlp_row_has_every_runner_timed_and_the_defer_step_counted():
    args = bench_models.parse_args(["--quick", "--no-compile", "--steps", "2", "--warmup", "1"])
    row = bench_models.bench("mlp_small", args)
    assert row["errors"] == {}
    assert row["ms"]["compile"] is None
    assert all(row["ms"][r] > 0 for r in ("cpu", "strict", "defer"))
    step = row["defer_step"]
    assert 0 < step["programs_run"] < step["ops_recorded"]
    assert step["sync_points"] >= 1
    assert step["fallback_ops"] == 0 and step["fallbacks"] == {}
    strict = row["strict_step"]
    assert strict["ops_recorded"] == step["ops_recorded"]
    assert step["programs_run"] < strict["programs_run"] < strict["ops_recorded"]


def test_breakdown_splits_each_tpu_step_into_recording_and_program_time_by_kind(capsys):
    args = bench_models.parse_args(["--quick", "--no-compile", "--steps", "1", "--warmup", "1",
                                    "--breakdown"])
    row = bench_models.bench("mlp_small", args)
    assert set(row["breakdown"]) == {"strict", "defer"}
    for mode, b in row["breakdown"].items():
        assert b["record_ms"] > 0 and b["programs"] > 0, mode
        assert b["device_ms"]["gemm"] > 0 and b["device_ms"]["elementwise"] > 0, mode
    bench_models.print_breakdown([row])
    out = capsys.readouterr().out
    assert "str/def max" in out and "mlp_small" in out


def test_no_pipeline_too_times_defer_without_pipelining_beside_it(capsys):
    args = bench_models.parse_args(["--quick", "--no-compile", "--steps", "2", "--warmup", "1",
                                    "--no-pipeline-too"])
    # 8 ops: the step's forward holds that many before a matmul, so defer pipelines.
    before = bench_models.deferfuse_torch.set_pipeline_ops(8)
    row = bench_models.bench("mlp_small", args)
    assert bench_models.deferfuse_torch.set_pipeline_ops(before) == 8, "the setting came back"
    assert row["errors"] == {}
    assert row["ms"]["nopipe"] > 0 and row["nopipe/defer"] > 0
    assert row["defer_step"]["pipelined_flushes"] >= 1
    bench_models.print_table([row], args)
    assert "nopipe/def" in capsys.readouterr().out


def test_more_times_the_models_beyond_the_zoo_after_it():
    names = bench_models.model_names(bench_models.parse_args(["--more"]))
    zoo = list(bench_models.model_zoo.ALL)
    assert names[:len(zoo)] == zoo
    assert names[len(zoo):] == list(bench_models.model_zoo_more.MORE)
    assert bench_models.model_names(bench_models.parse_args([])) == zoo


def test_hf_times_the_hugging_face_architectures_after_the_models_beyond_the_zoo():
    names = bench_models.model_names(bench_models.parse_args(["--more", "--hf"]))
    more = len(bench_models.model_zoo.ALL) + len(bench_models.model_zoo_more.MORE)
    assert names[more:] == bench_models.hf_architectures.NAMES


def test_tv_times_the_torchvision_architectures_after_the_hugging_face_ones():
    names = bench_models.model_names(bench_models.parse_args(["--more", "--hf", "--tv"]))
    hf = (len(bench_models.model_zoo.ALL) + len(bench_models.model_zoo_more.MORE)
          + len(bench_models.hf_architectures.NAMES))
    assert names[hf:] == bench_models.vision_architectures.NAMES
    assert len(set(names)) == len(names), "a name must pick one model"


@pytest.mark.parametrize("name", ["bloom", "swin_v2"])  # a Hugging Face, a torchvision one
def test_an_architecture_outside_the_zoo_named_by_models_is_timed_with_zero_fallbacks(name):
    args = bench_models.parse_args(["--quick", "--no-compile", "--steps", "1", "--warmup", "1",
                                    "--models", name])
    row = bench_models.bench(name, args)
    assert row["errors"] == {}
    assert all(row["ms"][r] > 0 for r in ("cpu", "strict", "defer"))
    assert row["defer_step"]["fallbacks"] == {}


def test_models_names_a_model_beyond_the_zoo_and_its_row_is_timed():
    args = bench_models.parse_args(["--quick", "--no-compile", "--steps", "1", "--warmup", "1",
                                    "--models", "gru"])
    assert bench_models.model_names(args) == ["gru"]
    row = bench_models.bench("gru", args)
    assert row["errors"] == {}
    assert all(row["ms"][r] > 0 for r in ("cpu", "strict", "defer"))


def test_autocast_runs_each_runners_forward_in_the_autocast_dtype():
    base = ["--quick", "--no-compile", "--steps", "1", "--warmup", "1"]
    plain = bench_models.bench("mlp_small", bench_models.parse_args(base))
    args = bench_models.parse_args(base + ["--autocast", "bfloat16"])
    row = bench_models.bench("mlp_small", args)
    assert row["errors"] == {}
    # Each Linear's weight and input are cast to bfloat16 first: more ops, none on the CPU.
    assert row["defer_step"]["ops_recorded"] > plain["defer_step"]["ops_recorded"]
    assert row["defer_step"]["fallback_ops"] == 0
    w = bench_models.build("mlp_small", "tiny")
    r = bench_models.Runner("defer", w, "tpu", "defer", autocast=torch.bfloat16)
    seen = []
    r.model.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    r._train_step(r.batches[0]).item()
    assert seen == [torch.bfloat16]
