"""torchvision architectures beside the zoo's (resnet18, MobileNetV2, EfficientNet-B0): each
family brings its own mix of layers, so a change tuned to the zoo shows here whether it holds
for image models nobody tuned it for. Names that the zoo or `hf_architectures.py` already use
for another model of the family take a `_tv` suffix. `test_vision_architectures.py` trains their tiny sizes
against CPU; `bench_models.py --tv` times their bench sizes beside the zoo.

- densenet: dense blocks (every layer's input a concatenation of all before it);
- shufflenet_v2: ShuffleNetV2 (channel split and channel shuffle, a transpose of channel groups);
- squeezenet: SqueezeNet 1.1 (fire modules, ceil-mode max pooling, a convolutional head);
- mnasnet: MNASNet (depthwise convolutions, 5x5 kernels);
- googlenet: Inception blocks (four branches concatenated, 1x1 to 5x5);
- regnet_y: RegNetY (grouped convolutions with squeeze-and-excitation);
- mobilenet_v3: MobileNetV3 (hard swish, hard sigmoid gates);
- resnext: ResNeXt bottlenecks (grouped 3x3 convolutions);
- convnext_tv: ConvNeXt (depthwise 7x7, channels-last layer norm, layer scale);
- swin_tv, swin_v2: Swin Transformer v1 (relative position bias, shifted windows through roll and
  masks) and v2 (cosine attention with a learned scale, a continuous position-bias MLP);
- maxvit: MaxViT (MBConv, then block and grid attention over partitioned windows);
- vit_tv: torchvision's VisionTransformer (`nn.MultiheadAttention`, not Hugging Face's layers);
- effnet_v2: EfficientNetV2 (fused MBConv blocks, then MBConv with squeeze-and-excitation).

Dropout and stochastic depth are off (the tpu's random stream is not CPU's). The bench sizes
are torchvision's own published configurations where they run at 64x64 (densenet121,
shufflenet_v2_x1_0, squeezenet1_1, mnasnet0_5, googlenet, regnet_y_400mf, mobilenet_v3_small,
resnext50_32x4d, convnext_tiny, swin_t, swin_v2_t, efficientnet_v2_s), else small versions
of them (MaxViT, ViT); the tiny sizes shrink widths and depths so a CPU step takes
milliseconds. The workloads have `model_zoo.Workload`'s form."""
import torch

from model_zoo import Workload, _generator, _logits_loss, sgd_momentum

CLASSES = 10
# Per size: image side and batch.
SIZES = {"tiny": dict(IMAGE=32, BATCH=4), "bench": dict(IMAGE=64, BATCH=8)}


def _tiny(tvm, name):
    """The tiny version of `name`: the family's layers at a few channels and blocks."""
    from torchvision.models import convnext, efficientnet, regnet, resnet, swin_transformer
    swin = dict(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                window_size=[2, 2], stochastic_depth_prob=0.0, num_classes=CLASSES)
    build = {
        "densenet": lambda: tvm.DenseNet(growth_rate=8, block_config=(2, 2),
                                         num_init_features=16, bn_size=2,
                                         num_classes=CLASSES),
        "shufflenet_v2": lambda: tvm.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128],
                                               num_classes=CLASSES),
        "squeezenet": lambda: tvm.SqueezeNet("1_1", num_classes=CLASSES, dropout=0.0),
        "mnasnet": lambda: tvm.MNASNet(0.5, num_classes=CLASSES, dropout=0.0),
        "googlenet": lambda: tvm.GoogLeNet(num_classes=CLASSES, aux_logits=False,
                                           init_weights=True, dropout=0.0),
        "regnet_y": lambda: tvm.RegNet(regnet.BlockParams.from_init_params(
            depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25),
            num_classes=CLASSES),
        "mobilenet_v3": lambda: tvm.mobilenet_v3_small(width_mult=0.5, num_classes=CLASSES,
                                                       dropout=0.0),
        "resnext": lambda: tvm.ResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=CLASSES,
                                      groups=4, width_per_group=4),
        "convnext_tv": lambda: tvm.ConvNeXt([convnext.CNBlockConfig(16, 32, 1),
                                          convnext.CNBlockConfig(32, None, 1)],
                                         stochastic_depth_prob=0.0, num_classes=CLASSES),
        "swin_tv": lambda: tvm.SwinTransformer(**swin),
        "swin_v2": lambda: tvm.SwinTransformer(
            **swin, block=swin_transformer.SwinTransformerBlockV2,
            downsample_layer=swin_transformer.PatchMergingV2),
        "maxvit": lambda: tvm.MaxVit(input_size=(32, 32), stem_channels=16, partition_size=2,
                                     block_channels=[16, 32], block_layers=[1, 1], head_dim=8,
                                     stochastic_depth_prob=0.0, num_classes=CLASSES),
        "vit_tv": lambda: tvm.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                             num_heads=2, hidden_dim=32, mlp_dim=64,
                                             num_classes=CLASSES),
        "effnet_v2": lambda: tvm.EfficientNet(
            [efficientnet.FusedMBConvConfig(1, 3, 1, 16, 16, 1),
             efficientnet.FusedMBConvConfig(4, 3, 2, 16, 32, 1),
             efficientnet.MBConvConfig(4, 3, 2, 32, 48, 1)],
            dropout=0.0, stochastic_depth_prob=0.0, num_classes=CLASSES, last_channel=128),
    }
    return build[name]()


