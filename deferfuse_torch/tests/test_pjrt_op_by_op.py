"""Training op by op on the PJRT backend (strict and debug mode: one XLA program per op) gives
CPU's losses and parameters. The first Linear reads `W.t()`, which the device copy of W cannot
serve, so every step uploads it afresh while AdamW updates W on the device; XLA's CPU plugin
used to multiply by the previous step's weight whenever that upload reused the previous one's
address (runtime/src/backend/pjrt/options.rs). Skipped unless DEFERFUSE_PJRT_PLUGIN names the
plugin."""

import os

import pytest

from test_pjrt_whole_flush import LOSS_ATOL, LOSS_RTOL, PLUGIN, run_steps

pytestmark = pytest.mark.skipif(not os.path.isfile(PLUGIN), reason="DEFERFUSE_PJRT_PLUGIN is not set "
                                "(pip install xla-cpu-pjrt)")

# Enough steps that the unfixed backend went wrong in every run tried (from step 2 to 9).
STEPS = 12
# Relative to each parameter's largest magnitude (see pjrt_steps.py). A correct run ends within
# 3e-4 of CPU (AdamW's normalised step turns the rounding of near-zero gradients into steps of
# up to its learning rate); one step with a stale weight left 1e-2 or more, even where the
# losses stayed within their tolerance.
PARAM_RTOL = 2e-3


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_training_the_mlp_op_by_op_gives_cpu_losses_and_parameters(mode):
    r = run_steps("mlp_small", steps=STEPS, mode=mode)
    assert r["fallbacks"] == {}
    for k, (got, want) in enumerate(zip(r["losses"], r["cpu"])):
        assert abs(got - want) <= LOSS_ATOL + LOSS_RTOL * abs(want), (mode, k, got, want)
    assert max(r["param_errors"]) <= PARAM_RTOL, (mode, r["param_errors"])
