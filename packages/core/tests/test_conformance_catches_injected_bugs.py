"""The conformance kit, used as the docs recommend (one class, the strategy's default options), passes the
example local-SGD strategy (examples/local_sgd) and fails each of three bugs injected into it
(injected_local_sgd_bugs.py). The plugins are made visible through written dist-info folders, not pip."""

import os
from pathlib import Path

import pytest

from stratagem.testing.conformance import StrategyConformance, run_conformance
from stratagem.testing.plugins import write_distribution, write_distribution_of_project

LOCAL_SGD = Path(__file__).resolve().parents[3] / "examples" / "local_sgd"

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module", autouse=True)
def _plugins_on_path(tmp_path_factory):
    """The kit's processes (children of this one) discover local_sgd and the injected bugs."""
    directory = tmp_path_factory.mktemp("plugins")
    local_sgd_code = write_distribution_of_project(directory, LOCAL_SGD)
    write_distribution(
        directory,
        "stratagem-injected-bugs",
        {"stratagem.strategies": {"bugs": "injected_local_sgd_bugs:register"}},
    )
    paths = [str(directory), str(local_sgd_code), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
        yield


class TestLocalSGDConforms(StrategyConformance):
    # Local SGD changes numerics on purpose (ranks step alone between averages): its weights are not compared
    # with single_device's; every other check runs.
    strategy = "local_sgd"
    tolerance = None
    timeout = 600


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("bug", "caught_by"),
    [
        ("local_sgd_bug_never_averages", {"ranks_agree_after_fit"}),
        ("local_sgd_bug_no_initial_broadcast", {"ranks_agree_after_setup"}),
        (
            "local_sgd_bug_rank_zero_checkpoint",
            {"checkpoints_hold_the_whole_weights", "resume_from_step_3_continues_exactly"},
        ),
    ],
)
def test_the_recommended_conformance_class_fails_on_an_injected_local_sgd_bug(bug, caught_by, tmp_path):
    recommended = TestLocalSGDConforms
    report = run_conformance(
        bug,
        devices=recommended.devices,
        precision=recommended.precision,
        tolerance=recommended.tolerance,
        strategy_options=recommended.strategy_options,
        steps=recommended.steps,
        resume_steps=recommended.resume_steps,
        timeout=recommended.timeout,
        workdir=tmp_path,
    )
    failed = {name for name, result in report.items() if not result["ok"]}
    assert caught_by <= failed, f"{bug}: expected {sorted(caught_by)} to fail; failed: {sorted(failed)}"
