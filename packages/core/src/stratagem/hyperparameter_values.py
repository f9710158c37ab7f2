"""What a hyperparameter is stored as: a value a weights-only ``torch.load`` reads back.

``save_hyperparameters`` converts the two common values that would not load (paths become
strings, numpy scalars Python numbers) and refuses the rest, naming the argument, when it is
called: a checkpoint the user's own run wrote must load under the default ``weights_only=True``,
and the module sees in :attr:`Module.hparams` what :meth:`Module.load_from_checkpoint` will pass
it later.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from collections import OrderedDict
from typing import Any, NoReturn

import torch

from stratagem.printable import printable

# Exact types: a subclass (an IntEnum, a namedtuple, a str subclass) pickles its class by name,
# which a weights-only load refuses.
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device, torch.Size)
_KEYS = (type(None), bool, int, float, str)
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_ACCEPTED = (
    "None, bool, int, float, complex, str, bytes, a torch tensor, dtype or device, and lists, tuples, sets and dicts "
    "of those"
)


def stored_form(name: str, value: Any) -> Any:
    """``value`` as the hyperparameter ``name`` is stored; ``TypeError`` naming it when it cannot be stored."""
    return _convert(value, name, f"argument {name!r}", depth=0)


_MAX_DEPTH = 50


def _convert(value: Any, name: str, where: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        _refuse(name, where, value, f"it is nested more than {_MAX_DEPTH} levels deep")
    kind = type(value)
    if kind in _PLAIN or kind in _TENSORS:
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    numpy = sys.modules.get("numpy")  # a numpy value exists only once numpy was imported
    if numpy is not None and isinstance(value, numpy.generic):
        return _convert(value.item(), name, where, depth + 1)
    if numpy is not None and isinstance(value, numpy.ndarray):
        _refuse(name, where, value, "pass value.tolist() or torch.from_numpy(value)")
    if kind is list or kind is tuple or kind is set:
        return kind(_convert(item, name, f"{where}[{index}]", depth + 1) for index, item in enumerate(value))
    if kind is dict or kind is OrderedDict:
        converted = kind()
        for key, item in value.items():
            if type(key) not in _KEYS:
                _refuse(name, f"a key of {where}", key, "use str, int, float, bool or None keys")
            converted[key] = _convert(item, name, f"{where}[{printable(repr(key), 60)}]", depth + 1)
        return converted
    _refuse(name, where, value, _advice(value))


def _advice(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"pass its value ({printable(repr(value.value), 60)}) and turn it back into the enum in __init__"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "pass its fields as arguments, or dataclasses.asdict() of it and rebuild it in __init__"
    if isinstance(value, torch.nn.Module):
        return "the checkpoint saves a module's weights already"
    return f"store {_ACCEPTED}"


def _refuse(name: str, where: str, value: Any, advice: str) -> NoReturn:
    raise TypeError(
        f"save_hyperparameters(): {where} is {_describe(value)}, which a checkpoint cannot store in a form that "
        f"loads back with weights_only=True; {advice}, or leave it out with ignore=[{name!r}]."
    )


def _describe(value: Any) -> str:
    kind = type(value)
    what = f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__
    if isinstance(value, enum.Enum):
        return f"an enum member ({what})"
    if dataclasses.is_dataclass(value):
        return f"a dataclass ({what})"
    if isinstance(value, type):
        return f"a class ({value.__module__}.{value.__qualname__})"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"a function ({getattr(value, '__module__', None) or '?'}.{value.__qualname__})"
    return f"of type {what}"
