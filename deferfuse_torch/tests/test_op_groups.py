"""Strict mode runs each ATen op as its own program(s): a kernel the device records as several
runtime ops (layer_norm, softmax, AdamW's lerp_/addcmul_/addcdiv_, GELU's backward) runs as one
op group, fused, instead of one program and one pass over memory per piece."""
import copy

import pytest
import torch

import deferfuse_torch


def counted(fn):
    """fn's result, and the programs and ops it ran and recorded, all of its work finished."""
    torch.tpu.synchronize()
    before = deferfuse_torch.stats()
    out = fn()
    torch.tpu.synchronize()
    after = deferfuse_torch.stats()
    return out, {k: after[k] - before[k] for k in ("programs_run", "ops_recorded")}


def test_strict_layer_norm_is_one_program_for_its_recorded_ops():
    x, w, b = torch.randn(64, 128), torch.randn(128), torch.randn(128)
    xt, wt, bt = x.to("tpu"), w.to("tpu"), b.to("tpu")
    with deferfuse_torch.mode("strict"):
        out, n = counted(lambda: torch.nn.functional.layer_norm(xt, (128,), wt, bt))
    assert n["ops_recorded"] >= 6 and n["programs_run"] == 1, n
    torch.testing.assert_close(out.cpu(), torch.nn.functional.layer_norm(x, (128,), w, b))


def test_strict_in_place_lerp_is_one_program_and_writes_its_tensor():
    a, e = torch.randn(256, 64), torch.randn(256, 64)
    at, et = a.to("tpu"), e.to("tpu")
    alias = at.view(-1)
    with deferfuse_torch.mode("strict"):
        _, n = counted(lambda: at.lerp_(et, 0.1))
    assert n["ops_recorded"] >= 3 and n["programs_run"] == 1, n
    want = a.clone().lerp_(e, 0.1)
    torch.testing.assert_close(at.cpu(), want)
    assert torch.equal(alias.cpu(), at.cpu().view(-1))


def test_strict_adamw_step_runs_fewer_programs_than_ops_and_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                              torch.nn.Linear(64, 8))
    dev = copy.deepcopy(cpu).to("tpu")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, dev)]
    x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
    with deferfuse_torch.mode("strict"):
        for step in range(3):
            for m, opt, d in ((cpu, opts[0], "cpu"), (dev, opts[1], "tpu")):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(m(x.to(d)), y.to(d))
                loss.backward()
                if d == "tpu":
                    _, n = counted(opt.step)
                else:
                    opt.step()
            # lerp_, addcmul_ and addcdiv_ are 3-4 recorded ops each, one program each.
            assert n["programs_run"] < 0.7 * n["ops_recorded"], n
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x, -1),
    lambda x: torch.log_softmax(x, -1),
    lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],)),
    lambda x: torch.ops.aten.gelu_backward(x, x * 0.5),
    lambda x: torch.ops.aten.silu_backward(x, x * 0.5),
    lambda x: x.lerp(x * 0.5, 0.3),
    lambda x: torch.addcdiv(x, x, x.abs() + 1, value=-0.01),
], ids=["softmax", "log_softmax", "layer_norm", "gelu_backward", "silu_backward", "lerp",
        "addcdiv"])
def test_strict_op_group_gives_defer_modes_bits(fn):
    x = torch.randn(33, 70).to("tpu")
    with deferfuse_torch.mode("strict"):
        strict = fn(x).cpu()
    with deferfuse_torch.mode("defer"):
        defer = fn(x).cpu()
    with deferfuse_torch.mode("debug"):
        debug = fn(x).cpu()
    assert torch.equal(strict, defer)
    torch.testing.assert_close(strict, debug, rtol=1e-6, atol=1e-6)


def test_a_kernel_that_raises_inside_its_group_leaves_strict_mode_running_ops_at_once():
    x = torch.randn(4, 8).to("tpu")
    with deferfuse_torch.mode("strict"):
        with pytest.raises(RuntimeError, match="normalized_shape"):
            torch.nn.functional.layer_norm(x, (5,))
        _, n = counted(lambda: x + 1)
        y = x * 3
        assert deferfuse_torch.is_materialized(y) or deferfuse_torch.dump_pending() == ""
    assert n["programs_run"] == 1, n


def test_a_scaled_add_is_one_program_and_an_unscaled_one_runs_as_before():
    a, b = torch.randn(100).to("tpu"), torch.randn(100).to("tpu")
    with deferfuse_torch.mode("strict"):
        scaled, n2 = counted(lambda: torch.add(a, b, alpha=-0.5))
        plain, n1 = counted(lambda: a + b)
    assert (n2["ops_recorded"], n2["programs_run"]) == (2, 1), n2
    assert (n1["ops_recorded"], n1["programs_run"]) == (1, 1), n1
    torch.testing.assert_close(scaled.cpu(), torch.add(a.cpu(), b.cpu(), alpha=-0.5))


def test_a_strict_op_group_on_a_side_stream_runs_there_and_leaves_nothing_pending():
    x = torch.randn(32, 48)
    d = x.to("tpu")
    side = torch.tpu.Stream()
    side.wait_stream(torch.tpu.current_stream())
    with deferfuse_torch.mode("strict"):
        with torch.tpu.stream(side):
            y = torch.softmax(d, -1)
            # The group's end launched its program on this stream: nothing is left pending.
            assert deferfuse_torch.dump_pending() == ""
        torch.tpu.current_stream().wait_stream(side)
    torch.testing.assert_close(y.cpu(), torch.softmax(x, -1))


def test_a_cube_is_one_program_and_a_square_the_one_op_strict_path():
    x = torch.randn(100)
    d = x.to("tpu")
    with deferfuse_torch.mode("strict"):
        cube, n3 = counted(lambda: d.pow(3))
        square, n2 = counted(lambda: d.pow(2))
    assert (n3["ops_recorded"], n3["programs_run"]) == (2, 1), n3
    assert (n2["ops_recorded"], n2["programs_run"]) == (1, 1), n2
    assert torch.equal(cube.cpu(), x.pow(3)) and torch.equal(square.cpu(), x.pow(2))
