"""Every installed strategy against every other: fit, test and predict, then move the checkpoint.

Every registered strategy must resolve on this machine or be refused with a reason. For each
configuration that runs (one name each: names that differ only in how they launch share one; 2 gloo
ranks where it is parallel), and each precision it accepts: fit briefly and save, then validate,
test and predict with the same Trainer; the checkpoint validated under ``single_device`` gives the
loss the run itself reported. Each configuration's fp32 checkpoint is then validated under every
configuration, on 2 processes and, where the strategy is parallel, on 1, and must give the loss
``single_device`` gives for it. All parallel
runs share one pair of worker processes (and one single worker for world size 1), which the
strategies join as they would join torchrun's ranks.
"""

from __future__ import annotations

import math
import os

import matrix_runs
import pytest
from strategy_matrix import (
    PARALLEL_DEVICES,
    StrategyCase,
    available_accelerators,
    discover,
    distinct,
    supported_precisions,
)

from stratagem.testing import DistributedWorkers

# A fit or a row of loads takes seconds; the bound leaves room for a loaded machine.
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

WORKER_ENV = {
    "TORCHELASTIC_RUN_ID": "stratagem-matrix",
    "GROUP_RANK": "0",
    "OMP_NUM_THREADS": "1",
    "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
}
EXACT = {"rel": 1e-5, "abs": 1e-6}
# A run in a reduced precision is compared with its own fp32 reloading loosely: what matters there is
# that the checkpoint holds the trained weights, not bf16's rounding.
REDUCED = {"rel": 5e-2, "abs": 5e-2}

RUNNABLE, REFUSED = discover()
CONFIGURATIONS = distinct(RUNNABLE)
PRECISION_SOURCES = [
    (case, precision) for case in CONFIGURATIONS for precision in supported_precisions(case) if precision != "32-true"
]
# One name per configuration: names that differ only in how they launch (ddp_fork, ddp_spawn) join the same pair of
# workers here and fit, save and load through the same code, so rows under each would repeat the first one's (their
# launchers are their packages' tests). Every name is still resolved here (discover).
SOURCES = [(case, "32-true") for case in CONFIGURATIONS] + PRECISION_SOURCES


def _source_id(source: tuple[StrategyCase, str]) -> str:
    return f"{source[0].name}@{source[1]}"


@pytest.fixture(scope="module")
def pools():
    with (
        DistributedWorkers(PARALLEL_DEVICES, env=WORKER_ENV) as pair,
        DistributedWorkers(1, env=WORKER_ENV) as single,
    ):
        yield {PARALLEL_DEVICES: pair, 1: single}


def _run(pools, case: StrategyCase, function, *args, devices: int | None = None):
    devices = case.devices if devices is None else devices
    if not case.parallel:
        return function(*args)
    return pools[devices].run(function, *args, timeout=240)[0]


class MatrixRuns:
    """Each source's fit and its single_device reference loss, computed once, when first needed."""

    def __init__(self, pools, root) -> None:
        self.pools = pools
        self.root = root
        self._fits: dict[str, dict | Exception] = {}
        self._references: dict[str, float | str] = {}

    def fit(self, source: tuple[StrategyCase, str]) -> dict | Exception:
        key = _source_id(source)
        if key not in self._fits:
            case, precision = source
            try:
                self._fits[key] = _run(
                    self.pools,
                    case,
                    matrix_runs.fit_test_predict,
                    case.name,
                    case.accelerator,
                    case.devices,
                    precision,
                    str(self.root / key),
                )
            except Exception as error:
                self._fits[key] = error
        return self._fits[key]

    def checkpoints(self, sources) -> dict[str, str]:
        fits = {_source_id(source): self.fit(source) for source in sources}
        return {key: fit["checkpoint"] for key, fit in fits.items() if isinstance(fit, dict)}

    def reference(self, source_id: str, checkpoint: str) -> float | str:
        if source_id not in self._references:
            losses = matrix_runs.validate_checkpoints(
                "single_device", "cpu", 1, {source_id: checkpoint}, str(self.root / "ref")
            )
            self._references[source_id] = losses[source_id]
        return self._references[source_id]


