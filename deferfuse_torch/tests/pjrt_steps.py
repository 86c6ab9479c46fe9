"""Trains a zoo model on the tpu device (in defer mode unless told otherwise) and prints, as
JSON, its losses, CPU's, per step the XLA programs run and compiled, and how far each trained
parameter is from CPU's. Run it as a script in a fresh process (the device's runtime reads
DEFERFUSE_BACKEND once, when it starts): test_pjrt_whole_flush.py and
test_pjrt_parameter_updates.py run it with DEFERFUSE_BACKEND=pjrt.

usage: pjrt_steps.py MODEL [STEPS [MODE]]   (MODE: defer, strict or debug)"""

import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deferfuse_torch  # noqa: E402
import model_zoo  # noqa: E402


def main(name, steps, mode="defer"):
    torch.set_num_threads(1)
    w = model_zoo.build(name, "tiny", steps)
    cpu_model = copy.deepcopy(w.model)
    cpu_opt = w.make_opt(cpu_model.parameters())
    cpu = [model_zoo.train_step(w, cpu_model, cpu_opt, b).item() for b in w.batches]
    model = copy.deepcopy(w.model).to("tpu")
    opt = w.make_opt(model.parameters())
    batches = [model_zoo.to_device(b, "tpu") for b in w.batches]
    losses, programs, compiled = [], [], []
    with deferfuse_torch.mode(mode):
        for b in batches:
            s0 = deferfuse_torch.stats()
            losses.append(model_zoo.train_step(w, model, opt, b).item())
            deferfuse_torch.synchronize()
            s1 = deferfuse_torch.stats()
            programs.append(s1["programs_run"] - s0["programs_run"])
            compiled.append(s1["programs_compiled"] - s0["programs_compiled"])
    # Per parameter: the largest difference from CPU's, relative to CPU's largest magnitude.
    param_errors = [((p.cpu() - q).abs().max() / (q.abs().max() + 1e-12)).item()
                    for p, q in zip(model.parameters(), cpu_model.parameters())]
    print(json.dumps({
        "losses": losses, "cpu": cpu, "programs": programs, "compiled": compiled,
        "param_errors": param_errors,
        "total_compiled": deferfuse_torch.stats()["programs_compiled"],
        "fallbacks": deferfuse_torch.fallback_counts(),
    }))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4,
         sys.argv[3] if len(sys.argv) > 3 else "defer")
