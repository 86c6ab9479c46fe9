"""torchvision architectures nobody tuned the runtime for (`vision_architectures.py`: DenseNet,
ShuffleNetV2, SqueezeNet, GoogLeNet, RegNetY, MobileNetV3, ResNeXt, ConvNeXt, Swin v1 and v2,
MaxViT, ViT, EfficientNetV2), built tiny with random weights, train in strict and in defer from
the CPU model's initial weights and give CPU's losses and trained state with every op on
deferfuse (no CPU fallback), within the zoo's tolerances (`test_model_zoo.py`).

MNASNet is benched (`bench_models.py --tv`) but not compared here: at random initialization its
gradients reach 1e4 and CPU's own float32 ones are 2e-3 off from float64's, so no float32
backend can match CPU's within the zoo's tolerances."""
import functools

import pytest

import vision_architectures
# The CPU oracle runs on one thread, as in test_model_zoo.py (an autouse fixture).
from test_model_zoo import STEPS, assert_trains_like_cpu, one_torch_thread, train  # noqa: F401

pytest.importorskip("torchvision")

TESTED = [n for n in vision_architectures.NAMES if n != "mnasnet"]

# Batch norm over few values per channel, with ReLU masks that float32 rounding can flip (a
# ResNeXt output element of 2e-6 that CPU keeps and the tpu's equally rounded sum clips to 0
# sends one gradient element 4% of the largest to 0), amplifies rounding from step to step: one
# step checks each op's forward, backward and the optimizer without that amplification.
ONE_STEP = {"shufflenet_v2", "googlenet", "resnext"}


@functools.lru_cache(maxsize=None)
def oracle(name):
    """The tiny workload of `name` (SGD with momentum) and CPU's losses and trained state."""
    w = vision_architectures.build(name, "tiny", 1 if name in ONE_STEP else STEPS)
    losses, model = train(w, "cpu")
    return w, (losses, model.state_dict())


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("name", TESTED)
def test_training_matches_cpu_with_zero_fallbacks(name, mode):
    w, cpu = oracle(name)
    assert_trains_like_cpu(name, mode, w, cpu)


def test_every_architecture_builds_at_the_bench_size_with_its_description():
    """The bench sizes are torchvision's published configurations: building them must not
    fail (a renamed argument in a new torchvision shows here, not in a bench run)."""
    for name in vision_architectures.NAMES:
        w = vision_architectures.build(name, "bench", 1)
        assert w.description.startswith("torchvision "), name
        assert w.batches[0]["x"].shape == (8, 3, 64, 64)
