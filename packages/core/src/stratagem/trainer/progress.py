"""Where a fit is: the counters a checkpoint keeps so a resumed run continues exactly."""

from __future__ import annotations

from dataclasses import asdict, dataclass
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
        self.epoch = int(state["epoch"])
        self.global_step = int(state["global_step"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        self.epoch_finished = bool(state["epoch_finished"])
        self.total_batches = int(state["total_batches"])

    def start_next_epoch_if_finished(self) -> None:
        if self.epoch_finished:
            self.epoch += 1
            self.batches_in_epoch = 0
            self.epoch_finished = False


@dataclass(frozen=True)
class Throughput:
    """Optimizer steps taken by the last fit call and the wall time of its training loop."""

    steps: int = 0
    seconds: float = 0.0

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0
