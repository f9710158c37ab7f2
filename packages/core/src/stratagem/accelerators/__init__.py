"""Accelerators: the kinds of device a strategy can run on."""

from stratagem.accelerators.accelerator import Accelerator
from stratagem.accelerators.cpu import CPUAccelerator
from stratagem.accelerators.cuda import CUDAAccelerator
from stratagem.accelerators.mps import MPSAccelerator

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator"]
