import pytest
import torch

from stratagem.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator


@pytest.mark.parametrize(
    ("devices", "count"),
    [(1, 1), (2, 2), ("2", 2), ("auto", 1), ([0, 1], 2), ("0,1", 2), ("[0, 1, 2]", 3)],
)
def test_cpu_accepts_every_documented_devices_form(devices, count):
    parsed = CPUAccelerator().parse_devices(devices)
    assert len(parsed) == count
    assert all(device == torch.device("cpu") for device in parsed)


def test_cpu_minus_one_means_every_core():
    assert len(CPUAccelerator().parse_devices(-1)) == 1


@pytest.mark.parametrize("devices", [0, -2, "x", "1,a", [], [0, 0], True, 1.5, None])
def test_invalid_devices_error_names_the_value_and_what_is_accepted(devices):
    with pytest.raises((ValueError, TypeError), match=r"devices="):
        CPUAccelerator().parse_devices(devices)


def test_gpu_accelerators_on_a_cpu_build_say_why_they_are_unavailable():
    if not CUDAAccelerator.is_available():
        assert CUDAAccelerator.unavailable_reason()
    if not MPSAccelerator.is_available():
        assert "MPS" in MPSAccelerator.unavailable_reason()


def test_requesting_more_cuda_devices_than_exist_names_the_count(monkeypatch):
    monkeypatch.setattr(CUDAAccelerator, "device_count", staticmethod(lambda: 1))
    with pytest.raises(ValueError, match="this machine has 1"):
        CUDAAccelerator().parse_devices(2)
    with pytest.raises(ValueError, match=r"names cuda device\(s\) \[3\]"):
        CUDAAccelerator().parse_devices([3])


def test_cpu_autocast_support_is_probed_not_assumed():
    accelerator = CPUAccelerator()
    assert accelerator.supports_autocast(torch.bfloat16)
    assert accelerator.needs_grad_scaler(torch.float16)
    assert not accelerator.needs_grad_scaler(torch.bfloat16)
