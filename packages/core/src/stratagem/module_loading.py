"""A Module's hyperparameters (``save_hyperparameters``) and rebuilding a Module from a checkpoint
(``load_from_checkpoint``), as Lightning code uses them."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from stratagem.hyperparameter_values import stored_form
from stratagem.printable import printable, shown_repr

if TYPE_CHECKING:
    from stratagem.module import Module

HYPER_PARAMETERS_KEY = "hyper_parameters"
"""The checkpoint entry holding the module's saved ``__init__`` arguments."""

ModuleT = TypeVar("ModuleT", bound="Module")


class HyperParameters(dict[str, Any]):
    """A dict whose entries are also attributes (``self.hparams.lr``), as Lightning's ``hparams``.

    Every value is kept in the form a checkpoint stores it (:func:`stored_form`), also one set later.
    """

    def __setitem__(self, name: str, value: Any) -> None:
        super().__setitem__(name, stored_form(name, value))

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # All converted before any is set: a refused argument leaves hparams as they were.
        super().update({name: stored_form(name, value) for name, value in dict(*args, **kwargs).items()})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"hparams has no {name!r}; saved: {', '.join(sorted(self)) or 'none'}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


def stored_hyperparameters(hparams: dict[str, Any]) -> dict[str, Any]:
    """``hparams`` as a checkpoint stores them; ``TypeError`` naming an entry that cannot be stored (one
    changed in place after it was set, such as a list appended to)."""
    return {name: stored_form(name, value) for name, value in hparams.items()}


def init_arguments(frame: FrameType, names: tuple[str, ...], ignore: str | Iterable[str] | None) -> dict[str, Any]:
    """The arguments the ``__init__`` running in ``frame`` received (only ``names`` when given), less ``ignore``."""
    info = inspect.getargvalues(frame)
    arguments = {name: info.locals[name] for name in info.args[1:] if name in info.locals}
    if info.keywords is not None:
        arguments.update(info.locals.get(info.keywords) or {})
    if names:
        unknown = [name for name in names if name not in arguments]
        if unknown:
            raise ValueError(
                f"save_hyperparameters({', '.join(map(repr, names))}): {', '.join(map(repr, unknown))} "
                f"{'is' if len(unknown) == 1 else 'are'} not an argument of __init__ (its arguments: "
                f"{', '.join(arguments) or 'none'})."
            )
        arguments = {name: arguments[name] for name in names}
    ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
    return {name: value for name, value in arguments.items() if name not in ignored}


def load_module(
    module_class: type[ModuleT],
    checkpoint_path: str | Path,
    map_location: str | torch.device | None,
    strict: bool,
    weights_only: bool,
    overrides: dict[str, Any],
) -> ModuleT:
    """Build ``module_class`` from the saved hyperparameters (``overrides`` win), create its layers
    (``configure_model``) and load the checkpoint's weights, whichever strategy wrote it."""
    from stratagem.checkpoint_io import TorchCheckpointIO
    from stratagem.checkpoint_io.readers import read_full_checkpoint
    from stratagem.strategies.compilation import compile_submodules_in_place, strip_compile_prefix
    from stratagem.trainer.checkpointing import check_trainer_entries

    if map_location is not None and not isinstance(map_location, str | torch.device):
        raise TypeError(
            f"load_from_checkpoint(map_location={map_location!r}): stratagem reads checkpoints to the CPU and then "
            "moves the module; pass a device (e.g. 'cpu' or torch.device('cuda', 0)) or None."
        )
    checkpoint = read_full_checkpoint(checkpoint_path, TorchCheckpointIO(), weights_only=weights_only)
    if "module" not in checkpoint:
        raise ValueError(
            f"{str(checkpoint_path)!r} holds no module weights (no 'module' entry); it is not a checkpoint."
        )
    check_trainer_entries(checkpoint, str(checkpoint_path))
    arguments = {**_saved_arguments(checkpoint, checkpoint_path), **overrides}
    module = _construct(module_class, arguments, checkpoint_path, HYPER_PARAMETERS_KEY in checkpoint)
    module.configure_model()
    # Submodules the module compiles keep the names they have uncompiled, which are the checkpoint's.
    compile_submodules_in_place(module)
    module.load_state_dict(strip_compile_prefix(checkpoint.pop("module")), strict=strict)
    # The checkpoint's weights are the module's now: a later run must not load what configure_model asked for.
    module.__dict__.pop("_pretrained_requests", None)
    module.on_load_checkpoint(checkpoint)
    if map_location is not None:
        module.to(torch.device(map_location))
    return module.eval()


def _saved_arguments(checkpoint: dict[str, Any], path: str | Path) -> dict[str, Any]:
    saved = checkpoint.get(HYPER_PARAMETERS_KEY)
    if saved is None:
        return {}
    if not isinstance(saved, dict) or not all(isinstance(name, str) for name in saved):
        from stratagem.checkpoint_io import CheckpointError

        raise CheckpointError(
            f"{printable(repr(str(path)))}: its {HYPER_PARAMETERS_KEY!r} entry is {shown_repr(saved, 80)} (a "
            f"{type(saved).__name__}), not a dict of __init__ argument names; the checkpoint was not written by "
            "save_hyperparameters(). Pass the arguments as keyword arguments to load_from_checkpoint and fix or "
            f"remove that entry."
        )
    return saved


def _construct(module_class: type[ModuleT], arguments: dict[str, Any], path: str | Path, saved: bool) -> ModuleT:
    try:
        inspect.signature(module_class).bind(**arguments)
    except TypeError as error:
        hint = (
            "the checkpoint saved no hyperparameters: call self.save_hyperparameters() in __init__ so that they are"
            " saved, or pass them as keyword arguments to load_from_checkpoint"
            if not saved
            else "pass the missing or changed ones as keyword arguments to load_from_checkpoint"
        )
        raise TypeError(
            f"{module_class.__name__}.load_from_checkpoint({printable(repr(str(path)))}) cannot call "
            f"{module_class.__name__}(**{shown_repr(arguments)}): {printable(error)}; {hint}."
        ) from None
    return module_class(**arguments)
