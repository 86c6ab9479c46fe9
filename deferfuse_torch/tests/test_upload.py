"""Host -> device copies: `.to("tpu")` of a CPU tensor gives its values and strides, as a CPU
clone would; the uploaded buffer becomes the new tensor's own (no device copy), while a tensor
Python already holds is written in place (its data_ptr() and its views stay, as on CPU)."""
import pytest
import torch

import deferfuse_torch

SOURCES = {
    "float": lambda: torch.randn(37, 5),
    "int64": lambda: torch.randint(-9, 9, (4, 6, 3)),
    "bool": lambda: torch.randn(50) > 0,
    "column_major": lambda: torch.randn(6, 9).t(),
    "nonzero": lambda: torch.nonzero(torch.randn(16, 16) > 0.3),
    "strided_slice": lambda: torch.arange(40.0)[::3],
    "expanded": lambda: torch.randn(3, 1).expand(3, 4),
    "zero_dim": lambda: torch.tensor(2.5),
    "empty": lambda: torch.empty(0, 3),
}


@pytest.mark.parametrize("name", list(SOURCES))
def test_to_tpu_gives_the_values_and_strides_of_a_cpu_clone(mode, name):
    x = SOURCES[name]()
    t = x.to("tpu")
    assert t.stride() == x.clone().stride()
    assert torch.equal(t.cpu(), x)


def test_to_tpu_with_a_dtype_converts_on_the_host(mode):
    x = torch.randn(5, 7).t()
    t = x.to("tpu", torch.float64)
    assert t.dtype == torch.float64 and t.stride() == x.double().stride()
    assert torch.equal(t.cpu(), x.double())


@pytest.mark.parametrize("name", ["float", "column_major", "nonzero"])
def test_to_tpu_records_no_device_op(name):
    x = SOURCES[name]()
    before = deferfuse_torch.stats()["ops_recorded"]
    t = x.to("tpu")
    assert deferfuse_torch.stats()["ops_recorded"] == before
    assert torch.equal(t.cpu(), x)


def test_copy_into_a_tensor_python_holds_keeps_its_data_ptr_and_views(mode):
    t = torch.zeros(8, device="tpu")
    view, ptr = t[2:5], t.data_ptr()
    t.copy_(torch.arange(8.0))
    assert t.data_ptr() == ptr
    assert torch.equal(view.cpu(), torch.arange(2.0, 5.0))
