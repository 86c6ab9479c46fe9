"""The model zoo: real model families, built from small configs with seeded random weights
(nothing is downloaded), each with its batches, loss, optimizer and training step.

One definition serves two readers: `test_model_zoo.py` (tiny sizes, tpu against CPU) and
`bench_models.py` (timing). A `Workload` is everything a runner needs to train the model on
any device from the same initial weights: deep-copy `workload.model`, move it, make the
optimizer with `workload.make_opt`, and call `train_step` on `to_device`'d batches.

Sizes: "tiny" (the tests and `bench_models.py --quick`: 2 layers, width 32, seq 16) and "bench"
(`bench_models.py`'s default; the nanoGPT there is the issue's 4 layers, d 128, seq 64,
batch 16)."""

import math
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: nothing may be fetched

SIZES = ("tiny", "bench")

# Per model, the parameter names that are one Parameter (tied embeddings).
TIES = {
    "gpt2": [("lm_head.weight", "transformer.wte.weight")],
    "bert": [("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
             ("cls.predictions.decoder.bias", "cls.predictions.bias")],
    "nanogpt": [("lm_head.weight", "wte.weight")],
    "nanogpt_masked": [("lm_head.weight", "wte.weight")],
    "lstm": [("head.weight", "emb.weight")],
}


@dataclass
class Workload:
    name: str
    model: nn.Module  # on CPU, initial weights; runners deep-copy it
    batches: List[Dict[str, torch.Tensor]]  # CPU tensors; one per training step
    loss: Callable[[nn.Module, Dict[str, torch.Tensor]], torch.Tensor]
    make_opt: Callable[[object], torch.optim.Optimizer]
    clip: Optional[float] = None  # clip_grad_norm_ max norm, applied before the step
    # Parameter names that must be one Parameter (tied embeddings): a copy that unties them
    # trains two matrices where CPU trains one.
    tied: List[Tuple[str, str]] = field(default_factory=list)
    description: str = ""


def to_device(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


def train_step(w: Workload, model, opt, batch, autocast=None):
    """One step: forward and loss, backward, optional clipping, optimizer step. Returns the
    loss tensor (not synchronized: the caller decides when to read it). With `autocast` (a
    (device, dtype) pair) the forward and loss run under torch.autocast, as its docs advise:
    backward and the optimizer step outside it."""
    opt.zero_grad()
    if autocast is None:
        loss = w.loss(model, batch)
    else:
        with torch.autocast(autocast[0], dtype=autocast[1]):
            loss = w.loss(model, batch)
    loss.backward()
    if w.clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), w.clip)
    opt.step()
    return loss


def untied(model, pairs):
    """The pairs of `pairs` that are not one Parameter object in `model`."""
    return [(a, b) for a, b in pairs if model.get_parameter(a) is not model.get_parameter(b)]


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def sgd_momentum(params):
    # A small lr: resnet18 with batch norm over few values per channel is chaotic on random
    # data. On CPU alone, perturbing the initial weights by 1e-7 relative moves its 5 losses by
    # 19% at lr 0.05 and batch 4, 0.4% at lr 5e-3 and batch 8, 5e-6 at lr 1e-3 and batch 8;
    # a comparison against CPU needs the last.
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, weight_decay=5e-4)


def _hf_loss(model, batch):
    return model(**batch).loss


def _logits_loss(model, batch):
    logits = model(batch["x"])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["y"].reshape(-1))


def _generator():
    return torch.Generator().manual_seed(1)


def _token_batches(steps, batch, seq, vocab):
    g = _generator()
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(steps)]


def _lm_batches(steps, batch, seq, vocab):
    """Causal LM batches: the model shifts the labels itself."""
    return [{"input_ids": ids, "labels": ids} for ids in _token_batches(steps, batch, seq, vocab)]


