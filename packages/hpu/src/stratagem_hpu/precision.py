"""fp8 training through Habana's transformer engine (``precision="fp8"``).

``bf16-mixed`` and ``bf16-true`` need nothing of their own on Gaudi: core's precisions autocast on the
accelerator's ``hpu`` device and cast parameters.
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn

from stratagem.accelerators import Accelerator
from stratagem.precision import Precision
from stratagem_hpu import availability, habana


class HPUFP8Precision(Precision):
    """fp32 parameters; forward under the transformer engine's ``fp8_autocast``.

    ``replace_layers=True`` swaps every ``nn.Linear`` for the engine's ``Linear`` (same weights), the layers
    the engine computes in fp8. ``recipe`` is the engine's scaling recipe (``DelayedScaling``), or ``None``
    for its default.
    """

    name = "fp8"
    exact = False

    def __init__(self, replace_layers: bool = True, recipe: Any = None) -> None:
        if not isinstance(replace_layers, bool):
            raise TypeError(f"replace_layers={replace_layers!r} is not valid; expected True or False.")
        self.replace_layers = replace_layers
        self.recipe = recipe

    @staticmethod
    def is_available() -> bool:
        return availability.habana_problem() is None

    @staticmethod
    def unavailable_reason() -> str:
        return availability.habana_problem() or "Habana's software is installed"

    def check_accelerator(self, accelerator: Accelerator) -> None:
        if accelerator.device_type != "hpu":
            raise ValueError(
                f"precision='fp8' runs on Gaudi through Habana's transformer engine; accelerator="
                f"{accelerator.device_type!r} has no fp8 here. Use accelerator='hpu', or precision='bf16-mixed'."
            )
        problem = fp8_problem()
        if problem is not None:
            raise ValueError(f"precision='fp8' cannot run here: {problem}. Use precision='bf16-mixed'.")

    def convert_module(self, module: nn.Module) -> nn.Module:
        if self.replace_layers:
            _replace_linear_layers(module, habana.transformer_engine().Linear)
        return module

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return habana.transformer_engine().fp8_autocast(enabled=True, fp8_recipe=self.recipe)  # type: ignore[no-any-return]


def fp8_problem() -> str | None:
    """Why fp8 cannot be used here (no Habana software, or a card without fp8), or ``None``."""
    problem = availability.habana_problem()
    if problem is not None:
        return problem
    try:
        engine = habana.transformer_engine()
    except ImportError as error:
        return f"Habana's transformer engine cannot be imported ({error})"
    available, reason = engine.fp8.is_fp8_available()
    return None if available else f"Habana's transformer engine reports no fp8: {reason}"


def _replace_linear_layers(module: nn.Module, engine_linear: type[nn.Linear]) -> None:
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            replacement = engine_linear(
                child.in_features, child.out_features, bias=child.bias is not None, device=child.weight.device
            )
            replacement.load_state_dict(child.state_dict())
            setattr(module, name, replacement)
        else:
            _replace_linear_layers(child, engine_linear)
