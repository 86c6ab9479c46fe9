"""Models beyond the zoo the issues list (`model_zoo.py`), for checking the general case: each
is another family's mix of ops and shapes, so a speed-up or a fix tuned to the zoo shows here
whether it holds elsewhere. `bench_models.py --more` times them beside the zoo;
`test_model_zoo_more.py` trains their tiny sizes against CPU.

- mobilenet, effnet: torchvision's MobileNetV2 and EfficientNet-B0 (depthwise convolutions,
  ReLU6 and SiLU, squeeze-and-excitation), their dropout and stochastic depth off;
- distilbert, t5: Hugging Face DistilBERT (sequence classification) and T5 (encoder-decoder,
  relative position buckets, RMS norm);
- qwen2: Hugging Face Qwen2 (GQA, tied embeddings);
- tenc: `nn.TransformerEncoder` (pre-norm, GELU, causal mask);
- gru: a bidirectional 2-layer `nn.GRU` classifier;
- audio: a 1-D convolution stack with group norm and GELU over raw audio (wav2vec2's feature
  encoder in miniature: long sequences, few channels at first);
- unet: a small U-Net (convolutions with few channels at full resolution, transposed
  convolutions, skip concatenations) with a per-pixel loss.

Every model is built with dropout 0 (the tpu's random stream is not CPU's); the workloads
have `model_zoo.Workload`'s form, so the zoo's runners and tests take them as they are."""
from typing import Dict

import torch
import torch.nn as nn
import torch.nn.functional as F

from model_zoo import (Workload, _generator, _hf_loss, _lm_batches, _logits_loss,
                       _token_batches, adamw, sgd_momentum)

DIMS = {
    "mobilenet": {"tiny": dict(width=0.25, image=32, batch=8),
                  "bench": dict(width=1.0, image=64, batch=8)},
    "effnet": {"tiny": dict(image=32, batch=8), "bench": dict(image=64, batch=8)},
    "distilbert": {"tiny": dict(d=32, layers=2, heads=2, vocab=64, seq=16, batch=2),
                   "bench": dict(d=128, layers=4, heads=4, vocab=256, seq=64, batch=16)},
    "t5": {"tiny": dict(d=32, layers=1, heads=2, vocab=64, seq=16, batch=2),
           "bench": dict(d=128, layers=2, heads=4, vocab=256, seq=64, batch=16)},
    "qwen2": {"tiny": dict(d=32, layers=2, heads=4, kv_heads=2, vocab=64, seq=16, batch=2),
              "bench": dict(d=128, layers=4, heads=4, kv_heads=2, vocab=256, seq=64,
                            batch=16)},
    "tenc": {"tiny": dict(d=32, layers=2, heads=2, vocab=64, seq=16, batch=2),
             "bench": dict(d=128, layers=4, heads=4, vocab=256, seq=64, batch=16)},
    "gru": {"tiny": dict(d=32, vocab=64, seq=16, batch=2),
            "bench": dict(d=128, vocab=256, seq=64, batch=16)},
    "audio": {"tiny": dict(samples=1600, batch=2), "bench": dict(samples=16000, batch=8)},
    "unet": {"tiny": dict(image=16, batch=2), "bench": dict(image=64, batch=4)},
}
CLASSES = 10


def _image_batches(steps, batch, image):
    g = _generator()
    return [{"x": torch.randn(batch, 3, image, image, generator=g),
             "y": torch.randint(0, CLASSES, (batch,), generator=g)} for _ in range(steps)]


def mobilenet(size, steps):
    import torchvision
    c = DIMS["mobilenet"][size]
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(num_classes=CLASSES, width_mult=c["width"],
                                            dropout=0.0)
    return Workload("mobilenet", model, _image_batches(steps, c["batch"], c["image"]),
                    _logits_loss, sgd_momentum,
                    description=f"torchvision mobilenet_v2 x{c['width']} {c['batch']}x3x"
                                f"{c['image']}x{c['image']}, SGD momentum")


