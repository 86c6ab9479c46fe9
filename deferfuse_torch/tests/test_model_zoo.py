"""The model zoo on "tpu": Hugging Face GPT-2, Llama, BERT and ViT, torchvision's resnet18 and a
from-scratch nanoGPT (sdpa and masked-softmax attention), built tiny with random weights
(`model_zoo.py`), train 5 steps in strict and in defer from the CPU model's initial weights and
give CPU's losses and trained parameters and buffers with every op on deferfuse (no CPU
fallback). Dropout, which cannot match CPU's random stream, is checked for its statistics and
for same-seed reproducibility; GPT-2's greedy `generate` gives CPU's tokens."""
import copy
import functools

import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
import model_zoo

STEPS = 5
TPU_MODES = ["strict", "defer"]
# Per-step loss tolerance against CPU. f32 training on two backends drifts apart through
# rounding (other sum orders and GEMM blocking, the runtime's ~2 ulp exp/tanh); over 5 steps
# of these tiny models it stays far below 1e-4 relative (measured with ties restored: 1.2e-7,
# resnet18 1.7e-6: its batch norm amplifies rounding, see model_zoo.sgd_momentum). A wrong
# kernel, a lost in-place update or an untied embedding moves a loss by 1e-4 or more from the
# second step on.
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-5
# The trained parameters and buffers (batch norm's running statistics: they do not move a
# training-mode loss). atol is looser than the losses' because an attention key bias has an
# exactly-zero gradient (softmax ignores a shift common to a query's scores), so its computed
# gradient is rounding noise, which AdamW scales up to lr * noise / eps per step: measured up to
# 2.7e-5 (ViT's k_proj.bias) between tpu and CPU, everything else < 1e-5. A lost in-place
# buffer update or an untied copy is off by 1e-3 or more.
STATE_RTOL, STATE_ATOL = 1e-4, 1e-4


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The CPU oracle on one thread: on a loaded 2-core machine torch's spinning OpenMP
    workers make resnet18's CPU steps 10x slower; the results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def workload(name, dropout=0.0):
    """Built once per module run: the tests only deep-copy its model, never change it."""
    return model_zoo.build(name, "tiny", STEPS, dropout)


def train(w, device, mode="strict"):
    """Trains a deep copy of w.model for its batches; the losses and the trained model."""
    model = copy.deepcopy(w.model).to(device)
    opt = w.make_opt(model.parameters())
    losses = []
    with deferfuse_torch.mode(mode):
        for batch in w.batches:
            losses.append(model_zoo.train_step(w, model, opt,
                                               model_zoo.to_device(batch, device)).item())
    return losses, model


@functools.lru_cache(maxsize=None)
def cpu_run(name):
    """CPU's losses and its trained state (parameters and buffers, e.g. batch norm's running
    statistics), once per model for both modes."""
    losses, model = train(workload(name), "cpu")
    return losses, model.state_dict()


@pytest.mark.parametrize("name", sorted(model_zoo.TIES))
def test_to_tpu_keeps_tied_weights_one_parameter(name):
    w = workload(name)
    assert model_zoo.untied(w.model, w.tied) == []
    assert model_zoo.untied(copy.deepcopy(w.model).to("tpu"), w.tied) == []


def assert_trains_like_cpu(name, mode, w, cpu):
    """Trains a copy of w's model on tpu in `mode` and checks it against `cpu` (`cpu_run`'s
    losses and trained state): the same losses and state within the tolerances above, tied
    weights still tied, and no op on the CPU fallback."""
    want, want_state = cpu
    deferfuse_torch.reset_fallback_counts()
    got, model = train(w, "tpu", mode)
    fallbacks = deferfuse_torch.fallback_counts()
    why = f"untied on tpu: {model_zoo.untied(model, w.tied)}, CPU fallbacks: {fallbacks}"
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
        rtol=LOSS_RTOL, atol=LOSS_ATOL,
        msg=lambda m: f"{name} {mode}: tpu losses {got} vs CPU {want} ({why})\n{m}")
    got_state = {k: v.cpu() for k, v in model.state_dict().items()}
    assert got_state.keys() == want_state.keys()
    for key, value in want_state.items():
        torch.testing.assert_close(got_state[key], value, rtol=STATE_RTOL, atol=STATE_ATOL,
                                   msg=lambda m: f"{name} {mode}: {key} after training "
                                                 f"({why})\n{m}")
    assert fallbacks == {}, f"{name} {mode}: ops ran on CPU over {len(w.batches)} steps"


@pytest.mark.parametrize("mode", TPU_MODES)
@pytest.mark.parametrize("name", list(model_zoo.ZOO))
def test_training_matches_cpu_with_zero_fallbacks(name, mode):
    assert_trains_like_cpu(name, mode, workload(name), cpu_run(name))