# Per model and size: the config's dimensions, batch and sequence (or image) size.
DIMS = {
    "gpt2": {"tiny": dict(d=32, layers=2, heads=2, vocab=64, seq=16, batch=2),
             "bench": dict(d=128, layers=4, heads=4, vocab=256, seq=64, batch=16)},
    "llama": {"tiny": dict(d=32, layers=2, heads=4, kv_heads=2, vocab=64, seq=16, batch=2),
              "bench": dict(d=128, layers=4, heads=4, kv_heads=2, vocab=256, seq=64, batch=16)},
    "bert": {"tiny": dict(d=32, layers=2, heads=2, vocab=64, seq=16, batch=2),
             "bench": dict(d=128, layers=4, heads=4, vocab=256, seq=64, batch=16)},
    "vit": {"tiny": dict(d=32, layers=2, heads=2, image=32, patch=8, batch=2),
            "bench": dict(d=128, layers=4, heads=4, image=32, patch=4, batch=16)},
    "resnet18": {"tiny": dict(image=32, batch=8), "bench": dict(image=64, batch=8)},
    "nanogpt": {"tiny": dict(d=32, layers=2, heads=2, vocab=64, seq=16, batch=2),
                "bench": dict(d=128, layers=4, heads=4, vocab=65, seq=64, batch=16)},
    "lstm": {"tiny": dict(d=32, layers=2, vocab=64, seq=16, batch=2),
             "bench": dict(d=128, layers=2, vocab=256, seq=64, batch=16)},
    "mlp": {"tiny": dict(sizes=(784, 1024, 1024, 10), batch=64),
            "bench": dict(sizes=(784, 1024, 1024, 10), batch=64)},
    "mlp_small": {"tiny": dict(sizes=(784, 256, 256, 10), batch=64),
                  "bench": dict(sizes=(784, 256, 256, 10), batch=64)},
}


def gpt2(size, steps, dropout=0.0):
    from transformers import GPT2Config, GPT2LMHeadModel
    c = DIMS["gpt2"][size]
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=c["vocab"], n_positions=c["seq"], n_embd=c["d"],
                     n_layer=c["layers"], n_head=c["heads"], resid_pdrop=dropout,
                     embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=c["vocab"] - 1,
                     eos_token_id=c["vocab"] - 1, pad_token_id=c["vocab"] - 1)
    return Workload("gpt2", GPT2LMHeadModel(cfg),
                    _lm_batches(steps, c["batch"], c["seq"], c["vocab"]), _hf_loss, adamw,
                    tied=TIES["gpt2"],
                    description=f"GPT2LMHeadModel {c['layers']}L d{c['d']} seq {c['seq']} "
                                f"batch {c['batch']}, AdamW")


def llama(size, steps, dropout=0.0):
    from transformers import LlamaConfig, LlamaForCausalLM
    c = DIMS["llama"][size]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["d"], intermediate_size=2 * c["d"],
                      num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                      num_key_value_heads=c["kv_heads"], max_position_embeddings=c["seq"],
                      attention_dropout=dropout, bos_token_id=0, eos_token_id=c["vocab"] - 1,
                      pad_token_id=c["vocab"] - 1)
    return Workload("llama", LlamaForCausalLM(cfg),
                    _lm_batches(steps, c["batch"], c["seq"], c["vocab"]), _hf_loss, adamw,
                    description=f"LlamaForCausalLM {c['layers']}L d{c['d']} GQA "
                                f"{c['heads']}/{c['kv_heads']} seq {c['seq']} "
                                f"batch {c['batch']}, AdamW")


