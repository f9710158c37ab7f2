"""The first-party backend packages, for hints about names whose package is not installed.

This is the one hand-kept list in the registry: a package that is not installed cannot be
asked what it registers. ``tests/test_first_party_catalogue.py`` checks it against every
first-party package that is installed, so it cannot drift silently.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FirstPartyPackage:
    extra: str
    distribution: str
    prefixes: tuple[str, ...]
    names: dict[str, tuple[str, ...]]


_FIND_UNUSED = "_find_unused_parameters_true"

PACKAGES: tuple[FirstPartyPackage, ...] = (
    FirstPartyPackage(
        extra="ddp",
        distribution="stratagem-ddp",
        prefixes=("ddp",),
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
                "dp",
            ),
        },
    ),
    FirstPartyPackage(
        extra="fsdp",
        distribution="stratagem-fsdp",
        prefixes=("fsdp",),
        names={
            "strategy": ("fsdp", "fsdp_cpu_offload", "fsdp_spawn", "fsdp_fork"),
            "checkpoint IO": ("distributed_checkpoint",),
        },
    ),
    FirstPartyPackage(
        extra="deepspeed",
        distribution="stratagem-deepspeed",
        prefixes=("deepspeed",),
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
        extra="xla",
        distribution="stratagem-xla",
        prefixes=("xla", "single_xla", "tpu"),
        names={"strategy": ("xla", "single_xla", "xla_fsdp"), "accelerator": ("xla", "tpu")},
    ),
    FirstPartyPackage(
        extra="hpu",
        distribution="stratagem-hpu",
        prefixes=("hpu",),
        names={"strategy": ("hpu_single", "hpu_parallel"), "accelerator": ("hpu",)},
    ),
    FirstPartyPackage(
        extra="ipu",
        distribution="stratagem-ipu",
        prefixes=("ipu",),
        names={"strategy": ("ipu_strategy",), "accelerator": ("ipu",)},
    ),
)


def owning_package(kind: str, name: str) -> FirstPartyPackage | None:
    """The first-party package that provides ``name`` of this kind, if any."""
    for package in PACKAGES:
        if name in package.names.get(kind, ()):
            return package
    if kind == "strategy" or kind in _KINDS_WITH_PREFIX_MATCH:
        for package in PACKAGES:
            if any(name.startswith(prefix) for prefix in package.prefixes):
                return package
    return None


_KINDS_WITH_PREFIX_MATCH = ("accelerator",)


def install_hint_for(kind: str, name: str) -> str | None:
    """``'... pip install "stratagem[x]"'`` when ``name`` belongs to a first-party package that is not installed."""
    from importlib import metadata

    package = owning_package(kind, name)
    if package is None:
        return None
    try:
        metadata.version(package.distribution)
    except metadata.PackageNotFoundError:
        return (
            f"The {kind} {name!r} is provided by {package.distribution}, which is not installed: "
            f'pip install "stratagem[{package.extra}]".'
        )
    return None


def first_party_names(kind: str) -> tuple[str, ...]:
    return tuple(name for package in PACKAGES for name in package.names.get(kind, ()))
