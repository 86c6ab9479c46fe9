"""The models beyond the zoo (`model_zoo_more.py`: MobileNetV2, EfficientNet-B0, DistilBERT,
T5, Qwen2, nn.TransformerEncoder, a bidirectional GRU, a 1-D convolution audio encoder, a
U-Net), built tiny with random weights, train 5 steps in strict and in defer from the CPU
model's initial weights and give CPU's losses and trained state with every op on deferfuse
(no CPU fallback), as the zoo's own models do (`test_model_zoo.py`, whose tolerances these
share). They train with SGD and momentum whatever their bench optimizer: its update is
proportional to the gradient, so a parameter whose true gradient is zero (a convolution's bias
before batch norm, attention's key bias) moves by rounding noise on both devices, where
AdamW's normalized step turns that noise into lr-sized moves that differ (measured up to 1.9e-3
after 5 steps, U-Net's first bias). AdamW itself is checked on the zoo's models."""
import copy
import dataclasses
import functools

import pytest
import torch

import model_zoo
import model_zoo_more
from test_model_zoo import STEPS, assert_trains_like_cpu, train


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The CPU oracle on one thread, as in test_model_zoo.py."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Models whose training on random data is chaotic at the tiny size, so that CPU against CPU
# with its initial weights moved by 1e-7 (relative) ends 5 steps apart by 1e-2 (MobileNetV2)
# and 5e-1 (EfficientNet-B0): batch norm over the few values a channel has at 1x1 or 2x2
# resolution amplifies rounding. They train one step: its loss and every parameter's update
# check each op's forward, backward and the optimizer without that amplification.
ONE_STEP = {"mobilenet", "effnet"}


@functools.lru_cache(maxsize=None)
def workload(name):
    w = model_zoo_more.build(name, "tiny", 1 if name in ONE_STEP else STEPS)
    return dataclasses.replace(w, make_opt=model_zoo.sgd_momentum)


@functools.lru_cache(maxsize=None)
def cpu_run(name):
    losses, model = train(workload(name), "cpu")
    return losses, model.state_dict()


def test_to_tpu_keeps_qwen2s_tied_embedding_one_parameter():
    w = workload("qwen2")
    assert model_zoo.untied(w.model, w.tied) == []
    assert model_zoo.untied(copy.deepcopy(w.model).to("tpu"), w.tied) == []


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("name", list(model_zoo_more.MORE))
def test_training_matches_cpu_with_zero_fallbacks(name, mode):
    assert_trains_like_cpu(name, mode, workload(name), cpu_run(name))
