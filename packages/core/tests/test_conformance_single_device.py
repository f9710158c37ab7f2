import pytest

from stratagem.testing.conformance import ConformanceError, StrategyConformance, run_conformance


class TestSingleDeviceConforms(StrategyConformance):
    strategy = "single_device"
    devices = 1
    timeout = 180


class TestSingleDeviceConformsInBf16(StrategyConformance):
    # Its validation loss, computed in bf16, is compared with an fp32 single_device one at bf16's tolerance;
    # its weights, trained in bf16, are not compared.
    strategy = "single_device"
    devices = 1
    precision = "bf16-mixed"
    tolerance = None
    timeout = 180


def test_conformance_run_of_an_unknown_strategy_fails_with_the_resolution_error(tmp_path):
    report = run_conformance("no_such_strategy", devices=1, timeout=120, workdir=tmp_path)
    assert report["resolves"]["ok"] is False
    assert "Unknown strategy 'no_such_strategy'" in report["resolves"]["detail"]
    assert "fit_trains_and_returns_weights" not in report


def test_conformance_run_that_does_not_finish_in_time_raises(tmp_path):
    with pytest.raises(ConformanceError, match="did not finish within"):
        run_conformance("single_device", devices=1, timeout=0.5, workdir=tmp_path)
