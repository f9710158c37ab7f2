"""A CPU stand-in for Graphcore's PopTorch, for testing stratagem-ipu where no IPU and no SDK exist.

It keeps PopTorch's names and its execution model, not its speed: ``trainingModel`` returns an
executor whose every call runs ``device_iterations`` optimizer steps, each over
``replication_factor x gradient_accumulation`` micro-batches cut from the combined batch, with the
gradients reduced as ``Options.Training.accumulationAndReplicationReductionType`` says; the
executor keeps its own ("device") copy of the weights and optimizer state, which reach the host
model only through ``copyWeightsToHost`` or ``detachFromDevice``. A detached executor refuses to
run, and attaching needs free IPUs from a pool of ``POPTORCH_STANDIN_IPUS`` (default 4).

Limits (what it does not reproduce): no tracing or compilation (the Python step runs eagerly on every
micro-batch, so code that would not trace still works here); fp16 runs as CPU fp16/autocast, not
the IPU's arithmetic; replicas run one after the other in one process; no pipelining, no
``poptorch.optim`` optimizers (any ``torch.optim`` optimizer steps the device copy); output modes
``All``, ``Final`` and ``Sum`` only; ``autoReport`` writes a small JSON file, not a Poplar profile.
"""

from __future__ import annotations

from poptorch._dataloader import DataLoader, DataLoaderMode
from poptorch._executor import (
    PoplarExecutor,
    identity_loss,
    inferenceModel,
    ipuHardwareIsAvailable,
    ipuHardwareVersion,
    trainingModel,
)
from poptorch._options import Options, OutputMode, ReductionType

__version__ = "3.4.0+cpu.standin"

__all__ = [
    "DataLoader",
    "DataLoaderMode",
    "Options",
    "OutputMode",
    "PoplarExecutor",
    "ReductionType",
    "identity_loss",
    "inferenceModel",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "trainingModel",
]
