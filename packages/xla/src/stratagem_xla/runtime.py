"""Whether torch_xla can be used in this process, found out cheaply, and its runtime once it can.

``import torch_xla`` costs 7-10 s and, against a torch it was not built for, fails with an undefined
symbol. :func:`xla_problem` answers from installed metadata first (no import), so listing names stays
fast and a mismatch is said in words; :func:`load_problem` then imports torch_xla once and reports a
failure there too.
"""

from __future__ import annotations

import functools
import importlib
import os
from importlib import metadata

XLA_REQUIREMENT = "torch-xla==2.9.0"
"""The torch_xla these strategies are tested with (its wheel needs exactly the torch of the same version)."""

INSTALL = 'pip install torch==2.9.0 torch-xla==2.9.0 "stratagem[xla]" (in a fresh virtual environment)'
"""The install command every availability message ends with."""


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def xla_problem() -> str | None:
    """Why torch_xla cannot load here, judged from installed metadata alone, or ``None``."""
    try:
        xla_version = metadata.version("torch-xla")
    except metadata.PackageNotFoundError:
        return f"torch_xla is not installed: {INSTALL}"
    torch_version = metadata.version("torch")
    if _release(xla_version) != _release(torch_version):
        return (
            f"torch_xla {xla_version} loads only against torch {_release(xla_version)}, but torch {torch_version} "
            f"is installed: {INSTALL}"
        )
    return None


@functools.cache
def load_problem() -> str | None:
    """:func:`xla_problem`, else why ``import torch_xla`` fails here (imported once per process), else ``None``."""
    problem = xla_problem()
    if problem is not None:
        return problem
    try:
        importlib.import_module("torch_xla")
    except (ImportError, OSError) as error:
        return f"import torch_xla failed ({type(error).__name__}: {error}): {INSTALL}"
    return None


def require_xla() -> None:
    """Raise ``RuntimeError`` saying why, when torch_xla cannot be used in this process."""
    problem = load_problem()
    if problem is not None:
        raise RuntimeError(problem)


def device_configured() -> bool:
    """Whether this machine asks for XLA without being told by a strategy: ``PJRT_DEVICE`` is set, or a TPU
    is attached (its device files exist). XLA's own CPU fallback does not count."""
    if os.environ.get("PJRT_DEVICE"):
        return True
    return any(os.path.exists(path) for path in ("/dev/accel0", "/dev/vfio/0"))


def device_count() -> int:
    """How many XLA devices this host has, counted without starting the runtime.

    The runtime must not start in the calling process: ``xmp.spawn`` refuses to start replicas after it, and
    SPMD must be switched on before it. So TPUs are counted from the host (torch_xla's own count of chips and
    their cores), XLA's CPU devices from ``CPU_NUM_DEVICES``; other PJRT plugins (GPU, Neuron) start the
    runtime to be asked.
    """
    require_xla()
    import torch_xla
    import torch_xla.runtime as xr
    from torch_xla._internal import tpu

    kind = xr.device_type()
    if kind == "TPU":
        return int(tpu.num_available_devices())
    if kind == "CPU":
        return int(os.environ.get("CPU_NUM_DEVICES", "1"))
    return int(torch_xla.device_count())