def effnet(size, steps):
    import torchvision
    c = DIMS["effnet"][size]
    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0(num_classes=CLASSES, dropout=0.0,
                                               stochastic_depth_prob=0.0)
    return Workload("effnet", model, _image_batches(steps, c["batch"], c["image"]),
                    _logits_loss, sgd_momentum,
                    description=f"torchvision efficientnet_b0 {c['batch']}x3x{c['image']}x"
                                f"{c['image']}, SGD momentum")


def distilbert(size, steps):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    c = DIMS["distilbert"][size]
    torch.manual_seed(0)
    cfg = DistilBertConfig(vocab_size=c["vocab"], dim=c["d"], n_layers=c["layers"],
                           n_heads=c["heads"], hidden_dim=4 * c["d"],
                           max_position_embeddings=c["seq"], dropout=0.0,
                           attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=5)
    g = _generator()
    batches = [{"input_ids": torch.randint(0, c["vocab"], (c["batch"], c["seq"]), generator=g),
                "labels": torch.randint(0, 5, (c["batch"],), generator=g)}
               for _ in range(steps)]
    return Workload("distilbert", DistilBertForSequenceClassification(cfg), batches, _hf_loss,
                    adamw, description=f"DistilBertForSequenceClassification {c['layers']}L "
                                       f"d{c['d']} seq {c['seq']} batch {c['batch']}, AdamW")


def t5(size, steps):
    from transformers import T5Config, T5ForConditionalGeneration
    c = DIMS["t5"][size]
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=c["vocab"], d_model=c["d"], d_kv=c["d"] // c["heads"],
                   d_ff=4 * c["d"], num_layers=c["layers"], num_heads=c["heads"],
                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    g = _generator()
    batches = [{"input_ids": torch.randint(1, c["vocab"], (c["batch"], c["seq"]), generator=g),
                "labels": torch.randint(1, c["vocab"], (c["batch"], c["seq"] // 2),
                                        generator=g)} for _ in range(steps)]
    return Workload("t5", T5ForConditionalGeneration(cfg), batches, _hf_loss, adamw,
                    description=f"T5ForConditionalGeneration {c['layers']}+{c['layers']}L "
                                f"d{c['d']} seq {c['seq']} batch {c['batch']}, AdamW")


def qwen2(size, steps):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    c = DIMS["qwen2"][size]
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=c["vocab"], hidden_size=c["d"], intermediate_size=2 * c["d"],
                      num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                      num_key_value_heads=c["kv_heads"], max_position_embeddings=c["seq"],
                      tie_word_embeddings=True)
    return Workload("qwen2", Qwen2ForCausalLM(cfg),
                    _lm_batches(steps, c["batch"], c["seq"], c["vocab"]), _hf_loss, adamw,
                    tied=[("lm_head.weight", "model.embed_tokens.weight")],
                    description=f"Qwen2ForCausalLM {c['layers']}L d{c['d']} GQA "
                                f"{c['heads']}/{c['kv_heads']} tied, seq {c['seq']} batch "
                                f"{c['batch']}, AdamW")


class CausalEncoder(nn.Module):
    """A language model on `nn.TransformerEncoder`: pre-norm layers, GELU, a causal mask."""

    def __init__(self, vocab, d, layers, heads):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.head(self.enc(self.emb(x), mask=mask, is_causal=True))


def tenc(size, steps):
    c = DIMS["tenc"][size]
    torch.manual_seed(0)
    model = CausalEncoder(c["vocab"], c["d"], c["layers"], c["heads"])
    ids = _token_batches(steps, c["batch"], c["seq"] + 1, c["vocab"])
    batches = [{"x": t[:, :-1], "y": t[:, 1:]} for t in ids]
    return Workload("tenc", model, batches, _logits_loss, adamw,
                    description=f"nn.TransformerEncoder {c['layers']}L d{c['d']} pre-norm "
                                f"causal, seq {c['seq']} batch {c['batch']}, AdamW")


