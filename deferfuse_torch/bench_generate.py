"""Token-by-token generation with a Hugging Face GPT-2 or Llama, timed three ways: torch CPU
eager, "tpu" strict and "tpu" defer. Training steps are bench_models.py's; this is the other
half of what a user runs, and its products are matrix-vector ones (one row per sequence), so
its time goes to reading the weights, not to FLOPs. The two models cover both layouts of a
weight: GPT-2's Conv1D multiplies by W as stored (`x @ W`), Llama's nn.Linear by its transpose
(`x @ W.t()`); both end in a tied or untied `x @ W.t()` over the vocabulary.

A round is one greedy `model.generate(prompt, max_new_tokens=N, do_sample=False,
use_cache=True)`; its time over N is the round's ms per token. Each token ends in a host read
(generate's stopping check), so no mode can run far ahead. After the warm-up the runners take
rounds in turn, so load from other processes hits them alike; each column is the median over
--rounds rounds. Before each round the previous runner's threads are let go quiet and the
runner generates 2 tokens untimed (bench_settle.py says why). Every runner must produce CPU's
tokens (greedy, the same weights): a different token is reported as an error, not timed. The
defer runner also reports ops that ran on the CPU fallback per token (from fallback_counts();
0 expected).

Usage: python bench_generate.py [--model gpt2|llama] [--d 768] [--layers 2] [--vocab 4096] [--batch 1]
                                [--prompt 8] [--tokens 24] [--rounds 5] [--warmup 1]
                                [--threads 1] [--quick] [--json]"""

