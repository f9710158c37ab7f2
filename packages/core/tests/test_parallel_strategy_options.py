"""A parallel strategy's process-group options fail at construction (or when resolved), never once ranks start."""

from datetime import timedelta

import pytest
import torch.distributed as dist

import stratagem
from stratagem.launchers import InProcessLauncher, Launcher
from stratagem.strategies import ParallelStrategy


class _InProcessParallel(ParallelStrategy):
    """A parallel strategy that starts nothing."""

    @property
    def launcher(self) -> Launcher:
        return InProcessLauncher()


@pytest.fixture
def nccl_in_this_build(monkeypatch):
    """torch as a CUDA build would be: nccl compiled in (on a machine whose run may still be on the CPU)."""
    real = dist.is_backend_available
    monkeypatch.setattr(dist, "is_backend_available", lambda name: name == "nccl" or real(name))


@pytest.mark.parametrize("backend", ["foo", "glooo", "", "cpu:foo"])
def test_an_unknown_backend_is_refused_at_construction_listing_the_known_ones(backend):
    with pytest.raises(ValueError, match=rf"process_group_backend='{backend}' is not valid: .*knows no backend .*gloo"):
        _InProcessParallel(process_group_backend=backend)


def test_a_backend_missing_from_this_torch_build_is_refused_at_construction(monkeypatch):
    monkeypatch.setattr(dist, "is_backend_available", lambda name: name == "gloo")
    with pytest.raises(ValueError, match=r"process_group_backend='nccl' is not valid here: .*Available here: gloo\."):
        _InProcessParallel(process_group_backend="nccl")


def test_nccl_for_cpu_processes_is_refused_when_resolved(nccl_in_this_build):
    strategy = _InProcessParallel(process_group_backend="nccl")
    with pytest.raises(ValueError, match=r"process_group_backend='nccl' does not fit accelerator='cpu'.*\('gloo'\)"):
        stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)


def test_a_device_backend_map_must_name_the_accelerators_device_type(nccl_in_this_build):
    with pytest.raises(ValueError, match=r"'cuda:nccl' names no backend for the accelerator's 'cpu' devices"):
        stratagem.resolve(strategy=_InProcessParallel(process_group_backend="cuda:nccl"), accelerator="cpu", devices=2)
    resolved = stratagem.resolve(
        strategy=_InProcessParallel(process_group_backend="cpu:gloo,cuda:nccl"), accelerator="cpu", devices=2
    )
    assert resolved.process_group_backend == "cpu:gloo,cuda:nccl"


def test_a_backend_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"process_group_backend=3 \(int\) is not valid; expected None or .*gloo"):
        _InProcessParallel(process_group_backend=3)  # type: ignore[arg-type]


def test_a_backend_is_kept_in_torchs_spelling_and_unset_means_the_accelerators_default():
    assert _InProcessParallel(process_group_backend="GLOO")._process_group_backend == "gloo"
    resolved = stratagem.resolve(strategy=_InProcessParallel(), accelerator="cpu", devices=2)
    assert resolved.process_group_backend == "gloo"


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (-5, ValueError),
        (0, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        (1e300, ValueError),
        (timedelta(seconds=-1), ValueError),
        ("abc", TypeError),
        ("30", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_a_timeout_that_is_not_a_positive_duration_is_refused_at_construction(timeout, error):
    with pytest.raises(error, match=r"timeout=.* expected a positive number of seconds or a datetime\.timedelta"):
        _InProcessParallel(timeout=timeout)


@pytest.mark.parametrize(
    ("timeout", "expected"), [(5, timedelta(seconds=5)), (timedelta(minutes=2), timedelta(minutes=2))]
)
def test_a_timeout_in_seconds_or_as_a_timedelta_is_accepted(timeout, expected):
    assert _InProcessParallel(timeout=timeout).timeout == expected
