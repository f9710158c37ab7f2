"""The names core registers itself, through the same ``register`` call plugins use."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratagem.registry.registry import Registry


def register_strategies(registry: Registry) -> None:
    registry.register(
        "single_device",
        "stratagem.strategies.single_device:SingleDeviceStrategy",
        description="One process on one device (CPU, one GPU, MPS).",
    )


def register_accelerators(registry: Registry) -> None:
    registry.register(
        "cpu", "stratagem.accelerators.cpu:CPUAccelerator", description="The CPU; devices=N starts N processes."
    )
    registry.register(
        "cuda", "stratagem.accelerators.cuda:CUDAAccelerator", description="NVIDIA/ROCm GPUs via torch.cuda."
    )
    registry.register(
        "mps", "stratagem.accelerators.mps:MPSAccelerator", description="Apple silicon GPU via torch.backends.mps."
    )


def register_precisions(registry: Registry) -> None:
    registry.register("32-true", "stratagem.precision.precision:Precision", description="fp32 parameters and compute.")
    for name, dtype, what in (
        ("64-true", "float64", "fp64 parameters and compute."),
        ("16-true", "float16", "fp16 parameters and compute (no autocast, no master copy)."),
        ("bf16-true", "bfloat16", "bf16 parameters and compute (no autocast, no master copy)."),
    ):
        registry.register(
            name, "stratagem.precision.true_dtype:TruePrecision", description=what, defaults={"dtype": dtype}
        )
    for name, dtype, what in (
        ("16-mixed", "float16", "fp32 parameters, fp16 autocast, gradient scaling where the device needs it."),
        ("bf16-mixed", "bfloat16", "fp32 parameters, bf16 autocast."),
    ):
        registry.register(name, "stratagem.precision.mixed:MixedPrecision", description=what, defaults={"dtype": dtype})


def register_environments(registry: Registry) -> None:
    for name, target, what in (
        (
            "torchelastic",
            "torchelastic:TorchElasticEnvironment",
            "Processes started by torchrun / torch.distributed.run.",
        ),
        ("slurm", "slurm:SLURMEnvironment", "Tasks started by SLURM's srun."),
        ("lsf", "lsf:LSFEnvironment", "Jobs on IBM Spectrum LSF (jsrun)."),
        ("mpi", "mpi:MPIEnvironment", "Ranks started by mpirun/mpiexec (OpenMPI, MPICH, Intel MPI); no mpi4py needed."),
        ("kubeflow", "kubeflow:KubeflowEnvironment", "Kubeflow PyTorchJob pods."),
        ("local", "local:LocalEnvironment", "One machine or manual multi-node: MASTER_ADDR, MASTER_PORT, NODE_RANK."),
    ):
        registry.register(name, f"stratagem.environments.{target}", description=what)


def register_checkpoint_io(registry: Registry) -> None:
    registry.register(
        "torch",
        "stratagem.checkpoint_io.torch_io:TorchCheckpointIO",
        description="One torch.save file, written to a temporary name, fsynced and renamed.",
    )
    registry.register(
        "async",
        "stratagem.checkpoint_io.async_io:AsyncCheckpointIO",
        description="Saves in a background thread; waits at teardown and re-raises errors.",
    )
    registry.register(
        "distributed_checkpoint",
        "stratagem.checkpoint_io.sharded:DistributedCheckpointIO",
        description="torch.distributed.checkpoint directories: each rank writes its shards; any strategy reads them.",
    )
    registry.register(
        "async_distributed_checkpoint",
        "stratagem.checkpoint_io.async_sharded:AsyncDistributedCheckpointIO",
        description="distributed_checkpoint written in the background (DCP's async_save); fsdp's plugins='async'.",
    )
