"""A strategy's signature, with the options it forwards to its base class spelled out, and the check of keywords
against it: what the registry validates options with, what ``help()`` shows, and where an unknown keyword is refused."""

from __future__ import annotations

import inspect
import re
import sys
import typing
from typing import Any

LIGHTNING_RENAMES = {"precision_plugin": "precision"}
"""Lightning's spelling -> stratagem's, for strategy options both have under different names."""

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def signature_with_forwarded_options(cls: type) -> inspect.Signature:
    """``cls.__init__``'s parameters, with a catch-all (``**parallel_options``, ``**options``) followed by the
    keyword parameters of the next ``__init__`` up the class hierarchy, which it is passed on to.

    A catch-all annotated ``Unpack[SomeOptions]`` forwards only those of them that ``SomeOptions`` (a TypedDict of
    the defining module) names, and is dropped; any other stays, for options the class takes beyond them.
    """
    defining = next(klass for klass in cls.__mro__ if "__init__" in vars(klass))
    own = list(inspect.signature(defining.__init__).parameters.values())[1:]  # type: ignore[misc]
    explicit = [parameter for parameter in own if parameter.kind is not inspect.Parameter.VAR_KEYWORD]
    catch_all = [parameter for parameter in own if parameter.kind is inspect.Parameter.VAR_KEYWORD]
    if not catch_all:
        return inspect.Signature(explicit)
    base = next(klass for klass in defining.__mro__[1:] if "__init__" in vars(klass))
    names = {parameter.name for parameter in explicit}
    unpacked = [_unpacked_keys(defining, parameter) for parameter in catch_all]
    taken = None if None in unpacked else frozenset().union(*(keys for keys in unpacked if keys is not None))
    forwarded = [
        parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for parameter in _signature_of(base).parameters.values()
        if parameter.kind in _NAMED and parameter.name not in names and (taken is None or parameter.name in taken)
    ]
    kept = [parameter for parameter in catch_all if "Unpack[" not in str(parameter.annotation)]
    return inspect.Signature([*explicit, *forwarded, *kept])


def _unpacked_keys(cls: type, catch_all: inspect.Parameter) -> frozenset[str] | None:
    """The keys of the TypedDict a ``**options: Unpack[SomeOptions]`` catch-all of ``cls.__init__`` takes; ``None``
    for another catch-all, or one whose TypedDict is not a name in the module that defines ``cls``."""
    annotation = catch_all.annotation
    if isinstance(annotation, str):  # postponed (``from __future__ import annotations``): look the name up
        match = re.fullmatch(r"(?:\w+\.)*Unpack\[(\w+)\]", annotation)
        options: Any = getattr(sys.modules.get(cls.__module__), match.group(1), None) if match else None
    else:
        arguments = typing.get_args(annotation)
        options = arguments[0] if "Unpack[" in str(annotation) and arguments else None
    if not hasattr(options, "__optional_keys__"):
        return None
    return frozenset(options.__optional_keys__) | frozenset(options.__required_keys__)


def _signature_of(cls: type) -> inspect.Signature:
    # Not inspect.signature(cls): for a class with a __new__ of its own that reads (*args, **options).
    signature = vars(cls).get("__signature__")
    if isinstance(signature, inspect.Signature):
        return signature
    initialiser = vars(cls)["__init__"]
    return inspect.Signature(list(inspect.signature(initialiser).parameters.values())[1:])


def check_option_names(cls: type, options: dict[str, Any]) -> None:
    """Refuse keywords ``cls`` does not take, naming what it does take (Lightning's other spellings by their
    stratagem name). A class with a catch-all of its own checks what reaches it."""
    parameters = _signature_of(cls).parameters
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return
    accepted = sorted(name for name, parameter in parameters.items() if parameter.kind in _NAMED)
    for name in options:
        if name in LIGHTNING_RENAMES and name not in accepted:
            raise TypeError(
                f"{cls.__name__}({name}=...) is Lightning's name; stratagem's is {LIGHTNING_RENAMES[name]}= "
                f"(on {cls.__name__}, or {LIGHTNING_RENAMES[name]}= on the Trainer)."
            )
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(
            f"{cls.__name__} does not accept option(s) {', '.join(map(repr, unknown))}. "
            f"Accepted: {', '.join(accepted) or '(none)'}."
        )
