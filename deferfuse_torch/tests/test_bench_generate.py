"""bench_generate.py measures what it says: each runner generates CPU's tokens, gets timed
rounds, and the defer runner's generation sends nothing to the CPU fallback."""
import os
import sys

import pytest

pytest.importorskip("transformers")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_generate  # noqa: E402


def test_every_runner_generates_cpus_tokens_and_is_timed(capsys):
    args = bench_generate.parse_args(["--quick", "--rounds", "2", "--warmup", "1"])
    res = bench_generate.bench(args)
    assert res["errors"] == {}
    assert all(res["ms"][r] > 0 for r in bench_generate.RUNNERS)
    assert res["fallbacks_per_token"] == 0
    bench_generate.print_table(res)
    out = capsys.readouterr().out
    assert "str/def" in out and "fallbacks/token" in out


def test_llama_generates_cpus_tokens_too():
    args = bench_generate.parse_args(["--quick", "--model", "llama", "--rounds", "1",
                                      "--warmup", "0"])
    res = bench_generate.bench(args)
    assert res["errors"] == {} and res["fallbacks_per_token"] == 0


def test_a_batch_of_sequences_generates_cpus_tokens_too():
    args = bench_generate.parse_args(["--quick", "--rounds", "1", "--warmup", "0",
                                      "--batch", "3"])
    res = bench_generate.bench(args)
    assert res["errors"] == {}


def test_a_runner_whose_tokens_differ_is_reported_not_timed(monkeypatch):
    args = bench_generate.parse_args(["--quick", "--rounds", "1", "--warmup", "0"])
    real_round = bench_generate.Runner.round

    def off_by_one(self, timed):
        real_round(self, timed)
        if self.label == "defer":
            self.tokens = self.tokens + 1

    monkeypatch.setattr(bench_generate.Runner, "round", off_by_one)
    res = bench_generate.bench(args)
    assert res["errors"] == {"defer": "generated tokens differ from CPU's"}
    assert res["ms"]["defer"] is None
