"""``package.module:Class`` or ``path/to/file.py:Class`` and ``--init-args`` JSON, as a command line names a module:
imported and created, or a ``ValueError`` that names the value, what went wrong and what is accepted (the user's
own code failing included, shown as its error and the line that raised it, not a traceback)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from stratagem.config_values import parse_json
from stratagem.printable import raised_at, shown_repr

if TYPE_CHECKING:
    from torch import nn

ACCEPTED = "expected package.module:Class or path/to/file.py:Class, naming a torch.nn.Module subclass"


def build_module(spec: str, init_args: str) -> nn.Module:
    """Import the class ``spec`` names and create it with the keyword arguments of the JSON object ``init_args``."""
    from torch import nn

    shown = f"MODULE={shown_repr(spec)}"
    location, separator, class_name = spec.rpartition(":")
    if not separator or not location or not class_name.isidentifier():
        raise ValueError(f"{shown} is not valid; {ACCEPTED}.")
    options = f"--init-args={shown_repr(init_args)}"
    kwargs = parse_json(init_args, options)
    if not isinstance(kwargs, dict):
        raise ValueError(f'{options} is not valid; expected a JSON object of keyword arguments, e.g. {{"width": 8}}.')
    source = _import(location, shown)
    found = getattr(source, class_name, None)
    if not isinstance(found, type) or not issubclass(found, nn.Module):
        if found is None:
            what = f"{location} has no attribute {class_name!r}"
        elif not isinstance(found, type):
            what = f"{spec} is a {type(found).__name__}, not a class"
        else:
            what = f"{spec} is a class, but not a torch.nn.Module subclass"
        raise ValueError(f"{shown}: {what}; {ACCEPTED}.")
    signature = _signature(found)
    try:
        if signature is not None:
            signature.bind(**kwargs)
    except TypeError as error:
        raise ValueError(
            f"{options}: {class_name}{signature} cannot be created with these keyword arguments ({error})."
        ) from None
    try:
        return found(**kwargs)
    except Exception as error:  # the user's constructor: its own error, without a traceback of ours
        raise ValueError(f"{shown} with {options}: {class_name}(...) raised {raised_at(error)}") from None


def _import(location: str, shown: str) -> ModuleType:
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise ValueError(f"{shown}: {location} is not a file; {ACCEPTED}.")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"{shown}: {location} cannot be loaded as a Python file; {ACCEPTED}.")
        source = importlib.util.module_from_spec(module_spec)
        loader = module_spec.loader

        def run_file() -> ModuleType:
            loader.exec_module(source)
            return source

        return _running_user_code(run_file, f"running {location}", shown)
    if location.startswith(".") or not all(part.isidentifier() for part in location.split(".")):
        raise ValueError(f"{shown}: {location!r} is not an absolute module name; {ACCEPTED}.")
    try:
        return _running_user_code(lambda: importlib.import_module(location), f"importing {location}", shown)
    except ModuleNotFoundError as error:
        raise ValueError(f"{shown}: cannot import {location} ({error}).") from None


def _running_user_code(call: Callable[[], ModuleType], doing: str, shown: str) -> ModuleType:
    """``call()``, with what the user's module raises at import time as a ``ValueError`` (a missing module is left
    to the caller, which names it)."""
    try:
        return call()
    except ModuleNotFoundError:
        raise
    except (Exception, SystemExit) as error:  # a script that parses argv or exits on import, a syntax error, ...
        raise ValueError(f"{shown}: {doing} raised {raised_at(error)}") from None


def _signature(cls: type) -> inspect.Signature | None:
    try:
        return inspect.signature(cls).replace(return_annotation=inspect.Signature.empty)
    except (TypeError, ValueError):  # a class implemented in C may have none to show
        return None
