"""F.ctc_loss on tpu against CPU in every eager mode with no CPU fallback: every reduction,
zero_infinity, padded and concatenated targets, lengths as lists or tensors, float64,
unbatched input, targets no alignment fits, CPU's errors, no sync point in defer mode, and a
Hugging Face Wav2Vec2ForCTC that trains with CPU's losses."""

import pytest
import torch
import torch.nn.functional as F

import deferfuse_torch
from conftest import check, trains_like_cpu

torch.manual_seed(5)
T, N, C, S = 20, 4, 6, 7
LOGITS = torch.randn(T, N, C)
TARGETS = torch.randint(1, C, (N, S))
INPUT_LENGTHS = [20, 15, 20, 9]
TARGET_LENGTHS = [7, 4, 0, 6]


@pytest.fixture(autouse=True)
def no_fallback():
    deferfuse_torch.reset_fallback_counts()
    yield
    assert deferfuse_torch.fallback_counts() == {}


def both(fn, logits=LOGITS, atol=1e-5, rtol=1e-5):
    """fn(log_probs, device) on CPU and tpu: the same loss and the same gradient of the logits."""
    out = {}
    for dev in ("cpu", "tpu"):
        x = logits.detach().clone().to(dev).requires_grad_()
        loss = fn(x.log_softmax(-1), dev)
        loss.sum().backward()
        out[dev] = (loss, x.grad)
    check(out["tpu"][0], out["cpu"][0].detach(), atol=atol, rtol=rtol)
    check(out["tpu"][1], out["cpu"][1], atol=atol, rtol=rtol)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_padded_targets_match_cpu(mode, reduction, zero_infinity):
    both(lambda lp, dev: F.ctc_loss(lp, TARGETS.to(dev), INPUT_LENGTHS, TARGET_LENGTHS,
                                    reduction=reduction, zero_infinity=zero_infinity))


def test_concatenated_targets_and_tensor_lengths_match_cpu(mode):
    flat = torch.cat([TARGETS[b, :n] for b, n in enumerate(TARGET_LENGTHS)])
    il, tl = torch.tensor(INPUT_LENGTHS), torch.tensor(TARGET_LENGTHS)
    both(lambda lp, dev: F.ctc_loss(lp, flat.to(dev), il, tl))
    both(lambda lp, dev: F.ctc_loss(lp, flat.to(dev), il.to(dev), tl.to(dev), blank=0))


def test_another_blank_and_int32_targets_match_cpu(mode):
    t = torch.randint(0, C - 1, (N, S), dtype=torch.int32)
    both(lambda lp, dev: F.ctc_loss(lp, t.to(dev), INPUT_LENGTHS, TARGET_LENGTHS, blank=C - 1))


def test_float64_matches_cpu(mode):
    both(lambda lp, dev: F.ctc_loss(lp, TARGETS.to(dev), INPUT_LENGTHS, TARGET_LENGTHS),
         logits=LOGITS.double(), atol=1e-12, rtol=1e-12)


def test_unbatched_input_matches_cpu(mode):
    both(lambda lp, dev: F.ctc_loss(lp, TARGETS[0, :5].to(dev), [T], [5]), logits=LOGITS[:, 0])


def test_a_target_no_alignment_fits_gives_inf_or_zero_like_cpu(mode):
    # Two copies of a label need a blank between them: 3 steps, and the input has 2.
    t = torch.tensor([[2, 2]])
    for zi in (False, True):
        both(lambda lp, dev: F.ctc_loss(lp, t.to(dev), [2], [2], reduction="sum",
                                        zero_infinity=zi), logits=LOGITS[:2, :1])


@pytest.mark.parametrize("case", ["input too long", "lengths count", "half"])
def test_bad_calls_raise_cpus_error(case):
    def call(dev):
        lp = LOGITS.log_softmax(-1).to(dev)
        if case == "input too long":
            return F.ctc_loss(lp, TARGETS.to(dev), [21, 15, 20, 9], TARGET_LENGTHS)
        if case == "lengths count":
            return F.ctc_loss(lp, TARGETS.to(dev), INPUT_LENGTHS[:3], TARGET_LENGTHS[:3])
        return F.ctc_loss(lp.half(), TARGETS.to(dev), INPUT_LENGTHS, TARGET_LENGTHS)
    with pytest.raises(RuntimeError) as cpu:
        call("cpu")
    with pytest.raises(RuntimeError) as tpu:
        call("tpu")
    assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


def test_the_loss_and_its_gradient_are_no_sync_point():
    with deferfuse_torch.mode("defer"):
        x = LOGITS.to("tpu").requires_grad_()
        before = deferfuse_torch.stats()["sync_points"]
        F.ctc_loss(x.log_softmax(-1), TARGETS.to("tpu"), INPUT_LENGTHS, TARGET_LENGTHS).backward()
        after = deferfuse_torch.stats()["sync_points"]
    assert after == before


def test_a_hugging_face_wav2vec2_for_ctc_trains_with_cpus_losses():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Wav2Vec2Config(
        vocab_size=12, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, hidden_dropout=0.0,
        activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0,
        mask_time_prob=0.0, final_dropout=0.0, pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    audio = torch.randn(2, 800, generator=g)
    labels = torch.randint(1, 12, (2, 6), generator=g)
    labels[1, 4:] = -100  # padding, as HF's collators mark it

    def build(dev):
        return transformers.Wav2Vec2ForCTC(cfg).to(dev)

    def loss(m, dev):
        return m(input_values=audio.to(dev), labels=labels.to(dev)).loss

    trains_like_cpu(build, loss)
