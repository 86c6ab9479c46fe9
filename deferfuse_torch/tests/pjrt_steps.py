"""Trains a zoo model on the tpu device in defer mode and prints, as JSON, its losses, CPU's,
and per step the XLA programs run and compiled. Run it as a script in a fresh process (the
device's runtime reads DEFERFUSE_BACKEND once, when it starts): test_pjrt_whole_flush.py runs
it with DEFERFUSE_BACKEND=pjrt.

usage: pjrt_steps.py MODEL [STEPS]"""

import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deferfuse_torch  # noqa: E402
import model_zoo  # noqa: E402


def main(name, steps):
    torch.set_num_threads(1)
    w = model_zoo.build(name, "tiny", steps)
    cpu_model = copy.deepcopy(w.model)
    cpu_opt = w.make_opt(cpu_model.parameters())
    cpu = [model_zoo.train_step(w, cpu_model, cpu_opt, b).item() for b in w.batches]
    model = copy.deepcopy(w.model).to("tpu")
    opt = w.make_opt(model.parameters())
    batches = [model_zoo.to_device(b, "tpu") for b in w.batches]
    losses, programs, compiled = [], [], []
    with deferfuse_torch.mode("defer"):
        for b in batches:
            s0 = deferfuse_torch.stats()
            losses.append(model_zoo.train_step(w, model, opt, b).item())
            deferfuse_torch.synchronize()
            s1 = deferfuse_torch.stats()
            programs.append(s1["programs_run"] - s0["programs_run"])
            compiled.append(s1["programs_compiled"] - s0["programs_compiled"])
    print(json.dumps({
        "losses": losses, "cpu": cpu, "programs": programs, "compiled": compiled,
        "total_compiled": deferfuse_torch.stats()["programs_compiled"],
        "fallbacks": deferfuse_torch.fallback_counts(),
    }))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)
