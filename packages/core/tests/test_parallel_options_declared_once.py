"""A backend takes ParallelStrategy's options as ``**parallel_options`` without re-declaring them: its signature,
the registry's option check and its errors still list every option it accepts."""

import inspect
from datetime import timedelta

import pytest
from typing_extensions import Unpack

from stratagem.launchers import InProcessLauncher, Launcher
from stratagem.strategies import (
    ParallelOptions,
    ParallelStrategy,
    SingleDeviceStrategy,
    StrategyOptions,
    split_parallel_options,
)


class _Backend(ParallelStrategy):
    def __init__(self, *, own_option: int = 1, **parallel_options: Unpack[ParallelOptions]) -> None:
        super().__init__(**parallel_options)
        self.own_option = own_option

    @property
    def launcher(self) -> Launcher:
        return InProcessLauncher()


class _PassThroughBackend(ParallelStrategy):
    def __init__(self, *, own_option: int = 1, **options: object) -> None:
        parallel_options, self.rest = split_parallel_options(dict(options))
        super().__init__(**parallel_options)

    @property
    def launcher(self) -> Launcher:
        return InProcessLauncher()


class _FixedPlacementBackend(ParallelStrategy):
    """Takes only the options of every Strategy: its environment and process group are its own."""

    def __init__(self, *, own_option: int = 1, **strategy_options: Unpack[StrategyOptions]) -> None:
        super().__init__(**strategy_options, timeout=5)

    @property
    def launcher(self) -> Launcher:
        return InProcessLauncher()


def test_a_backend_that_unpacks_fewer_options_than_its_base_takes_lists_and_accepts_only_those():
    parameters = inspect.signature(_FixedPlacementBackend).parameters
    assert list(parameters) == ["own_option", *StrategyOptions.__annotations__]
    with pytest.raises(TypeError, match=r"does not accept option\(s\) 'timeout'\. Accepted: accelerator, "):
        _FixedPlacementBackend(timeout=7)
    assert list(inspect.signature(SingleDeviceStrategy).parameters) == ["device", *StrategyOptions.__annotations__]


def test_the_signature_of_a_backend_lists_its_own_and_the_parallel_options():
    parameters = inspect.signature(_Backend).parameters
    assert next(iter(parameters)) == "own_option"
    assert set(ParallelOptions.__annotations__) <= set(parameters)
    assert parameters["timeout"].default == timedelta(minutes=30)
    assert not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())


def test_a_parallel_option_given_to_a_backend_reaches_parallel_strategy():
    backend = _Backend(own_option=3, timeout=12, start_method="spawn", process_group_backend="gloo")
    assert (backend.own_option, backend.timeout, backend.start_method) == (3, timedelta(seconds=12), "spawn")
    assert backend.process_group_backend == "gloo"


def test_an_unknown_option_names_the_backend_and_lists_what_it_accepts():
    with pytest.raises(TypeError, match=r"_Backend does not accept option\(s\) 'timout'\. Accepted: .*own_option"):
        _Backend(timout=5)


def test_lightnings_precision_plugin_is_refused_naming_precision():
    with pytest.raises(TypeError, match=r"_Backend\(precision_plugin=\.\.\.\) is Lightning's name; .* precision="):
        _Backend(precision_plugin=object())


def test_a_backend_with_its_own_catch_all_keeps_it_and_gets_the_parallel_options_split_off():
    parameters = inspect.signature(_PassThroughBackend).parameters
    assert "timeout" in parameters
    assert parameters["options"].kind is inspect.Parameter.VAR_KEYWORD
    backend = _PassThroughBackend(timeout=7, reshard=True)
    assert backend.timeout == timedelta(seconds=7)
    assert backend.rest == {"reshard": True}