def bert(size, steps, dropout=0.0):
    """Masked LM: 15% of the positions are replaced by a mask token and scored; the rest carry
    label -100 (cross-entropy's ignore_index)."""
    from transformers import BertConfig, BertForMaskedLM
    c = DIMS["bert"][size]
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=c["vocab"], hidden_size=c["d"], num_hidden_layers=c["layers"],
                     num_attention_heads=c["heads"], intermediate_size=2 * c["d"],
                     max_position_embeddings=c["seq"], hidden_dropout_prob=dropout,
                     attention_probs_dropout_prob=dropout, pad_token_id=0)
    g = _generator()
    mask_token = c["vocab"] - 1
    batches = []
    for ids in _token_batches(steps, c["batch"], c["seq"], c["vocab"] - 1):
        masked = torch.rand(ids.shape, generator=g) < 0.15
        masked[:, 0] = True  # every row scores at least one position
        batches.append({"input_ids": torch.where(masked, mask_token, ids),
                        "attention_mask": torch.ones_like(ids),
                        "token_type_ids": torch.zeros_like(ids),
                        "labels": torch.where(masked, ids, -100)})
    return Workload("bert", BertForMaskedLM(cfg), batches, _hf_loss, adamw,
                    tied=TIES["bert"],
                    description=f"BertForMaskedLM {c['layers']}L d{c['d']} seq {c['seq']} "
                                f"batch {c['batch']}, AdamW")


def vit(size, steps, dropout=0.0):
    from transformers import ViTConfig, ViTForImageClassification
    c = DIMS["vit"][size]
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=c["image"], patch_size=c["patch"], num_channels=3,
                    hidden_size=c["d"], num_hidden_layers=c["layers"],
                    num_attention_heads=c["heads"], intermediate_size=2 * c["d"],
                    hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                    num_labels=10)
    g = _generator()
    batches = [{"pixel_values": torch.randn(c["batch"], 3, c["image"], c["image"], generator=g),
                "labels": torch.randint(0, 10, (c["batch"],), generator=g)}
               for _ in range(steps)]
    return Workload("vit", ViTForImageClassification(cfg), batches, _hf_loss, adamw,
                    description=f"ViTForImageClassification {c['layers']}L d{c['d']} image "
                                f"{c['image']} patch {c['patch']} batch {c['batch']}, AdamW")


def resnet18(size, steps, dropout=0.0):
    """torchvision's resnet18 in training mode (batch norm uses and updates batch statistics);
    it has no dropout."""
    import torchvision
    c = DIMS["resnet18"][size]
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    g = _generator()
    batches = [{"x": torch.randn(c["batch"], 3, c["image"], c["image"], generator=g),
                "y": torch.randint(0, 10, (c["batch"],), generator=g)} for _ in range(steps)]
    return Workload("resnet18", model, batches, _logits_loss, sgd_momentum,
                    description=f"torchvision resnet18 {c['batch']}x3x{c['image']}x{c['image']}"
                                ", SGD momentum")


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: one qkv projection, heads split, causal softmax attention either
    through F.scaled_dot_product_attention (nanoGPT's "flash" path) or written out with a
    lower-triangular mask buffer (its fallback path)."""

    def __init__(self, d, heads, seq, dropout, use_sdpa):
        super().__init__()
        self.heads, self.dropout, self.use_sdpa = heads, dropout, use_sdpa
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.attn_dropout, self.resid_dropout = nn.Dropout(dropout), nn.Dropout(dropout)
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            att = att.masked_fill(self.causal[:, :, :t, :t] == 0, float("-inf"))
            y = self.attn_dropout(F.softmax(att, dim=-1)) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d)))


class NanoGPTBlock(nn.Module):
    def __init__(self, d, heads, seq, dropout, use_sdpa):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, seq, dropout, use_sdpa)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """Karpathy's nanoGPT, from scratch: token + position embeddings, pre-norm blocks, a final
    LayerNorm and a bias-free head whose weight is the token embedding's (weight tying)."""

    def __init__(self, vocab, seq, d, layers, heads, dropout=0.0, use_sdpa=True):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(NanoGPTBlock(d, heads, seq, dropout, use_sdpa)
                               for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _nanogpt(name, use_sdpa, size, steps, dropout):
    c = DIMS["nanogpt"][size]
    torch.manual_seed(0)
    model = NanoGPT(c["vocab"], c["seq"], c["d"], c["layers"], c["heads"], dropout, use_sdpa)
    g = _generator()
    batches = []
    for _ in range(steps):
        ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), generator=g)
        batches.append({"x": ids[:, :-1], "y": ids[:, 1:]})
    return Workload(name, model, batches, _logits_loss,
                    lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1),
                    clip=1.0, tied=TIES[name],
                    description=f"nanoGPT {c['layers']}L d{c['d']} seq {c['seq']} batch "
                                f"{c['batch']} ({'sdpa' if use_sdpa else 'masked softmax'}), "
                                "AdamW + clip_grad_norm_")


