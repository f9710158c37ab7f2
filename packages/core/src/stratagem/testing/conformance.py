"""The strategy conformance kit: does a registered strategy behave as the Trainer expects?

A strategy author subclasses :class:`StrategyConformance` in a pytest module::

    from stratagem.testing.conformance import StrategyConformance

    class TestMyStrategy(StrategyConformance):
        strategy = "my_strategy"
        devices = 2

and pytest runs every check: the name resolves; ``fit`` trains and hands back weights and
metrics; collectives give the documented results; weights match ``single_device`` on the same
global batch; ``validate`` from a checkpoint reports metrics, and the same checkpoint loaded
into ``single_device`` validates alike; resuming from a mid-run checkpoint ends with bitwise
identical weights. Weights are compared through checkpoints loaded into ``single_device``, the
one form every strategy's weights can take after a run (a sharded module's process group is
gone once ``fit`` returns). All checks run
in one fresh process (:mod:`stratagem.testing.conformance_checks`) per class, started the way a
user's script would be, so launchers that re-run the command work too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

CHECKS: tuple[str, ...] = (
    "resolves",
    "fit_trains_and_returns_weights",
    "validate_reports_metrics",
    "checkpoint_loads_into_single_device",
    "matches_single_device",
    "resume_continues_exactly",
)


class ConformanceError(RuntimeError):
    """The conformance run itself did not finish (the strategy crashed or hung)."""


def run_conformance(
    strategy: str,
    devices: int = 2,
    accelerator: str = "cpu",
    precision: str = "32-true",
    tolerance: float | None = 1e-5,
    timeout: float = 600.0,
    workdir: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Run every check on ``strategy`` in a fresh process; return ``{check: {"ok": bool, "detail": str}}``.

    ``tolerance`` bounds the difference from single-device weights (``None`` skips that check,
    for strategies that change numerics on purpose).
    """
    workdir = Path(workdir or tempfile.mkdtemp(prefix="stratagem-conformance-"))
    command = [
        sys.executable,
        "-m",
        "stratagem.testing.conformance_checks",
        "--strategy",
        strategy,
        "--devices",
        str(devices),
        "--accelerator",
        accelerator,
        "--precision",
        precision,
        "--tolerance",
        str(-1.0 if tolerance is None else tolerance),
        "--out",
        str(workdir / "out"),
    ]
    environment = dict(os.environ)
    for variable in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT"):
        environment.pop(variable, None)
    try:
        finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise ConformanceError(f"the conformance run of {strategy!r} did not finish within {timeout:.0f} s") from error
    report_path = workdir / "out" / "report.json"
    if finished.returncode != 0 or not report_path.exists():
        raise ConformanceError(
            f"the conformance run of {strategy!r} exited with code {finished.returncode}:\n"
            f"{finished.stdout[-4000:]}\n{finished.stderr[-8000:]}"
        )
    report: dict[str, dict[str, Any]] = json.loads(report_path.read_text())
    report.pop("_meta", None)
    return report


try:
    import pytest
except ImportError:  # the kit's runner works without pytest; only the test class needs it
    pytest = None  # type: ignore[assignment]


if pytest is not None:

    class StrategyConformance:
        """Subclass in a test module, set :attr:`strategy` (and :attr:`devices`), and pytest checks it."""

        strategy: ClassVar[str]
        devices: ClassVar[int] = 2
        accelerator: ClassVar[str] = "cpu"
        precision: ClassVar[str] = "32-true"
        tolerance: ClassVar[float | None] = 1e-5
        timeout: ClassVar[float] = 600.0

        @pytest.fixture(scope="class")
        @classmethod
        def conformance_report(cls, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
            return run_conformance(
                cls.strategy,
                devices=cls.devices,
                accelerator=cls.accelerator,
                precision=cls.precision,
                tolerance=cls.tolerance,
                timeout=cls.timeout,
                workdir=tmp_path_factory.mktemp("conformance"),
            )

        @pytest.mark.parametrize("check", CHECKS)
        def test_strategy_conforms(self, conformance_report: dict[str, dict[str, Any]], check: str) -> None:
            if check not in conformance_report:
                failed_earlier = [name for name, result in conformance_report.items() if not result["ok"]]
                pytest.fail(f"{check} did not run because an earlier check failed: {failed_earlier}")
            result = conformance_report[check]
            assert result["ok"], f"{self.strategy}: {check} failed:\n{result['detail']}"
