"""The config's ``optimizer`` section, checked against the DeepSpeed that is installed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ONE_BIT = ("onebitadam", "onebitlamb", "zerooneadam")


def check_optimizer_section(config: Mapping[str, Any], source: str) -> None:
    """A ``ValueError`` in the calling process for an optimizer the engine would refuse in every worker."""
    section = config.get("optimizer")
    if section is None:
        return
    if not isinstance(section, Mapping) or not isinstance(section.get("type"), str):
        raise ValueError(
            f"{source}: 'optimizer' must be a section with a 'type' (e.g. {{'type': 'AdamW', 'params': "
            f"{{'lr': 1e-3}}}}); got {section!r}."
        )
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    name = section["type"]
    source = source[:1].upper() + source[1:]
    if name.lower() in DEEPSPEED_OPTIMIZERS:
        return
    if isinstance(getattr(torch.optim, name, None), type):
        stage = int((config.get("zero_optimization") or {}).get("stage", 0))
        if stage > 0 and not config.get("zero_allow_untested_optimizer"):
            raise ValueError(
                f"{source} has optimizer type {name!r}, a torch optimizer that DeepSpeed has not tested with ZeRO "
                f'(stage {stage}); its engine refuses it unless the config says "zero_allow_untested_optimizer": '
                "true. Add that, or use one of DeepSpeed's optimizers ('Adam', 'AdamW', ...)."
            )
        return
    accepted = ", ".join(repr(known) for known in DEEPSPEED_OPTIMIZERS)
    hint = ""
    if name.lower() in _ONE_BIT:
        hint = (
            " DeepSpeed's 1-bit optimizers (OneBitAdam, OneBitLamb, ZeroOneAdam) are not part of the installed "
            "DeepSpeed (they needed CUDA when they were); 'Adam' or 'AdamW' with the same params (without "
            "'cuda_aware', 'freeze_step', 'comm_backend_name') trains the same model, with uncompressed communication."
        )
    raise ValueError(
        f"{source} has optimizer type {name!r}, which the installed DeepSpeed does not provide. It accepts "
        f"{accepted} or the name of a torch.optim class (e.g. 'SGD').{hint}"
    )