def nanogpt(size, steps, dropout=0.0):
    return _nanogpt("nanogpt", True, size, steps, dropout)


def nanogpt_masked(size, steps, dropout=0.0):
    return _nanogpt("nanogpt_masked", False, size, steps, dropout)


class LSTMLanguageModel(nn.Module):
    """PyTorch's word_language_model example: embedding, a stacked nn.LSTM with dropout
    between its layers, a linear decoder tied to the embedding."""

    def __init__(self, vocab, d, layers, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, layers, dropout=dropout, batch_first=True)
        self.head = nn.Linear(d, vocab)
        self.head.weight = self.emb.weight
        # The example's initialisation: N(0, 1) embeddings tied to the decoder give logits
        # hundreds wide.
        nn.init.uniform_(self.emb.weight, -0.1, 0.1)
        nn.init.zeros_(self.head.bias)

    def forward(self, idx):
        out, _ = self.rnn(self.drop(self.emb(idx)))
        return self.head(self.drop(out))


def lstm(size, steps, dropout=0.0):
    c = DIMS["lstm"][size]
    torch.manual_seed(0)
    model = LSTMLanguageModel(c["vocab"], c["d"], c["layers"], dropout)
    ids = _token_batches(steps, c["batch"], c["seq"] + 1, c["vocab"])
    batches = [{"x": t[:, :-1], "y": t[:, 1:]} for t in ids]
    return Workload("lstm", model, batches, _logits_loss, adamw, clip=0.25, tied=TIES["lstm"],
                    description=f"LSTM LM {c['layers']}L d{c['d']} seq {c['seq']} batch "
                                f"{c['batch']}, tied decoder, AdamW + clip_grad_norm_")


def _mlp(name, size, steps):
    c = DIMS[name][size]
    torch.manual_seed(0)
    sizes, layers = c["sizes"], []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    g = _generator()
    batches = [{"x": torch.randn(c["batch"], sizes[0], generator=g),
                "y": torch.randint(0, sizes[-1], (c["batch"],), generator=g)}
               for _ in range(steps)]
    return Workload(name, nn.Sequential(*layers), batches, _logits_loss, adamw,
                    description=f"mlp {'-'.join(map(str, sizes))} batch {c['batch']}, AdamW")


def mlp(size, steps, dropout=0.0):
    return _mlp("mlp", size, steps)


def mlp_small(size, steps, dropout=0.0):
    return _mlp("mlp_small", size, steps)


# The zoo of real model families (the tests' list); the bench adds the MLPs.
ZOO = {"gpt2": gpt2, "llama": llama, "bert": bert, "vit": vit, "resnet18": resnet18,
       "nanogpt": nanogpt, "nanogpt_masked": nanogpt_masked, "lstm": lstm}
ALL = dict(ZOO, mlp=mlp, mlp_small=mlp_small)


def build(name, size="tiny", steps=5, dropout=0.0) -> Workload:
    """The workload `name` at `size` with `steps` batches; dropout probabilities `dropout`
    (0 for comparisons against CPU: the tpu's random stream is not CPU's)."""
    if name not in ALL:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(ALL)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    return ALL[name](size, steps, dropout)
