"""The strategy conformance kit: does a registered strategy behave as the Trainer expects?

A strategy author subclasses :class:`StrategyConformance` in a pytest module::

    from stratagem.testing.conformance import StrategyConformance

    class TestMyStrategy(StrategyConformance):
        strategy = "my_strategy"
        devices = 2

and pytest runs every check (:func:`~stratagem.testing.conformance_checks.check_names`): the name
resolves; ``fit`` trains; a strategy whose engine owns the training step (``OwnsTrainingStep``) is
never stepped by the Trainer, and its reported steps make ``global_step``; collectives give the
documented results; every rank holds rank 0's
weights right after ``setup_module`` although each rank seeded torch differently before building
the module, and again after the last step; ``validate`` from a checkpoint reports metrics, and the
same checkpoint loaded into ``single_device`` validates alike; every checkpoint holds the whole
weights the strategy held when it saved (not one rank's); weights match ``single_device`` on the
same global batch; resuming from each of :attr:`~StrategyConformance.resume_steps` ends with
bitwise identical weights; with ``accumulate_grad_batches=2`` (accumulated by the Trainer, or by
the strategy when it owns the step) weights match ``single_device`` with twice the batch.

A comparison that cannot be made (``tolerance=None``) is reported as skipped, with the reason.
How exactly results must agree is declared by the precision (:attr:`Precision.exact
<stratagem.precision.Precision.exact>`), not guessed from its name.

Weights are compared through checkpoints loaded into ``single_device``, the one form every
strategy's weights can take after a run (a sharded module's process group is gone once ``fit``
returns). All checks run in one fresh process (:mod:`stratagem.testing.conformance_checks`) per
class, started the way a user's script would be, so launchers that re-run the command work too,
and the same ranks serve every ``fit`` of the class.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from stratagem.testing.conformance_checks import DEFAULT_BLOCKS, DEFAULT_RESUME_STEPS, DEFAULT_STEPS, check_names
from stratagem.testing.processes import processes_with_variable, wait_until_no_process_has

RUN_MARKER_VARIABLE = "STRATAGEM_CONFORMANCE_RUN"
"""Set to a fresh value in the environment of each conformance run's processes."""


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
    strategy_options: Mapping[str, Any] | None = None,
    steps: int = DEFAULT_STEPS,
    resume_steps: Sequence[int] = DEFAULT_RESUME_STEPS,
    blocks: int = DEFAULT_BLOCKS,
) -> dict[str, dict[str, Any]]:
    """Run every check on ``strategy`` in a fresh process; return ``{check: {"ok", "skipped", "detail"}}``.

    ``tolerance`` bounds the difference from single-device weights (``None`` skips those comparisons,
    for strategies that change numerics on purpose). ``strategy_options`` are passed to the strategy
    (``registry.strategies.create(strategy, **strategy_options)``) and must be JSON values. The run
    trains ``steps`` optimizer steps and resumes from the checkpoint of each of ``resume_steps``. ``blocks``
    is the kit's module's block count (:func:`~stratagem.testing.conformance_checks.build_net`), more than 3 for
    a pipeline cut into more stages.
    """
    options = _checked_settings(devices, tolerance, strategy_options, steps, resume_steps)
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < DEFAULT_BLOCKS:
        raise ValueError(f"blocks={blocks!r} is not valid; expected an int of at least {DEFAULT_BLOCKS}.")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="stratagem-conformance-"))
    command = [
        sys.executable,
        "-m",
        "stratagem.testing.conformance_checks",
        "--strategy",
        strategy,
        "--strategy-options",
        options,
        "--devices",
        str(devices),
        "--accelerator",
        accelerator,
        "--precision",
        precision,
        "--tolerance",
        str(-1.0 if tolerance is None else tolerance),
        "--steps",
        str(steps),
        "--resume-steps",
        ",".join(str(step) for step in resume_steps),
        "--blocks",
        str(blocks),
        "--out",
        str(workdir / "out"),
    ]
    environment = dict(os.environ)
    for variable in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT"):
        environment.pop(variable, None)
    # Every process of the run inherits the marker, so that none outlives a run that is stopped.
    marker = uuid.uuid4().hex
    environment[RUN_MARKER_VARIABLE] = marker
    try:
        finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise ConformanceError(f"the conformance run of {strategy!r} did not finish within {timeout:.0f} s") from error
    finally:
        _end_processes_with(marker)
    report_path = workdir / "out" / "report.json"
    if finished.returncode != 0 or not report_path.exists():
        raise ConformanceError(
            f"the conformance run of {strategy!r} exited with code {finished.returncode}:\n"
            f"{finished.stdout[-4000:]}\n{finished.stderr[-8000:]}"
        )
    report: dict[str, dict[str, Any]] = json.loads(report_path.read_text())
    report.pop("_meta", None)
    return report