class GRUClassifier(nn.Module):
    """Embedding, a bidirectional 2-layer GRU, the mean of its outputs, a linear head."""

    def __init__(self, vocab, d):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, 2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * d, 5)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.head(out.mean(1))


def gru(size, steps):
    c = DIMS["gru"][size]
    torch.manual_seed(0)
    g = _generator()
    batches = [{"x": torch.randint(0, c["vocab"], (c["batch"], c["seq"]), generator=g),
                "y": torch.randint(0, 5, (c["batch"],), generator=g)} for _ in range(steps)]
    return Workload("gru", GRUClassifier(c["vocab"], c["d"]), batches, _logits_loss, adamw,
                    description=f"bidirectional GRU 2L d{c['d']} classifier, seq {c['seq']} "
                                f"batch {c['batch']}, AdamW")


class AudioEncoder(nn.Module):
    """Strided 1-D convolutions, each followed by group norm and GELU, over raw samples; the
    mean over time, a linear head."""

    def __init__(self):
        super().__init__()
        layers, c = [], 1
        for out, k, stride in [(64, 10, 5), (128, 3, 2), (128, 3, 2), (256, 3, 2), (256, 3, 2)]:
            layers += [nn.Conv1d(c, out, k, stride), nn.GroupNorm(8, out), nn.GELU()]
            c = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, CLASSES)

    def forward(self, x):
        return self.head(self.features(x.unsqueeze(1)).mean(-1))


def audio(size, steps):
    c = DIMS["audio"][size]
    torch.manual_seed(0)
    g = _generator()
    batches = [{"x": torch.randn(c["batch"], c["samples"], generator=g),
                "y": torch.randint(0, CLASSES, (c["batch"],), generator=g)}
               for _ in range(steps)]
    return Workload("audio", AudioEncoder(), batches, _logits_loss, adamw,
                    description=f"conv1d + group norm + GELU, {c['batch']} x {c['samples']} "
                                "samples, AdamW")


def _double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    """Three levels (16, 32, 64 channels), max-pool down, transposed convolutions up, skip
    concatenations, a 1x1 convolution to 4 classes per pixel."""

    def __init__(self):
        super().__init__()
        self.down1, self.down2, self.down3 = (_double_conv(3, 16), _double_conv(16, 32),
                                              _double_conv(32, 64))
        self.up2, self.conv2 = nn.ConvTranspose2d(64, 32, 2, 2), _double_conv(64, 32)
        self.up1, self.conv1 = nn.ConvTranspose2d(32, 16, 2, 2), _double_conv(32, 16)
        self.out = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        a = self.down1(x)
        b = self.down2(F.max_pool2d(a, 2))
        c = self.down3(F.max_pool2d(b, 2))
        b = self.conv2(torch.cat([self.up2(c), b], 1))
        return self.out(self.conv1(torch.cat([self.up1(b), a], 1)))


def _pixel_loss(model, batch):
    return F.cross_entropy(model(batch["x"]), batch["y"])


def unet(size, steps):
    c = DIMS["unet"][size]
    torch.manual_seed(0)
    g = _generator()
    n, s = c["batch"], c["image"]
    batches = [{"x": torch.randn(n, 3, s, s, generator=g),
                "y": torch.randint(0, 4, (n, s, s), generator=g)} for _ in range(steps)]
    return Workload("unet", UNet(), batches, _pixel_loss, adamw,
                    description=f"U-Net 16-32-64 {n}x3x{s}x{s}, per-pixel loss, AdamW")


MORE: Dict[str, object] = {
    "mobilenet": mobilenet, "effnet": effnet, "distilbert": distilbert, "t5": t5,
    "qwen2": qwen2, "tenc": tenc, "gru": gru, "audio": audio, "unet": unet}


def build(name, size="tiny", steps=5) -> Workload:
    """The workload `name` at `size` ("tiny" or "bench") with `steps` batches."""
    if name not in MORE:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MORE)}")
    return MORE[name](size, steps)
