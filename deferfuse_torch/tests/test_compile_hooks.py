"""The torch.compile registrations are made lazily (deferfuse_torch/compile_hooks.py): in a
fresh process, as a user would meet them."""

import os
import subprocess
import sys

SCRIPT = """
import sys, torch, deferfuse_torch
# Importing the package must not pay for Dynamo.
assert "torch._dynamo" not in sys.modules and "torch._inductor" not in sys.modules
# torch.compile imports torch._inductor, which imports torch._dynamo halfway through: the
# registrations must cope with that order.
f = torch.compile(lambda x: x * 2, backend="tpu")
print(f(torch.ones(2).to("tpu")).cpu().tolist())
try:
    torch.compile(lambda x: x + 1)(torch.ones(2).to("tpu"))
except Exception as e:
    print("plain:", "backend=\\"tpu\\"" in str(e))
"""


def test_a_fresh_process_gets_the_backend_and_the_refusal_without_importing_dynamo_first():
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-2:] == ["[2.0, 2.0]", "plain: True"], out.stdout
