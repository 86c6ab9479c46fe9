"""Hugging Face architectures beside the zoo's (`model_zoo.py`, `model_zoo_more.py`), built
tiny from their configs with random weights: each brings its family's variant of the same
layers (ALiBi, multi-query and grouped-query attention, partial rotary embeddings, local
attention windows, factorized embeddings, shifted windows, patch unfolding, grouped
convolutions, batch and layer norm over images), so a change tuned to the zoo shows here
whether it holds for models nobody tuned it for. `test_hf_architectures.py` trains their
tiny sizes against CPU; `bench_models.py --hf` times their bench sizes beside the zoo.

Every model is built with dropout 0 (the tpu's random stream is not CPU's); the workloads
have `model_zoo.Workload`'s form."""
import torch

from model_zoo import Workload, _generator, _hf_loss, _token_batches, adamw

# Per size: width D (heads and channels scale with it), vocabulary, sequence, batch, image side.
SIZES = {"tiny": dict(D=32, VOCAB=64, SEQ=16, BATCH=2, IMAGE=32),
         "bench": dict(D=128, VOCAB=512, SEQ=64, BATCH=8, IMAGE=64)}
CLASSES = 10


def _lm(config_cls, model_cls, z, **dims):
    """A language model trained on random tokens as its own labels (causal models shift them;
    masked ones score every position)."""
    def build(steps):
        torch.manual_seed(0)
        model = model_cls(config_cls(vocab_size=z["VOCAB"], **dims))
        batches = [{"input_ids": ids, "labels": ids}
                   for ids in _token_batches(steps, z["BATCH"], z["SEQ"], z["VOCAB"])]
        return model, batches
    return build


def _vision(config_cls, model_cls, z, **dims):
    """An image classifier on random images and labels."""
    def build(steps):
        torch.manual_seed(0)
        model = model_cls(config_cls(num_labels=CLASSES, **dims))
        g = _generator()
        side = z["IMAGE"]
        batches = [{"pixel_values": torch.randn(z["BATCH"], 3, side, side, generator=g),
                    "labels": torch.randint(0, CLASSES, (z["BATCH"],), generator=g)}
                   for _ in range(steps)]
        return model, batches
    return build


