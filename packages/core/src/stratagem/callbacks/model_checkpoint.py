"""ModelCheckpoint: save checkpoints every N steps or epochs, keep the best k, and a ``last`` one."""

from __future__ import annotations

import itertools
import math
import os
import re
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from stratagem.callbacks.callback import Callback, RunStage
from stratagem.checkpoint_io.atomic import claim_name, release_name, remove_stale_temporaries
from stratagem.loggers.logger import claim_next_version

if TYPE_CHECKING:
    from stratagem.module import Module
    from stratagem.trainer.trainer import Trainer

CHECKPOINT_SUFFIX = ".ckpt"
LAST_NAME = "last"
CHECKPOINTS_DIRECTORY = "checkpoints"
"""Under ``default_root_dir``: each fit saves into its own ``version_N`` inside."""
_VERSION = re.compile(r"version_\d+")
_LAST = re.compile(rf"{LAST_NAME}(?:-v\d+)?{re.escape(CHECKPOINT_SUFFIX)}")
_PLACEHOLDER = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")


@dataclass
class _SavePlan:
    """What every rank does at one save point; decided on global zero and broadcast."""

    path: str | None = None
    score: float | None = None
    remove: list[str] = field(default_factory=list)
    """Checkpoints out of the top k that this callback wrote: deleted once the new one is written."""
    forget: list[str] = field(default_factory=list)
    """Checkpoints out of the top k that another run wrote (a resumed run's): no longer ranked, kept on disk."""
    last: str | None = None
    claimed: list[str] = field(default_factory=list)
    """New names global zero reserved for this save (:func:`claim_name`): released once it is written."""


