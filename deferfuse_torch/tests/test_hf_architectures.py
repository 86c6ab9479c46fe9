"""Hugging Face architectures nobody tuned the runtime for (`hf_architectures.py`: RoBERTa,
ALBERT, ELECTRA, GPT-Neo, OPT, Mistral, Phi, BLOOM, GPT-BigCode, BART, DeiT, Swin, ConvNeXt,
RegNet, MobileViT), built tiny with random weights, train in strict and in defer from the CPU
model's initial weights and give CPU's losses and trained state with every op on deferfuse (no
CPU fallback), within the zoo's tolerances (`test_model_zoo.py`)."""
import dataclasses
import functools

import pytest
import torch

import hf_architectures
import model_zoo
from test_model_zoo import STEPS, assert_trains_like_cpu, train

pytest.importorskip("transformers")

# Batch norm over the few values a channel has at the tiny size amplifies rounding from step to
# step (as for MobileNetV2 in test_model_zoo_more.py): one step checks each op's forward,
# backward and the optimizer without that amplification.
ONE_STEP = {"regnet", "mobilevit"}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The CPU oracle on one thread, as in test_model_zoo.py."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def workload(name):
    w = hf_architectures.build(name, "tiny", 1 if name in ONE_STEP else STEPS)
    return dataclasses.replace(w, make_opt=model_zoo.sgd_momentum)


@functools.lru_cache(maxsize=None)
def cpu_run(name):
    losses, model = train(workload(name), "cpu")
    return losses, model.state_dict()


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("name", hf_architectures.NAMES)
def test_training_matches_cpu_with_zero_fallbacks(name, mode):
    assert_trains_like_cpu(name, mode, workload(name), cpu_run(name))
