"""What every XLA strategy adds to the strategy it is built on (:class:`XLAStrategyBase`, placed before that
strategy among a class's bases)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from stratagem.strategies import DefersHostReads, FeedsBatchesToDevice, Strategy
from stratagem_xla import runtime, stepping


class XLAStrategyBase(Strategy, FeedsBatchesToDevice, DefersHostReads):
    """Available where torch_xla loads; modules built on the CPU (the precision's dtype) and moved to the device
    when set up; batches fed through torch_xla's parallel loader, which ends each step's traced graph;
    ``debug=True`` prints XLA's metrics report when the run ends. Step results stay on the device
    (:class:`~stratagem.strategies.DefersHostReads`): reading each step's loss on the host would cut XLA's traced
    graph and wait for the device every step."""

    debug: bool

    @staticmethod
    def is_available() -> bool:
        return runtime.load_problem() is None

    @staticmethod
    def unavailable_reason() -> str:
        return runtime.load_problem() or ""

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        with stepping.cpu_module_init(self.precision, empty_init):
            yield

    def device_batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        return stepping.feed(batches, self.root_device)

    def teardown(self) -> None:
        super().teardown()
        if self.debug:
            stepping.print_debug_metrics()