def _builders(size):
    """Per model name, a function of the step count that builds its model and batches at
    `size` (only the one called is built; transformers is imported on first use)."""
    import transformers as T
    z = SIZES[size]
    D, SEQ, IMAGE = z["D"], z["SEQ"], z["IMAGE"]
    H = max(2, D // 32)  # heads of 32 lanes at the bench size, as the zoo has
    no_drop = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    encoder = dict(hidden_size=D, num_hidden_layers=2, num_attention_heads=H,
                   intermediate_size=2 * D, max_position_embeddings=SEQ + 2, **no_drop)
    return {
        # Masked LMs: learned positions, post-norm; ALBERT and ELECTRA factorize the embedding.
        "roberta": _lm(T.RobertaConfig, T.RobertaForMaskedLM, z, **encoder),
        "albert": _lm(T.AlbertConfig, T.AlbertForMaskedLM, z, embedding_size=16, **encoder),
        "electra": _lm(T.ElectraConfig, T.ElectraForMaskedLM, z, embedding_size=16, **encoder),
        # Causal LMs: local attention windows (GPT-Neo), learned positions with an offset
        # (OPT), sliding-window GQA with rotary embeddings (Mistral), partial rotary and a
        # parallel block (Phi), ALiBi (BLOOM), multi-query attention (GPT-BigCode), BART's
        # decoder.
        "gpt_neo": _lm(T.GPTNeoConfig, T.GPTNeoForCausalLM, z, hidden_size=D, num_layers=2,
                       num_heads=H, attention_types=[[["global", "local"], 1]], window_size=8,
                       max_position_embeddings=SEQ, embed_dropout=0.0, attention_dropout=0.0,
                       resid_dropout=0.0),
        "opt": _lm(T.OPTConfig, T.OPTForCausalLM, z, hidden_size=D, num_hidden_layers=2,
                   num_attention_heads=H, ffn_dim=2 * D, word_embed_proj_dim=D,
                   max_position_embeddings=SEQ, dropout=0.0, attention_dropout=0.0),
        "mistral": _lm(T.MistralConfig, T.MistralForCausalLM, z, hidden_size=D,
                       num_hidden_layers=2, num_attention_heads=2 * H, num_key_value_heads=H,
                       intermediate_size=2 * D, max_position_embeddings=SEQ, sliding_window=8),
        "phi": _lm(T.PhiConfig, T.PhiForCausalLM, z, hidden_size=D, num_hidden_layers=2,
                   num_attention_heads=H, intermediate_size=2 * D, max_position_embeddings=SEQ,
                   resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
        "bloom": _lm(T.BloomConfig, T.BloomForCausalLM, z, hidden_size=D, n_layer=2, n_head=H,
                     hidden_dropout=0.0, attention_dropout=0.0),
        "bigcode": _lm(T.GPTBigCodeConfig, T.GPTBigCodeForCausalLM, z, n_embd=D, n_layer=2,
                       n_head=H, n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0,
                       attn_pdrop=0.0),
        "bart": _lm(T.BartConfig, T.BartForCausalLM, z, d_model=D, decoder_layers=2,
                    decoder_attention_heads=H, decoder_ffn_dim=2 * D,
                    max_position_embeddings=SEQ, dropout=0.0, attention_dropout=0.0,
                    activation_dropout=0.0),
        # Vision: patch embeddings and a plain ViT (DeiT), shifted windows with relative
        # position bias (Swin), depthwise 7x7 convolutions with layer norm (ConvNeXt), grouped
        # convolutions with batch norm (RegNet), convolutions unfolded into transformer patches
        # (MobileViT).
        "deit": _vision(T.DeiTConfig, T.DeiTForImageClassification, z, image_size=IMAGE,
                        patch_size=8, **encoder),
        "swin": _vision(T.SwinConfig, T.SwinForImageClassification, z, image_size=IMAGE,
                        patch_size=4, embed_dim=D // 2, depths=[1, 1], num_heads=[1, 2],
                        window_size=2, drop_path_rate=0.0, **no_drop),
        "convnext": _vision(T.ConvNextConfig, T.ConvNextForImageClassification, z,
                            hidden_sizes=[D // 2, D], depths=[1, 1], num_stages=2),
        "regnet": _vision(T.RegNetConfig, T.RegNetForImageClassification, z,
                          hidden_sizes=[D // 2, D], depths=[1, 1], groups_width=8,
                          embedding_size=D // 2),
        "mobilevit": _vision(T.MobileViTConfig, T.MobileViTForImageClassification, z,
                             image_size=IMAGE, hidden_sizes=[D // 2, 3 * D // 4, D],
                             neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 2 * D], **no_drop,
                             classifier_dropout_prob=0.0),
    }


NAMES = ["roberta", "albert", "electra", "gpt_neo", "opt", "mistral", "phi", "bloom", "bigcode",
         "bart", "deit", "swin", "convnext", "regnet", "mobilevit"]


def build(name, size="tiny", steps=5) -> Workload:
    """The workload `name` at `size` ("tiny" or "bench") with `steps` batches, trained with
    AdamW (the tests switch to SGD with momentum: see `test_model_zoo_more.py`)."""
    if name not in NAMES:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(NAMES)}")
    model, batches = _builders(size)[name](steps)
    model.train()
    z = SIZES[size]
    shape = (f"seq {z['SEQ']}" if "input_ids" in batches[0]
             else f"{z['IMAGE']}x{z['IMAGE']} images")
    what = (f"{type(model).__name__} d {z['D']}, {shape}, batch {z['BATCH']}, AdamW")
    return Workload(name, model, batches, _hf_loss, adamw, description=what)