DROPOUT_N = 200_000


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("mode", TPU_MODES)
def test_dropout_zeroes_a_fraction_p_and_scales_survivors_by_one_over_keep(mode, p):
    torch.manual_seed(0)  # the 6-sigma bound then holds or fails the same way every run
    x = torch.ones(DROPOUT_N).to("tpu")
    deferfuse_torch.reset_fallback_counts()
    with deferfuse_torch.mode(mode):
        y = F.dropout(x, p, training=True).cpu()
    assert deferfuse_torch.fallback_counts() == {}
    zeros = (y == 0).double().mean().item()
    sigma = (p * (1 - p) / DROPOUT_N) ** 0.5
    assert abs(zeros - p) < 6 * sigma, (zeros, p)
    survivors = y[y != 0]
    torch.testing.assert_close(survivors, torch.full_like(survivors, 1 / (1 - p)),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("mode", TPU_MODES)
def test_dropout_backward_passes_gradient_through_the_forward_mask_only(mode):
    x = torch.ones(DROPOUT_N).to("tpu").requires_grad_()
    deferfuse_torch.reset_fallback_counts()
    with deferfuse_torch.mode(mode):
        y = F.dropout(x, 0.3, training=True)
        y.sum().backward()
        got_grad, got_y = x.grad.cpu(), y.detach().cpu()
    assert deferfuse_torch.fallback_counts() == {}
    # d(sum y)/dx is the mask times 1/(1-p), which for x = 1 is y itself.
    assert torch.equal(got_grad, got_y)


def dropout_mask(mode, seed):
    torch.manual_seed(seed)
    with deferfuse_torch.mode(mode):
        return F.dropout(torch.ones(4096).to("tpu"), 0.5, training=True).cpu()


def test_dropout_mask_repeats_under_the_same_seed_in_strict_and_defer():
    first = dropout_mask("strict", 7)
    assert torch.equal(dropout_mask("strict", 7), first)
    assert torch.equal(dropout_mask("defer", 7), first)
    assert not torch.equal(dropout_mask("strict", 8), first)


@pytest.mark.parametrize("mode", TPU_MODES)
def test_consecutive_dropout_draws_differ(mode):
    x = torch.ones(4096).to("tpu")
    with deferfuse_torch.mode(mode):
        a, b = F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True)
        assert not torch.equal(a.cpu(), b.cpu())


def train_with_dropout(name, mode, seed):
    w = workload(name, dropout=0.1)  # first, since building seeds the weights
    torch.manual_seed(seed)
    return train(w, "tpu", mode)[0]


@pytest.mark.parametrize("name", ["nanogpt", "nanogpt_masked", "gpt2", "lstm"])
def test_training_with_dropout_repeats_under_the_same_seed_in_strict_and_defer(name):
    strict = train_with_dropout(name, "strict", 3)
    assert train_with_dropout(name, "strict", 3) == strict
    # strict, debug and defer give the same bytes, random masks included.
    assert train_with_dropout(name, "defer", 3) == strict
    # Dropout is on: the losses are not dropout-free training's.
    assert strict != train(workload(name), "tpu")[0]


@pytest.mark.parametrize("mode", TPU_MODES)
def test_gpt2_greedy_generate_gives_cpu_tokens_with_zero_fallbacks(mode):
    w = workload("gpt2")
    prompt = w.batches[0]["input_ids"][:, :4]
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                  pad_token_id=w.model.config.pad_token_id)
    want = copy.deepcopy(w.model).eval().generate(prompt, **kwargs)
    deferfuse_torch.reset_fallback_counts()
    model = copy.deepcopy(w.model).eval().to("tpu")
    with deferfuse_torch.mode(mode):
        got = model.generate(prompt.to("tpu"), **{
            k: v.to("tpu") if torch.is_tensor(v) else v for k, v in kwargs.items()})
    fallbacks = deferfuse_torch.fallback_counts()
    assert torch.equal(got.cpu(), want), (got.cpu(), want)
    assert fallbacks == {}


def test_gpt2_sampled_generate_repeats_under_a_seed_in_every_mode_with_zero_fallbacks():
    """do_sample with top-k and top-p: multinomial on the device generator, so a seed gives the
    same tokens in strict, debug and defer (not CPU's: the streams differ)."""
    w = workload("gpt2")
    prompt = w.batches[0]["input_ids"][:, :4].to("tpu")
    model = copy.deepcopy(w.model).eval().to("tpu")
    tokens = {}
    for mode in ("strict", "debug", "defer"):
        deferfuse_torch.reset_fallback_counts()
        with deferfuse_torch.mode(mode):
            torch.manual_seed(3)
            tokens[mode] = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=True,
                top_k=20, top_p=0.9, pad_token_id=w.model.config.pad_token_id).cpu()
        assert deferfuse_torch.fallback_counts() == {}, mode
    assert tokens["strict"].shape == (prompt.shape[0], prompt.shape[1] + 8)
    assert torch.equal(tokens["debug"], tokens["strict"])
    assert torch.equal(tokens["defer"], tokens["strict"])
