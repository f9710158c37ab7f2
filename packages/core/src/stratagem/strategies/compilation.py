"""``torch.compile`` in a run: compiled in place, after the strategy has wrapped the module.

``torch.compile(module)`` returns an ``OptimizedModule`` that holds the module as ``_orig_mod``: its
state-dict keys gain that name (so checkpoints stop fitting uncompiled modules), and a wrapper built
around it (DDP, ``fully_shard``, DeepSpeed's engine) sees a stranger instead of the user's classes. Here
compilation is attached to the modules themselves instead, once the strategy has wrapped them: parameter
names stay as without compile, and every wrapper hook (gradient sync, FSDP's gathers, ZeRO-3's fetches)
runs around the compiled code as it runs around the eager code.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

BlockPolicy = Callable[[nn.Module], bool]
"""Says whether a submodule is compiled as its own region."""

Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
"""Turns a function into its compiled form: ``torch.compile`` with fixed options, or a compiled module's
dynamo context (which ``torch.compile(module)`` kept with its options)."""

_COMPILE_OPTIONS = tuple(name for name in inspect.signature(torch.compile).parameters if name != "model")


@dataclass(frozen=True)
class CompileSettings:
    """What to compile in a run and how.

    ``compiler`` compiles a callable. ``blocks`` names the submodule classes compiled one region each
    (regional compilation, as torchtitan and Accelerate do it): with ``None`` the strategy's own block
    policy applies (:meth:`~stratagem.strategies.Strategy.compile_blocks`), and without one the module's
    ``forward`` is compiled whole.
    """

    compiler: Compiler
    blocks: tuple[type[nn.Module], ...] | None = None
    description: str = field(default="compile=True", compare=False)


def parse_compile_option(value: object) -> CompileSettings | None:
    """``Trainer(compile=...)``: ``False``/``None`` (off), ``True`` (``torch.compile``'s defaults) or a dict of
    ``torch.compile`` keyword arguments, optionally with ``"blocks"``: a module class or a collection of them."""
    accepted = (
        "True, False, None, or a dict of torch.compile keyword arguments "
        f"({', '.join(_COMPILE_OPTIONS)}) and optionally 'blocks' (a module class or a set of them)"
    )
    if value is None or value is False:
        return None
    if value is True:
        return CompileSettings(compiler=torch.compile)
    if not isinstance(value, dict):
        raise TypeError(f"compile={value!r} is not valid; expected {accepted}.")
    options = dict(value)
    blocks = _block_classes(options.pop("blocks", None))
    unknown = sorted(str(name) for name in options if name not in _COMPILE_OPTIONS)
    if unknown:
        raise ValueError(f"compile={value!r} is not valid: {unknown} are not options; expected {accepted}.")
    return CompileSettings(
        compiler=functools.partial(torch.compile, **options), blocks=blocks, description=f"compile={value!r}"
    )


def _block_classes(blocks: object) -> tuple[type[nn.Module], ...] | None:
    if blocks is None:
        return None
    items = (blocks,) if isinstance(blocks, type) else blocks
    if isinstance(items, Iterable) and not isinstance(items, str | bytes):
        classes = tuple(items)
        if classes and all(isinstance(item, type) and issubclass(item, nn.Module) for item in classes):
            return classes
    raise TypeError(
        f"compile={{'blocks': {blocks!r}}} is not valid; expected an nn.Module subclass or a non-empty set of them "
        "(e.g. {nn.TransformerEncoderLayer}), as the wrapping policies take."
    )


def unwrap_compiled(module: Any) -> tuple[Any, CompileSettings | None]:
    """The module inside ``torch.compile(module)`` and how it was compiled; anything else as it is, with ``None``."""
    OptimizedModule = _optimized_module_class()
    if OptimizedModule is None:
        return module, None

    if not isinstance(module, OptimizedModule):
        return module, None
    return module._orig_mod, CompileSettings(compiler=module.dynamo_ctx, description="torch.compile(module)")


def compile_submodules_in_place(module: nn.Module) -> None:
    """Replace each ``torch.compile``-d submodule by the module it wraps, compiled in place with the same options.

    A submodule the user compiled (``self.model = torch.compile(model)``, in ``__init__`` or
    ``configure_model``) stays compiled, but its parameters lose the ``_orig_mod`` in their names, so that
    checkpoints fit the uncompiled module and the strategies' wrapping policies see the user's classes.
    """
    OptimizedModule = _optimized_module_class()
    if OptimizedModule is None:
        return

    for parent in list(module.modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, OptimizedModule):
                original = child._orig_mod
                # What nn.Module.compile() does, with the compiled module's own dynamo context.
                original._compiled_call_impl = child.dynamo_ctx(original._call_impl)
                parent._modules[name] = original


def _optimized_module_class() -> type[Any] | None:
    """``torch.compile``'s module class, or ``None`` when nothing imported dynamo (so nothing was compiled):
    importing it takes seconds, which a run that compiles nothing must not pay (in every process)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return None if eval_frame is None else eval_frame.OptimizedModule


def strip_compile_prefix(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` with the ``_orig_mod.`` that ``torch.compile(module)`` adds removed from its keys (for
    checkpoints written from a compiled module by hand or by an earlier version)."""
    if not any("_orig_mod." in key for key in state_dict):
        return state_dict
    return {_without_prefix(key): value for key, value in state_dict.items()}


def _without_prefix(key: str) -> str:
    return ".".join(part for part in key.split(".") if part != "_orig_mod")


class CompiledRegions:
    """The compiled regions of one set-up module; :meth:`restore` gives the module back as it was."""

    def __init__(self) -> None:
        self._forwards: list[tuple[nn.Module, Any]] = []

    @classmethod
    def compile(
        cls, module: nn.Module, settings: CompileSettings, strategy_blocks: BlockPolicy | None
    ) -> CompiledRegions:
        """Compile the ``forward`` of each block of ``module`` (outermost ones; ``module`` itself never counts),
        or of ``module`` when there are none.

        ``forward`` is what is compiled, not ``__call__``: the hooks of wrappers and of the user run around it
        as in an eager run, and the Trainer can still route a step through the wrapper's forward.
        """
        regions = cls()
        policy = _class_policy(settings.blocks) if settings.blocks is not None else strategy_blocks
        blocks = list(_outermost(module, policy)) if policy is not None else []
        if settings.blocks is not None and not blocks:
            names = ", ".join(block.__name__ for block in settings.blocks)
            raise ValueError(
                f"{settings.description} names the blocks {names}, but {type(module).__name__} has no submodule of "
                "those classes; name classes the model has, or leave 'blocks' out to compile the whole forward."
            )
        for target in blocks or [module]:
            regions._compile_forward(target, settings.compiler)
        return regions

    def _compile_forward(self, module: nn.Module, compiler: Compiler) -> None:
        self._forwards.append((module, module.__dict__.get("forward")))
        module.forward = compiler(module.forward)  # type: ignore[method-assign]

    def restore(self) -> None:
        """Remove what :meth:`compile` added (a compiled ``forward`` cannot be pickled or deep-copied)."""
        for module, previous in reversed(self._forwards):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous  # type: ignore[method-assign]
        self._forwards.clear()


def _class_policy(classes: tuple[type[nn.Module], ...]) -> BlockPolicy:
    return lambda module: isinstance(module, classes)


def _outermost(module: nn.Module, policy: BlockPolicy) -> Iterable[nn.Module]:
    # children() skips a module registered under a second name, so no block is compiled twice.
    for child in module.children():
        if policy(child):
            yield child
        else:
            yield from _outermost(child, policy)
