"""What stratagem can say about a name nothing registered: the first-party package that provides it,
or what a name users bring from Lightning means here.

These are the hand-kept data of the registry, in one place: a package that is not installed
cannot be asked what it registers. Whether a package can be installed is not kept here: it is
read from the extras the installed core declares, so a hint never gives a ``pip install`` that
cannot work. ``tests/test_first_party_catalogue.py`` holds the catalogue to every installed
first-party package and to core's extras.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from importlib import metadata

CORE_DISTRIBUTION = "stratagem"


@dataclass(frozen=True)
class FirstPartyPackage:
    """A backend package of this project: its core extra and the names it registers, by kind."""

    extra: str
    distribution: str
    names: dict[str, tuple[str, ...]]


_FIND_UNUSED = "_find_unused_parameters_true"
_NO_FIND_UNUSED = "_find_unused_parameters_false"

PACKAGES: tuple[FirstPartyPackage, ...] = (
    FirstPartyPackage(
        extra="ddp",
        distribution="stratagem-ddp",
        names={
            "strategy": (
                "ddp",
                "ddp_spawn",
                "ddp_fork",
                "ddp_notebook",
                "ddp" + _FIND_UNUSED,
                "ddp_spawn" + _FIND_UNUSED,
                "ddp_fork" + _FIND_UNUSED,
                "ddp_notebook" + _FIND_UNUSED,
                "ddp" + _NO_FIND_UNUSED,
                "ddp_spawn" + _NO_FIND_UNUSED,
                "ddp_fork" + _NO_FIND_UNUSED,
                "ddp_notebook" + _NO_FIND_UNUSED,
                "dp",
            ),
        },
    ),
    FirstPartyPackage(
        extra="fsdp",
        distribution="stratagem-fsdp",
        names={
            "strategy": ("fsdp", "fsdp_cpu_offload", "fsdp_spawn", "fsdp_fork", "model_parallel", "pipeline"),
        },
    ),
    FirstPartyPackage(
        extra="deepspeed",
        distribution="stratagem-deepspeed",
        names={
            "strategy": (
                "deepspeed",
                "deepspeed_stage_1",
                "deepspeed_stage_1_offload",
                "deepspeed_stage_2",
                "deepspeed_stage_2_offload",
                "deepspeed_stage_3",
                "deepspeed_stage_3_offload",
                "deepspeed_stage_3_offload_nvme",
            ),
            "checkpoint IO": ("deepspeed",),
        },
    ),
    FirstPartyPackage(
        extra="hivemind",
        distribution="stratagem-hivemind",
        names={"strategy": ("hivemind",)},
    ),
    FirstPartyPackage(
        extra="horovod",
        distribution="stratagem-horovod",
        names={"strategy": ("horovod",), "environment": ("horovodrun",)},
    ),
    FirstPartyPackage(extra="colossalai", distribution="stratagem-colossalai", names={"strategy": ("colossalai",)}),
    FirstPartyPackage(
        extra="xla",
        distribution="stratagem-xla",
        names={
            "strategy": ("single_xla", "xla", "xla_debug", "xla_fsdp", "xla_fsdp_v2"),
            "accelerator": ("xla", "tpu"),
            "checkpoint IO": ("xla", "xla_sharded"),
            "environment": ("xla",),
        },
    ),
    FirstPartyPackage(
        extra="hpu",
        distribution="stratagem-hpu",
        names={
            "strategy": (
                "hpu_single",
                "hpu_parallel",
                "hpu_ddp",
                "hpu_fsdp",
                "hpu_deepspeed",
                "hpu_deepspeed_stage_1",
                "hpu_deepspeed_stage_1_offload",
                "hpu_deepspeed_stage_2",
                "hpu_deepspeed_stage_2_offload",
                "hpu_deepspeed_stage_3",
                "hpu_deepspeed_stage_3_offload",
                "hpu_deepspeed_stage_3_offload_nvme",
            ),
            "accelerator": ("hpu",),
            "precision": ("fp8",),
        },
    ),
    FirstPartyPackage(
        extra="ipu",
        distribution="stratagem-ipu",
        names={"strategy": ("ipu_strategy",), "accelerator": ("ipu",)},
    ),
)


@dataclass(frozen=True)
class LightningName:
    """A name PyTorch Lightning accepted that means something else here, or nothing any more."""

    kind: str
    name: str
    answer: str
    instead: tuple[str, ...] = field(default=())


_FAIRSCALE = "Lightning's FairScale sharded DDP, removed in Lightning 2.0 with FairScale"

LIGHTNING_NAMES: tuple[LightningName, ...] = (
    LightningName("strategy", "ddp2", "Lightning's ddp2 (DP inside a node, DDP across nodes) was removed", ("ddp",)),
    LightningName("strategy", "ddp_cpu", "Lightning's old ddp_cpu is DDP with accelerator='cpu'", ("ddp",)),
    *(
        LightningName("strategy", name, _FAIRSCALE, ("fsdp", "deepspeed_stage_2"))
        for name in (
            "ddp_sharded",
            "ddp_sharded_spawn",
            "ddp_sharded_find_unused_parameters_false",
            "ddp_sharded_spawn_find_unused_parameters_false",
        )
    ),
    LightningName("strategy", "ddp_fully_sharded", "Lightning's FairScale FSDP; here FSDP is torch's", ("fsdp",)),
    LightningName("strategy", "fsdp_native", "Lightning 1.x's name for torch's FSDP", ("fsdp",)),
    LightningName(
        "strategy",
        "fsdp_native_full_shard_offload",
        "Lightning 1.x's name for torch's FSDP with CPU offload",
        ("fsdp_cpu_offload",),
    ),
    LightningName(
        "strategy", "fsdp_full_shard_offload", "Lightning's FairScale FSDP with CPU offload", ("fsdp_cpu_offload",)
    ),
    LightningName(
        "strategy",
        "bagua",
        "Lightning moved Bagua to the lightning-bagua package; stratagem offers no Bagua strategy: Bagua 0.9.2 "
        "builds only against NCCL (no CPU path), has no wheels for Python 3.11 and is no longer maintained",
        ("ddp",),
    ),
    LightningName("strategy", "tpu_spawn", "Lightning's old name for the XLA strategy", ("xla",)),
    LightningName("strategy", "tpu_spawn_debug", "Lightning's old name for the XLA strategy (debug)", ("xla",)),
    LightningName("strategy", "single_tpu", "Lightning's old name for one XLA device", ("single_xla",)),
    *(
        LightningName(
            "precision",
            name,
            "Lightning's NVIDIA Transformer Engine precision has no stratagem equivalent",
            ("bf16-mixed",),
        )
        for name in ("transformer-engine", "transformer-engine-float16")
    ),
)


def owning_package(kind: str, name: str) -> FirstPartyPackage | None:
    """The first-party package that registers ``name`` of this kind, if the catalogue lists it."""
    for package in PACKAGES:
        if name in package.names.get(kind, ()):
            return package
    return None


def lightning_name(kind: str, name: str) -> LightningName | None:
    """What a Lightning name of this kind means here, if it is one stratagem does not register."""
    return next((entry for entry in LIGHTNING_NAMES if (entry.kind, entry.name) == (kind, name)), None)


def declared_extras() -> frozenset[str]:
    """The extras the installed core declares: the only ``pip install "stratagem[x]"`` that can work."""
    try:
        extras = metadata.metadata(CORE_DISTRIBUTION).get_all("Provides-Extra") or []
    except metadata.PackageNotFoundError:
        return frozenset()
    return frozenset(extras)


def is_installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def how_to_get(package: FirstPartyPackage) -> str:
    """``'stratagem-x, which is not installed: pip install ...'`` or why it cannot be installed yet."""
    if package.extra in declared_extras():
        return f'{package.distribution}, which is not installed: pip install "stratagem[{package.extra}]"'
    return f"{package.distribution}, which is not released yet: this stratagem declares no [{package.extra}] extra"


def install_hint_for(kind: str, name: str) -> str | None:
    """Where ``name`` comes from and how to get it, when it belongs to a first-party package not installed."""
    package = owning_package(kind, name)
    if package is None or is_installed(package.distribution):
        return None
    return f"The {kind} {name!r} is provided by {how_to_get(package)}."


def uninstalled_installable_names(kind: str) -> dict[str, FirstPartyPackage]:
    """First-party names of this kind a user can install now but has not: worth suggesting, with the command."""
    extras = declared_extras()
    return {
        name: package
        for package in PACKAGES
        if package.extra in extras and not is_installed(package.distribution)
        for name in package.names.get(kind, ())
    }


def lightning_answer(kind: str, name: str, is_registered: Container[str]) -> str | None:
    """A sentence saying what a Lightning name means here and what to use (or install) instead."""
    entry = lightning_name(kind, name)
    if entry is None:
        return None
    if not entry.instead:
        return f"{entry.answer}."
    return f"{entry.answer}; use {' or '.join(_usable(kind, other, is_registered) for other in entry.instead)}."


def _usable(kind: str, name: str, is_registered: Container[str]) -> str:
    package = owning_package(kind, name)
    if name in is_registered or package is None:
        return repr(name)
    if is_installed(package.distribution):
        return f"{name!r} (from {package.distribution}, installed but not loaded: `stratagem doctor` says why)"
    return f"{name!r} (from {how_to_get(package)})"