class ModelCheckpoint(Callback):
    """Save checkpoints while fitting.

    Saves every ``every_n_train_steps`` optimizer steps or every ``every_n_epochs`` epochs
    (default: every epoch), and once more at the end of training when the final step was not
    saved. Keeps the ``save_top_k`` best checkpoints by ``monitor`` (a logged metric, ``mode``
    ``"min"`` or ``"max"``); without ``monitor`` it keeps the ``save_top_k`` most recent.
    ``save_top_k=-1`` keeps all. ``save_last=True`` also writes ``last.ckpt`` at every save
    point, ``save_last="link"`` makes it a symbolic link to the checkpoint just saved.

    ``filename`` is a template such as ``"{epoch}-{val_loss:.3f}"``: ``{name}`` becomes
    ``name=value`` from ``epoch``, ``step`` and the logged metrics. Checkpoints go to
    ``dirpath``, as files or, for strategies that save shards, as directories. Without
    ``dirpath`` each fit takes a directory of its own, ``<default_root_dir>/checkpoints/version_N``
    (the next free ``N``, created in one step so that concurrent runs never share one; the
    loggers' ``version_N`` takes the same number where it is free). Saving happens on every
    rank; global zero decides which paths so that all ranks agree.

    Only checkpoints this callback wrote are ever deleted or replaced: those of a run resumed from,
    or of another run saving into the same ``dirpath``, leave the top k without being removed, and a
    name another run's checkpoint holds (or is being written under) is not reused: this run's
    checkpoint takes the next free ``<name>-v1``, ``-v2``, ... with a warning. A run resumed from a
    checkpoint of this ``dirpath`` carries on its ``last`` checkpoint.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        save_top_k: int = 1,
        save_last: bool | Literal["link"] = False,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint(mode={mode!r}) is not valid; use 'min' or 'max'.")
        if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < -1:
            raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k!r}) is not valid; use -1 (all), 0 or more.")
        if save_last not in (True, False, "link"):
            raise ValueError(f"ModelCheckpoint(save_last={save_last!r}) is not valid; use True, False or 'link'.")
        for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"ModelCheckpoint({name}={value!r}) is not valid; use a positive int or None.")
        if every_n_train_steps is not None and every_n_epochs is not None:
            raise ValueError(
                f"ModelCheckpoint got every_n_train_steps={every_n_train_steps} and every_n_epochs={every_n_epochs}; "
                "give one of them."
            )
        self.dirpath: Path | None = Path(dirpath) if dirpath is not None else None
        self._dirpath_given = dirpath is not None
        self.filename = filename or "{epoch}-{step}"
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_train_steps = every_n_train_steps
        self.every_n_epochs = every_n_epochs if every_n_train_steps is None else None
        if self.every_n_epochs is None and every_n_train_steps is None:
            self.every_n_epochs = 1
        self.best_k_models: dict[str, float] = {}
        self._best_model_path = ""
        self.best_model_score: float | None = None
        self._last_model_path = ""
        self.files_host: str | None = None
        """The host whose filesystem holds this callback's checkpoints, on a node that does not see ``dirpath``
        (a directory the nodes do not share; found before training); ``None`` where they are on this node."""
        self._last_saved_step = -1
        # Which files are ours to delete: travels with this object to spawned workers and back
        # through state_dict, but a checkpoint's state restored into another instance brings none.
        self._writer = uuid.uuid4().hex
        self._written: set[str] = set()
        self._warned_of_names = False
        self._claims: list[str] = []

    @property
    def best_model_path(self) -> str:
        """The best checkpoint so far ("" before the first). On a node that does not see ``dirpath`` it reads
        ``host:path`` (as scp takes it), naming the host that holds the file (:attr:`files_host`)."""
        return self._on_host(self._best_model_path)

    @best_model_path.setter
    def best_model_path(self, path: str) -> None:
        self._best_model_path = path

    @property
    def last_model_path(self) -> str:
        """The ``last`` checkpoint ("" before the first, or without ``save_last``); ``host:path`` like
        :attr:`best_model_path` on a node that does not see ``dirpath``."""
        return self._on_host(self._last_model_path)

    @last_model_path.setter
    def last_model_path(self, path: str) -> None:
        self._last_model_path = path

    def _on_host(self, path: str) -> str:
        return f"{self.files_host}:{path}" if path and self.files_host is not None else path

    @property
    def state_key(self) -> str:
        return (
            f"ModelCheckpoint{{monitor={self.monitor!r}, mode={self.mode!r}, "
            f"every_n_train_steps={self.every_n_train_steps}, every_n_epochs={self.every_n_epochs}}}"
        )

    # -- when to save ---------------------------------------------------------------------------

    def setup(self, trainer: Trainer, module: Module, stage: RunStage) -> None:
        if stage != "fit" or self.dirpath is not None or trainer.fast_dev_run:
            return
        root = default_checkpoint_root(trainer.default_root_dir)
        shared = next((other.dirpath for other in trainer.checkpoint_callbacks if other._owns_default(root)), None)
        if shared is not None:
            self.dirpath = shared
            return
        version = None
        if trainer.is_global_zero:
            for directory in [root, *_version_directories(root)]:
                remove_stale_temporaries(directory)
            version = claim_next_version(root)
            for logger in trainer.loggers:
                logger.adopt_version(version)
        self.dirpath = root / f"version_{trainer.strategy.broadcast(version)}"

    def search_directory(self, default_root_dir: str | os.PathLike[str]) -> Path:
        """Where ``ckpt_path="last"`` looks for this callback's checkpoints: ``dirpath`` when given, else
        every run's directory under ``<default_root_dir>/checkpoints``."""
        return (
            self.dirpath
            if self._dirpath_given and self.dirpath is not None
            else default_checkpoint_root(default_root_dir)
        )

    def _owns_default(self, root: Path) -> bool:
        return not self._dirpath_given and self.dirpath is not None and self.dirpath.parent == root

    def on_train_batch_end(self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_train_steps and step > 0 and step % self.every_n_train_steps == 0:
            self.save(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.save(trainer)

    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        # The final state is worth keeping when the run stopped between save points; a
        # monitored top-k only takes checkpoints whose metric belongs to them.
        if self.monitor is None or self.save_last:
            self.save(trainer, top_k=self.monitor is None)

    # -- saving ---------------------------------------------------------------------------------

    def save(self, trainer: Trainer, top_k: bool = True) -> None:
        """Save at the current step (once per step) on every rank, and drop checkpoints out of the top k.
        Nothing is saved in a ``fast_dev_run``."""
        if trainer.global_step == self._last_saved_step or trainer.fast_dev_run:
            return
        plan = self._plan(trainer, top_k) if trainer.is_global_zero else None
        plan = trainer.strategy.broadcast(plan)
        if plan is None:
            return
        # Bookkeeping first, so that the checkpoint being written already knows it is in the
        # top k (a run resumed from it then ranks it like the others); files of checkpoints
        # that drop out are deleted only once the new one is safely written, and only our own.
        self._last_saved_step = trainer.global_step
        for path in [*plan.remove, *plan.forget]:
            self.best_k_models.pop(path, None)
        if trainer.is_global_zero and self.dirpath is not None:
            remove_stale_temporaries(self.dirpath)
        if plan.last is not None:
            # Known to the checkpoint written next: a run resumed from it carries on this last.
            self.last_model_path = plan.last
            self._written.add(plan.last)
        try:
            if plan.path is not None:
                self._record(plan.path, plan.score)
                self._written.add(plan.path)
                trainer.save_checkpoint(plan.path)
            for path in plan.remove:
                if path != plan.path:
                    trainer.strategy.remove_checkpoint(path)
                    self._written.discard(path)
            if plan.last is not None:
                self._save_last(trainer, plan.last, linked_to=plan.path)
        finally:
            if trainer.is_global_zero:
                self._claims += plan.claimed
                self._release_settled_claims()

    def _release_settled_claims(self) -> None:
        # A reservation is dropped once its checkpoint holds the name: an asynchronous save may still be
        # writing after save() returned, and then the name stays reserved until a later save or teardown.
        for path in [path for path in self._claims if os.path.lexists(path)]:
            release_name(Path(path))
            self._claims.remove(path)

    def teardown(self, trainer: Trainer, module: Module, stage: RunStage) -> None:
        # The run is over: a write that failed leaves no reservation behind (an asynchronous one still
        # finishing is released a moment early).
        if trainer.is_global_zero:
            for path in self._claims:
                release_name(Path(path))
            self._claims.clear()

    def _plan(self, trainer: Trainer, top_k: bool) -> _SavePlan | None:
        assert self.dirpath is not None
        plan = _SavePlan()
        if self.save_last:
            plan.last = self._last_target(plan)
        if top_k and self.save_top_k != 0:
            score = self._score(trainer)
            if score is not None:
                name = self._format_name(trainer)
                # A name this run saved under before is replaced (a template without {step}); any other is new.
                own = self._own_path(name)
                kept = {p: s for p, s in self.best_k_models.items() if p != own}
                enters = self.save_top_k == -1 or len(kept) < self.save_top_k
                worst = None if enters else self._worst(kept)
                if worst is not None and self._better(score, kept[worst]):
                    enters = True
                    (plan.remove if worst in self._written else plan.forget).append(worst)
                if enters:
                    plan.path, plan.score = own or self._claim(name, plan), score
        if plan.path is None and plan.last is None:
            return None
        return plan

    def _own_path(self, name: str) -> str | None:
        """The path this run already wrote a checkpoint called ``name`` under (``name`` or a ``-vN`` of it)."""
        for path in self._versions(name):
            if path in self._written:
                return path
            if not os.path.lexists(path):
                return None
        return None

    def _claim(self, name: str, plan: _SavePlan) -> str:
        """A new path for ``name`` that no other checkpoint holds, reserved until this save has written it."""
        assert self.dirpath is not None
        for path in self._versions(name):
            if claim_name(Path(path)):
                plan.claimed.append(path)
                if path != str(self.dirpath / f"{name}{CHECKPOINT_SUFFIX}") and not self._warned_of_names:
                    self._warned_of_names = True
                    warnings.warn(
                        f"ModelCheckpoint: {self.dirpath} already holds {name}{CHECKPOINT_SUFFIX}, which another run "
                        f"wrote (or is writing); this run saves its checkpoint as {Path(path).name} instead of "
                        "replacing it, and takes such a new name whenever a name is taken. Give each run its own "
                        "dirpath to keep the names apart.",
                        stacklevel=3,
                    )
                return path
        raise AssertionError("unreachable: _versions is endless")

    def _versions(self, name: str) -> Iterator[str]:
        assert self.dirpath is not None
        yield str(self.dirpath / f"{name}{CHECKPOINT_SUFFIX}")
        for version in itertools.count(1):
            yield str(self.dirpath / f"{name}-v{version}{CHECKPOINT_SUFFIX}")

    def _last_target(self, plan: _SavePlan) -> str:
        """Where this run's ``last`` checkpoint goes: chosen at its first save and kept; the ``last`` of the run
        it resumed from (restored :attr:`last_model_path`) is carried on, another run's is never replaced."""
        own = self._last_model_path
        if own in self._written:
            return own
        # What a checkpoint says is only trusted to name a `last` directly in this dirpath.
        if own and Path(own).parent == self.dirpath and _LAST.fullmatch(Path(own).name):
            return own
        return self._claim(LAST_NAME, plan)

    def _score(self, trainer: Trainer) -> float | None:
        if self.monitor is None:
            return float(trainer.global_step)
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            available = ", ".join(sorted(trainer.callback_metrics)) or "none yet"
            warnings.warn(
                f"ModelCheckpoint(monitor={self.monitor!r}) found no such metric at step {trainer.global_step} "
                f"(logged: {available}); no top-k checkpoint saved this time.",
                stacklevel=2,
            )
            return None
        return float(value)

    def _record(self, path: str, score: float | None) -> None:
        assert score is not None
        self.best_k_models[path] = score
        best = self._best(self.best_k_models)
        self.best_model_path, self.best_model_score = best, self.best_k_models[best]

    def _save_last(self, trainer: Trainer, last: str, linked_to: str | None) -> None:
        target = Path(last)
        if self.save_last == "link" and linked_to is not None:
            if trainer.is_global_zero:
                temporary = target.with_name(f".{target.name}.link")
                temporary.unlink(missing_ok=True)
                temporary.symlink_to(Path(linked_to).name)
                os.replace(temporary, target)
            trainer.strategy.barrier("ModelCheckpoint.save_last")
        else:
            # Not removed first: the save replaces the previous last (or a link) only once it is whole.
            trainer.save_checkpoint(target)

    def _format_name(self, trainer: Trainer) -> str:
        values: dict[str, Any] = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        values.update({name: float(value) for name, value in trainer.callback_metrics.items()})

        def fill(match: re.Match[str]) -> str:
            name, spec = match.group(1), match.group(2) or ""
            value = values.get(name, math.nan)
            return f"{name.replace('/', '_')}={format(value, spec)}"

        return _PLACEHOLDER.sub(fill, self.filename)

    def _better(self, score: float, than: float) -> bool:
        return self._rank(score) < self._rank(than)

    def _best(self, scores: dict[str, float]) -> str:
        return min(scores, key=lambda path: self._rank(scores[path]))

    def _worst(self, scores: dict[str, float]) -> str:
        return max(scores, key=lambda path: self._rank(scores[path]))

    def _rank(self, score: float) -> float:
        """Smaller is better. NaN is the worst score there is: compared as it is, it would be neither better nor
        worse than any other, and a NaN kept first would never leave the top k."""
        if math.isnan(score):
            return math.inf
        return score if self._minimizing else -score

    @property
    def _minimizing(self) -> bool:
        # Without a monitor the score is the step, and the most recent checkpoints are kept.
        return self.monitor is not None and self.mode == "min"

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "dirpath": str(self.dirpath) if self.dirpath is not None else None,
            "best_k_models": dict(self.best_k_models),
            "best_model_path": self._best_model_path,
            "best_model_score": self.best_model_score,
            "last_model_path": self._last_model_path,
            "last_saved_step": self._last_saved_step,
            "writer": self._writer,
            "written": sorted(self._written),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.dirpath is not None and state["dirpath"] is not None and Path(state["dirpath"]) != self.dirpath:
            # Another directory: its files are not ours to rank or remove.
            return
        if state["dirpath"] is not None:
            self.dirpath = Path(state["dirpath"])
        self.best_k_models = {str(path): float(score) for path, score in state["best_k_models"].items()}
        self.best_model_path = state["best_model_path"]
        self.best_model_score = state["best_model_score"]
        self.last_model_path = state["last_model_path"]
        self._last_saved_step = int(state["last_saved_step"])
        if state.get("writer") == self._writer:
            self._written = {str(path) for path in state.get("written", [])}


def default_checkpoint_root(default_root_dir: str | os.PathLike[str]) -> Path:
    """The directory holding every fit's ``version_N`` checkpoint directory."""
    return Path(default_root_dir) / CHECKPOINTS_DIRECTORY


def find_last_checkpoint(dirpath: Path) -> Path | None:
    """The newest complete checkpoint in ``dirpath`` or in its ``version_N`` directories; ``None`` if there is none.

    Newest by modification time: a checkpoint appears under its name only once it is whole, so a
    ``last.ckpt`` left from an earlier save point loses to a checkpoint written after it. Names a
    write in progress uses (hidden) and links to nothing are skipped.
    """
    candidates = [entry for directory in [dirpath, *_version_directories(dirpath)] for entry in _checkpoints(directory)]
    return max(candidates, key=lambda entry: entry[1], default=(None, 0))[0]


def _checkpoints(directory: Path) -> list[tuple[Path, int]]:
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.name.endswith(CHECKPOINT_SUFFIX) and not entry.name.startswith("."):
            try:
                found.append((entry, entry.stat().st_mtime_ns))
            except OSError:
                continue
    return found


def _version_directories(root: Path) -> list[Path]:
    try:
        return [entry for entry in root.iterdir() if _VERSION.fullmatch(entry.name) and entry.is_dir()]
    except OSError:
        return []