import argparse
import os
import sys


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2",
                    help="GPT2LMHeadModel or LlamaForCausalLM (default gpt2)")
    ap.add_argument("--d", type=int, default=768, help="model width (default 768)")
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    ap.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096)")
    ap.add_argument("--batch", type=int, default=1, help="sequences generated at once")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens (default 8)")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens per round (default 24)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads and DEFERFUSE_NUM_THREADS (default 1)")
    ap.add_argument("--quick", action="store_true", help="a tiny model (the tests' size)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = ap.parse_args(argv)
    if args.quick:
        args.d, args.layers, args.vocab, args.tokens = 32, 2, 64, 6
    return args


# The runtime reads DEFERFUSE_NUM_THREADS when it starts, so it is set before the import that
# may start it.
ARGS = parse_args(sys.argv[1:]) if __name__ == "__main__" else None
if ARGS is not None:
    os.environ["DEFERFUSE_NUM_THREADS"] = str(ARGS.threads)

import contextlib  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import deferfuse_torch  # noqa: E402
from bench_settle import settle  # noqa: E402

RUNNERS = ("cpu", "strict", "defer")


def make_model(args):
    """The model of the given size (heads of 64; Llama's MLP 8/3 as wide, rounded to 64),
    random weights from a fixed seed, in eval mode."""
    torch.manual_seed(0)
    heads = max(1, args.d // 64)
    special = dict(bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1,
                   pad_token_id=args.vocab - 1)
    if args.model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.d,
                          intermediate_size=(8 * args.d // 3 + 63) // 64 * 64,
                          num_hidden_layers=args.layers, num_attention_heads=heads,
                          num_key_value_heads=heads,
                          max_position_embeddings=args.prompt + args.tokens + 8, **special)
        return LlamaForCausalLM(cfg).eval()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=args.vocab, n_positions=args.prompt + args.tokens + 8,
                     n_embd=args.d, n_layer=args.layers, n_head=heads, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, **special)
    return GPT2LMHeadModel(cfg).eval()


class Runner:
    """One way of generating: its own copy of the model on its device, in its mode."""

    def __init__(self, label, model, prompt, args):
        self.label, self.args = label, args
        self.device = "cpu" if label == "cpu" else "tpu"
        self.mode = None if label == "cpu" else label
        self.model = copy.deepcopy(model).to(self.device)
        self.prompt = prompt.to(self.device)
        self.times, self.tokens, self.error, self.fallbacks = [], None, None, []

    def round(self, timed):
        if self.error is not None:
            return
        ctx = deferfuse_torch.mode(self.mode) if self.mode else contextlib.nullcontext()
        try:
            with ctx, torch.no_grad():
                # The previous runner's threads go quiet and this one warms up first (see
                # bench_settle): a short untimed generate.
                settle()
                self._generate(2).cpu()
                before = deferfuse_torch.fallback_counts() if self.mode else {}
                t0 = time.perf_counter()
                tokens = self._generate(self.args.tokens).cpu()
                dt = (time.perf_counter() - t0) / self.args.tokens
                after = deferfuse_torch.fallback_counts() if self.mode else {}
        except Exception as e:  # reported in the table; the other runners go on
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            return
        self.tokens = tokens
        if timed:
            self.times.append(dt)
            self.fallbacks.append(sum(after.values()) - sum(before.values()))

    def _generate(self, n):
        """Exactly n greedy tokens after the prompt (min_new_tokens: the end-of-text token must
        not stop a round early, or its time over n would understate ms per token)."""
        return self.model.generate(self.prompt, max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, use_cache=True,
                                   attention_mask=torch.ones_like(self.prompt),
                                   pad_token_id=self.args.vocab - 1)

    def median_ms(self):
        return statistics.median(self.times) * 1e3 if self.times and not self.error else None


def bench(args):
    """Runs every runner's rounds in turn; returns {"ms": {runner: ms per token or None},
    "errors": {runner: message}, "fallbacks_per_token": defer's, "config": ...}."""
    torch.set_num_threads(args.threads)
    model = make_model(args)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab - 1, (args.batch, args.prompt), generator=g)
    runners = [Runner(label, model, prompt, args) for label in RUNNERS]
    for r in range(args.warmup + args.rounds):
        for runner in runners:
            runner.round(timed=r >= args.warmup)
    cpu = runners[0]
    for runner in runners[1:]:
        if runner.error is None and cpu.tokens is not None \
                and not torch.equal(runner.tokens, cpu.tokens):
            runner.error = "generated tokens differ from CPU's"
    defer = runners[-1]
    fallbacks = statistics.median(defer.fallbacks) / args.tokens if defer.fallbacks else None
    return {
        "config": {k: getattr(args, k) for k in ("model", "d", "layers", "vocab", "batch", "prompt",
                                                 "tokens", "threads")},
        "ms": {r.label: r.median_ms() for r in runners},
        "errors": {r.label: r.error for r in runners if r.error},
        "fallbacks_per_token": fallbacks,
    }


def print_table(res):
    c, ms = res["config"], res["ms"]
    name = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[c["model"]]
    print(f"{name} {c['layers']}L d{c['d']} vocab {c['vocab']}, batch {c['batch']}, "
          f"{c['prompt']} prompt + {c['tokens']} new tokens (greedy, use_cache), "
          f"{c['threads']} thread(s); ms per token, median")
    print("| cpu | strict | defer | cpu/str | cpu/def | str/def | fallbacks/token |")
    print("| --- | --- | --- | --- | --- | --- | --- |")

    def cell(v):
        return f"{v:.2f}" if v is not None else "-"

    def ratio(a, b):
        return f"{ms[a] / ms[b]:.2f}" if ms[a] and ms[b] else "-"

    fb = res["fallbacks_per_token"]
    print(f"| {cell(ms['cpu'])} | {cell(ms['strict'])} | {cell(ms['defer'])} | "
          f"{ratio('cpu', 'strict')} | {ratio('cpu', 'defer')} | {ratio('strict', 'defer')} | "
          f"{cell(fb) if fb is not None else '-'} |")
    for label, err in res["errors"].items():
        print(f"{label}: {err}")


def main(args):
    res = bench(args)
    if args.json:
        print(json.dumps(res))
    else:
        print_table(res)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
