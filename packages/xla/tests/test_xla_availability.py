"""What stratagem says about XLA before and without loading torch_xla."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest
import torch
from stratagem_xla import runtime
from stratagem_xla.accelerator import XLAAccelerator

from stratagem import registry, resolve


def _versions(monkeypatch, **installed):
    def version(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(runtime.metadata, "version", version)


def test_missing_torch_xla_is_named_with_the_install_command(monkeypatch):
    _versions(monkeypatch, torch="2.13.0")
    assert runtime.xla_problem() == f"torch_xla is not installed: {runtime.INSTALL}"


def test_torch_xla_beside_another_torch_is_named_before_anything_imports_it(monkeypatch):
    _versions(monkeypatch, torch="2.13.0+cpu", **{"torch-xla": "2.9.0"})
    problem = runtime.xla_problem()
    assert problem is not None
    assert problem.startswith("torch_xla 2.9.0 loads only against torch 2.9.0, but torch 2.13.0+cpu is installed")
    assert "pip install torch==2.9.0 torch-xla==2.9.0" in problem


def test_torch_xla_with_its_own_torch_has_no_problem(monkeypatch):
    _versions(monkeypatch, torch="2.9.0+cu128", **{"torch-xla": "2.9.0"})
    assert runtime.xla_problem() is None


def test_the_xla_accelerator_is_available_only_where_the_machine_asks_for_xla(monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setattr(runtime.os.path, "exists", lambda path: False)
    assert not XLAAccelerator.is_available()
    assert "PJRT_DEVICE is not set (PJRT_DEVICE=CPU runs XLA on the CPU)" in XLAAccelerator.unavailable_reason()
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert XLAAccelerator.is_available()


def test_auto_picks_the_xla_accelerator_where_pjrt_device_is_set_and_the_cpu_where_not(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert resolve(accelerator="auto", strategy="single_device").root_device.type == "xla"
    monkeypatch.delenv("PJRT_DEVICE")
    monkeypatch.setattr(runtime.os.path, "exists", lambda path: False)
    assert resolve(accelerator="auto", strategy="single_device").root_device.type == "cpu"


def test_tpu_is_an_alias_of_the_xla_accelerator_and_devices_are_counted_from_the_runtime():
    for name in ("xla", "tpu"):
        accelerator = registry.accelerators.create(name)
        assert isinstance(accelerator, XLAAccelerator)
    assert XLAAccelerator.device_count() == int(os.environ.get("CPU_NUM_DEVICES", "1"))
    assert XLAAccelerator().parse_devices("auto") == [torch.device("xla", 0)]
    assert XLAAccelerator().get_device_stats() == {"device_type": "CPU"}


def test_every_xla_name_is_registered_and_available_here():
    for name in ("single_xla", "xla", "xla_debug", "xla_fsdp", "xla_fsdp_v2"):
        description = registry.strategies.describe(name)
        assert description.distribution == "stratagem-xla"
        assert description.available, description.reason
    assert registry.strategies.get("xla_debug").defaults == {"debug": True}


@pytest.mark.timeout(120)
def test_listing_the_xla_names_imports_neither_torch_xla_nor_its_strategies():
    code = (
        "import sys\n"
        "from stratagem.cli.main import main\n"
        "main(['strategies'])\n"
        "main(['accelerators'])\n"
        "assert 'torch_xla' not in sys.modules, 'torch_xla was imported'\n"
        "assert 'stratagem_xla.strategy' not in sys.modules\n"
    )
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert finished.returncode == 0, finished.stderr
    for name in ("single_xla", "xla_fsdp_v2", "tpu"):
        assert name in finished.stdout