def _bench(tvm, name):
    """The bench version of `name`: torchvision's published configuration, or (MaxViT, ViT,
    whose published ones need 224x224 images) a small one at the bench image size."""
    from torchvision.models import swin_transformer
    no_drop = dict(num_classes=CLASSES, dropout=0.0)
    no_depth_drop = dict(num_classes=CLASSES, stochastic_depth_prob=0.0)
    swin_t = dict(patch_size=[4, 4], embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                  **no_depth_drop)
    build = {
        "densenet": lambda: tvm.densenet121(num_classes=CLASSES),
        "shufflenet_v2": lambda: tvm.shufflenet_v2_x1_0(num_classes=CLASSES),
        "squeezenet": lambda: tvm.squeezenet1_1(**no_drop),
        "mnasnet": lambda: tvm.mnasnet0_5(**no_drop),
        "googlenet": lambda: tvm.googlenet(aux_logits=False, init_weights=True, **no_drop),
        "regnet_y": lambda: tvm.regnet_y_400mf(num_classes=CLASSES),
        "mobilenet_v3": lambda: tvm.mobilenet_v3_small(**no_drop),
        "resnext": lambda: tvm.resnext50_32x4d(num_classes=CLASSES),
        "convnext_tv": lambda: tvm.convnext_tiny(**no_depth_drop),
        # swin_t's and swin_v2_t's configurations (their builders fix stochastic depth).
        "swin_tv": lambda: tvm.SwinTransformer(window_size=[7, 7], **swin_t),
        "swin_v2": lambda: tvm.SwinTransformer(
            window_size=[8, 8], block=swin_transformer.SwinTransformerBlockV2,
            downsample_layer=swin_transformer.PatchMergingV2, **swin_t),
        "maxvit": lambda: tvm.MaxVit(input_size=(64, 64), stem_channels=64, partition_size=4,
                                     block_channels=[64, 128], block_layers=[2, 2],
                                     head_dim=32, **no_depth_drop),
        "vit_tv": lambda: tvm.VisionTransformer(image_size=64, patch_size=8, num_layers=4,
                                             num_heads=4, hidden_dim=128, mlp_dim=512,
                                             num_classes=CLASSES),
        "effnet_v2": lambda: tvm.efficientnet_v2_s(dropout=0.0, **no_depth_drop),
    }
    return build[name]()


# What each bench size is, for the bench table's legend.
BENCH_CONFIGS = {
    "densenet": "densenet121", "shufflenet_v2": "shufflenet_v2_x1_0", "squeezenet": "squeezenet1_1",
    "mnasnet": "mnasnet0_5", "googlenet": "googlenet", "regnet_y": "regnet_y_400mf",
    "mobilenet_v3": "mobilenet_v3_small", "resnext": "resnext50_32x4d",
    "convnext_tv": "convnext_tiny", "swin_tv": "swin_t", "swin_v2": "swin_v2_t",
    "maxvit": "MaxViT 2 stages 64-128, partition 4", "vit_tv": "ViT 4L d128 patch 8",
    "effnet_v2": "efficientnet_v2_s",
}

NAMES = ["densenet", "shufflenet_v2", "squeezenet", "mnasnet", "googlenet", "regnet_y",
         "mobilenet_v3", "resnext", "convnext_tv", "swin_tv", "swin_v2", "maxvit", "vit_tv",
         "effnet_v2"]


def build(name, size="tiny", steps=5) -> Workload:
    """The workload `name` at `size` ("tiny" or "bench") with `steps` batches of random images
    and labels, trained with SGD and momentum as the zoo's image models are."""
    if name not in NAMES:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(NAMES)}")
    import torchvision.models as tvm
    torch.manual_seed(0)
    model = (_tiny if size == "tiny" else _bench)(tvm, name)
    model.train()
    z = SIZES[size]
    g = _generator()
    side = z["IMAGE"]
    batches = [{"x": torch.randn(z["BATCH"], 3, side, side, generator=g),
                "y": torch.randint(0, CLASSES, (z["BATCH"],), generator=g)}
               for _ in range(steps)]
    config = BENCH_CONFIGS[name] if size == "bench" else f"tiny {type(model).__name__}"
    what = f"torchvision {config}, {side}x{side} images, batch {z['BATCH']}, SGD momentum"
    return Workload(name, model, batches, _logits_loss, sgd_momentum, description=what)
