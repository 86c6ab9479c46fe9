"""Printing a tpu tensor gives CPU's text (with the device suffix) and runs no op on the CPU
fallback: str/repr use masked_select, abs, bitwise ops and reductions, all native now."""

import pytest
import torch

import deferfuse_torch


@pytest.mark.parametrize("values", [
    torch.randn(3, 4),
    torch.tensor([1, 2, 3]),
    torch.tensor([1.5, float("nan"), float("inf"), -float("inf")]),
    torch.tensor([True, False]),
    torch.randn(200, 300),  # summarized with "..."
])
def test_print_matches_cpu_without_fallback(mode, values):
    deferfuse_torch.reset_fallback_counts()
    got = repr(values.to("tpu"))
    want = repr(values)[:-1] + ", device='tpu:0')"
    # The suffix may wrap onto its own line; the numbers and their layout are what must match.
    assert got.split() == want.split()
    assert deferfuse_torch.fallback_counts() == {}
