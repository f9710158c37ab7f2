import warnings

import pytest
import torch

from stratagem.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator, cpu


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


def test_more_cpu_processes_than_the_memory_holds_are_refused_naming_devices():
    with pytest.raises(
        ValueError, match=r"devices=1000000 asks for 1000000 CPU processes, each needing at least 200 MiB"
    ):
        CPUAccelerator().parse_devices(1000000)


def test_the_cpu_process_limit_is_the_memory_over_what_one_process_needs(monkeypatch):
    monkeypatch.setattr(cpu, "_physical_memory", lambda: 2**30)
    monkeypatch.setattr(cpu, "usable_cpu_count", lambda: 8)
    assert len(CPUAccelerator().parse_devices(5)) == 5
    with pytest.raises(
        ValueError, match=r"devices='6' .* this machine has 1\.0 GiB of memory: at most 5 processes fit"
    ):
        CPUAccelerator().parse_devices("6")


def test_more_cpu_processes_than_usable_cores_run_with_a_warning(monkeypatch):
    monkeypatch.setattr(cpu, "usable_cpu_count", lambda: 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(CPUAccelerator().parse_devices(2)) == 2
    with pytest.warns(UserWarning, match=r"devices=3 starts 3 CPU processes on 2 usable CPU core\(s\)"):
        assert len(CPUAccelerator().parse_devices(3)) == 3


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