@pytest.fixture(scope="module")
def runs(pools, tmp_path_factory):
    return MatrixRuns(pools, tmp_path_factory.mktemp("matrix"))


def _fit_outcome(runs, source) -> dict:
    outcome = runs.fit(source)
    if isinstance(outcome, Exception):
        pytest.fail(f"fit/validate/test/predict under {_source_id(source)} failed:\n{outcome}")
    return outcome


@pytest.mark.parametrize("source", SOURCES, ids=_source_id)
def test_fit_then_validate_test_predict_in_sequence(runs, source):
    case = source[0]
    outcome = _fit_outcome(runs, source)
    assert outcome["global_step"] == matrix_runs.FIT_STEPS
    assert outcome["checkpoint"], "the checkpoint callback saved nothing"
    assert math.isfinite(outcome["val_loss"]), outcome
    assert math.isfinite(outcome["test_loss"]), outcome
    assert outcome["predictions_finite"]
    per_rank = matrix_runs.SAMPLES // matrix_runs.BATCH_SIZE // (outcome["data_parallel_size"] or case.devices)
    assert outcome["predicted_batches"] == per_rank


@pytest.mark.parametrize("source", SOURCES, ids=_source_id)
def test_checkpoint_validates_under_single_device_like_the_run_that_saved_it(runs, source):
    outcome = _fit_outcome(runs, source)
    reloaded = runs.reference(_source_id(source), outcome["checkpoint"])
    assert isinstance(reloaded, float), reloaded
    tolerance = EXACT if source[1] in ("32-true", "64-true") else REDUCED
    assert reloaded == pytest.approx(outcome["val_loss"], **tolerance)


def _targets() -> list[tuple[StrategyCase, int]]:
    at_full_size = [(case, case.devices) for case in CONFIGURATIONS]
    at_one = [(case, 1) for case in CONFIGURATIONS if case.parallel]
    return at_full_size + at_one


def _sources_for(target: StrategyCase, devices: int):
    """The fp32 checkpoint of each configuration; other precisions are compared under single_device above."""
    return [source for source in SOURCES if source[1] == "32-true"]


@pytest.mark.parametrize(
    ("target", "devices"), _targets(), ids=lambda value: value.name if isinstance(value, StrategyCase) else str(value)
)
def test_every_checkpoint_validates_alike_under(pools, runs, tmp_path_factory, target, devices):
    checkpoints = runs.checkpoints(_sources_for(target, devices))
    expected = {source: runs.reference(source, path) for source, path in checkpoints.items()}
    root = str(tmp_path_factory.mktemp(f"load-{target.name}-{devices}"))
    losses = _run(
        pools,
        target,
        matrix_runs.validate_checkpoints,
        target.name,
        target.accelerator,
        devices,
        checkpoints,
        root,
        devices=devices,
    )
    mismatches = {
        source: (loss, expected[source])
        for source, loss in losses.items()
        if not (isinstance(loss, float) and loss == pytest.approx(expected[source], **EXACT))
    }
    assert not mismatches, (
        f"under {target.name} on {devices} process(es), these checkpoints did not validate like under "
        f"single_device (got, expected):\n" + "\n".join(f"  {source}: {pair}" for source, pair in mismatches.items())
    )
    assert len(losses) == len(checkpoints)


def test_every_registered_strategy_is_in_the_matrix_or_refused_with_a_reason():
    from stratagem import registry

    covered = {case.name for case in RUNNABLE}
    assert covered | set(REFUSED) == set(registry.strategies.names())
    assert all(reason for reason in REFUSED.values())
    assert len(covered) >= 1


def test_every_plugin_accelerator_available_here_runs_some_strategy_of_the_matrix():
    # With the vendors' stand-ins on the path, their accelerators are available and their strategies must run.
    from stratagem import registry

    plugins = {
        name
        for name in available_accelerators()
        if registry.accelerators.get(name).distribution != registry.registry.BUILTIN_DISTRIBUTION
    }
    assert plugins <= {case.accelerator for case in RUNNABLE}