def _end_processes_with(marker: str) -> None:
    """End the ranks a stopped run left behind (they run in process groups of their own)."""
    for pid in processes_with_variable(RUN_MARKER_VARIABLE, marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_until_no_process_has(RUN_MARKER_VARIABLE, marker, timeout=10.0)


def _checked_settings(devices: Any, tolerance: Any, strategy_options: Any, steps: Any, resume_steps: Any) -> str:
    """Check the run's settings here, before any process starts; return the options as JSON."""
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"devices={devices!r} is not valid; expected a positive int.")
    if tolerance is not None and (not isinstance(tolerance, int | float) or tolerance < 0):
        raise ValueError(f"tolerance={tolerance!r} is not valid; expected a non-negative number or None.")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise ValueError(f"steps={steps!r} is not valid; expected an int of at least 2.")
    steps_accepted = f"expected distinct ints between 1 and steps - 1 = {steps - 1}"
    if isinstance(resume_steps, str | bytes) or not isinstance(resume_steps, Sequence):
        raise TypeError(f"resume_steps={resume_steps!r} is not valid; {steps_accepted}.")
    for step in resume_steps:
        if not isinstance(step, int) or isinstance(step, bool) or not 0 < step < steps:
            raise ValueError(f"resume_steps={resume_steps!r} is not valid: {step!r}; {steps_accepted}.")
    if len(set(resume_steps)) != len(resume_steps):
        raise ValueError(f"resume_steps={resume_steps!r} is not valid: it repeats a step; {steps_accepted}.")
    if strategy_options is not None and not isinstance(strategy_options, Mapping):
        raise TypeError(f"strategy_options={strategy_options!r} is not valid; expected a dict of option values.")
    try:
        return json.dumps(dict(strategy_options or {}))
    except TypeError as error:
        raise TypeError(
            f"strategy_options={strategy_options!r} is not valid: {error}. The kit passes them to a fresh "
            "process, so they must be JSON values (str, int, float, bool, None, lists and dicts of those)."
        ) from None


try:
    import pytest
except ImportError:  # the kit's runner works without pytest; only the test class needs it
    pytest = None  # type: ignore[assignment]


if pytest is not None:

    class StrategyConformance:
        """Subclass in a test module, set :attr:`strategy` (and :attr:`devices`), and pytest checks it.

        One class is one conformance run (one fresh script, whose ranks serve every check); each
        check is one test. A check that cannot be made for the class's settings is skipped with
        the reason.
        """

        strategy: ClassVar[str]
        """The registered name to check."""
        strategy_options: ClassVar[Mapping[str, Any]] = {}
        """Options passed to the strategy, as ``registry.strategies.create(strategy, **strategy_options)``
        (JSON values). Choose them so that the run shows what the strategy does: a strategy that syncs
        every K steps should sync at least once within :attr:`steps` and, for ``ranks_agree_after_fit``,
        at the last step (K dividing :attr:`steps`)."""
        devices: ClassVar[int] = 2
        accelerator: ClassVar[str] = "cpu"
        precision: ClassVar[str] = "32-true"
        tolerance: ClassVar[float | None] = 1e-5
        """Largest difference allowed from ``single_device`` weights on the same global batch; ``None`` skips
        those comparisons (for strategies that change numerics on purpose)."""
        steps: ClassVar[int] = DEFAULT_STEPS
        """Optimizer steps of the run."""
        resume_steps: ClassVar[Sequence[int]] = DEFAULT_RESUME_STEPS
        """Steps whose checkpoint a resumed run starts from; include steps between a periodic strategy's
        sync points (the default, 3 and 5 of 8, are not multiples of 2 or 4)."""
        timeout: ClassVar[float] = 600.0
        blocks: ClassVar[int] = DEFAULT_BLOCKS
        """Blocks of the kit's module: more than 3 for a pipeline cut into more stages (4 stages need 4)."""
        known_failures: ClassVar[Mapping[str, str]] = {}
        """Checks known to fail, each mapped to the reason (where the bug is tracked): reported as xfail.
        A known failure that passes fails its test, so that the entry is removed once the bug is fixed."""

        def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
            if "check" in metafunc.fixturenames:
                # The first check also waits for the whole run (the class fixture): give it the run's time.
                within_run_time = pytest.mark.timeout(self.timeout + 60)
                checks = [pytest.param(name, marks=within_run_time) for name in check_names(self.resume_steps)]
                metafunc.parametrize("check", checks)

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
                strategy_options=cls.strategy_options,
                steps=cls.steps,
                resume_steps=cls.resume_steps,
                blocks=cls.blocks,
            )

        def test_strategy_conforms(self, conformance_report: dict[str, dict[str, Any]], check: str) -> None:
            if check not in conformance_report:
                failed_earlier = [name for name, result in conformance_report.items() if not result["ok"]]
                pytest.fail(f"{check} did not run because an earlier check failed: {failed_earlier}")
            result = conformance_report[check]
            if result.get("skipped"):
                pytest.skip(f"{self.strategy}: {check}: {result['detail']}")
            if check in self.known_failures:
                if result["ok"]:
                    pytest.fail(f"{check} is listed in known_failures but passes now: remove it from the list.")
                pytest.xfail(f"{self.known_failures[check]}\n{result['detail']}")
            assert result["ok"], f"{self.strategy}: {check} failed:\n{result['detail']}"
