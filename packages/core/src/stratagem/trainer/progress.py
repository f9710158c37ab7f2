"""Where a fit is: the counters a checkpoint keeps so a resumed run continues exactly."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class FitProgress:
    """Loop counters of a fit.

    ``batches_in_epoch`` counts the batches of epoch ``epoch`` already trained on; a resumed
    run skips that many. ``epoch_finished`` is set once the epoch's last batch is done (its
    end-of-epoch work may still be running): a resumed run then starts the next epoch.
    ``total_batches`` counts batches over all epochs (for validation every N batches).
    """

    epoch: int = 0
    global_step: int = 0
    batches_in_epoch: int = 0
    epoch_finished: bool = False
    total_batches: int = 0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the counters in ``state``; a ``ValueError`` naming the field if one is missing, not a
        non-negative int (``epoch_finished``: not a bool), since a resumed loop counts on from them."""
        for field in fields(self):
            value = state.get(field.name)
            if field.type == "bool":
                valid = isinstance(value, bool)
            else:
                valid = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            if not valid:
                kind = "a bool" if field.type == "bool" else "a non-negative int"
                raise ValueError(f"{field.name} is {_describe(value)}, not {kind}")
        for field in fields(self):
            setattr(self, field.name, state[field.name])

    def start_next_epoch_if_finished(self) -> None:
        if self.epoch_finished:
            self.epoch += 1
            self.batches_in_epoch = 0
            self.epoch_finished = False


def _describe(value: object) -> str:
    """``value`` as an error may show it: it comes from a file, so only a number is shown whole."""
    if value is None:
        return "missing"
    if isinstance(value, int | float) and len(str(value)) <= 40:
        return str(value)
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class Throughput:
    """Optimizer steps taken by the last fit call, the wall time of its training loop, and each rank's peak memory."""

    steps: int = 0
    seconds: float = 0.0
    peak_memory_bytes: tuple[int | None, ...] = ()
    """Per rank, in rank order: the most memory the rank held during the fit's training loop, as its accelerator
    counts it (the CUDA allocator's peak of tensor memory; on the CPU the process's peak resident memory),
    ``None`` where the accelerator cannot tell."""

    @property
    def max_peak_memory_bytes(self) -> int | None:
        """The largest rank's :attr:`peak_memory_bytes`."""
        known = [value for value in self.peak_memory_bytes if value is not None]
        return max(known) if known else None

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0
