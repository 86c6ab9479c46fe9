"""Hugging Face architectures nobody tuned the runtime for (`hf_architectures.py`: RoBERTa,
ALBERT, ELECTRA, GPT-Neo, OPT, Mistral, Phi, BLOOM, GPT-BigCode, BART, DeiT, Swin, ConvNeXt,
RegNet, MobileViT), built tiny with random weights, train in strict and in defer from the CPU
model's initial weights and give CPU's losses and trained state with every op on deferfuse (no
CPU fallback), within the zoo's tolerances (`test_model_zoo.py`)."""
import dataclasses
import functools

import pytest

import hf_architectures
import model_zoo
# The CPU oracle runs on one thread, as in test_model_zoo.py (an autouse fixture).
from test_model_zoo import STEPS, assert_trains_like_cpu, one_torch_thread, train  # noqa: F401

pytest.importorskip("transformers")

# Batch norm over the few values a channel has at the tiny size amplifies rounding from step to
# step (as for MobileNetV2 in test_model_zoo_more.py): one step checks each op's forward,
# backward and the optimizer without that amplification.
ONE_STEP = {"regnet", "mobilevit"}


@functools.lru_cache(maxsize=None)
def oracle(name):
    """The tiny workload of `name`, with SGD and momentum (see test_model_zoo_more.py for why
    not AdamW against CPU), and CPU's losses and trained state for it."""
    steps = 1 if name in ONE_STEP else STEPS
    w = dataclasses.replace(hf_architectures.build(name, "tiny", steps),
                            make_opt=model_zoo.sgd_momentum)
    losses, model = train(w, "cpu")
    return w, (losses, model.state_dict())


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("name", hf_architectures.NAMES)
def test_training_matches_cpu_with_zero_fallbacks(name, mode):
    w, cpu = oracle(name)
    assert_trains_like_cpu(name, mode, w, cpu)
