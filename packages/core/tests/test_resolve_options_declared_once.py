"""resolve()'s options are declared once: ``ResolveOptions`` names them as resolve's signature types them, and the
Trainer and Runtime take them through it while still showing resolve's parameters, with its defaults."""

import inspect

import pytest

import stratagem
from stratagem.connector import ResolveOptions, WiringOptions, wiring_options


def _texts(annotations: dict) -> dict[str, str]:
    return {name: getattr(annotation, "__forward_arg__", annotation) for name, annotation in annotations.items()}


def test_resolve_options_are_resolves_parameters_typed_as_its_signature_types_them():
    parameters = inspect.signature(stratagem.resolve).parameters
    assert _texts(ResolveOptions.__annotations__) == {
        name: parameter.annotation for name, parameter in parameters.items()
    }
    assert set(ResolveOptions.__annotations__) - set(WiringOptions.__annotations__) == {"strategy"}


@pytest.mark.parametrize("owner", [stratagem.Trainer, stratagem.Runtime])
def test_the_trainer_and_runtime_show_resolves_parameters_with_its_defaults(owner):
    shown = inspect.signature(owner).parameters
    for name, parameter in inspect.signature(stratagem.resolve).parameters.items():
        assert (shown[name].default, shown[name].kind) == (parameter.default, inspect.Parameter.KEYWORD_ONLY), name
    assert not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in shown.values())


@pytest.mark.parametrize("owner", [stratagem.Trainer, stratagem.Runtime])
def test_a_keyword_neither_they_nor_resolve_take_is_refused_by_their_name_with_the_closest(owner):
    with pytest.raises(
        TypeError, match=rf"{owner.__name__}\(\) got an unexpected keyword argument 'devics'; did you mean 'devices'\?"
    ):
        owner(accelerator="cpu", devics=1)


def test_the_options_besides_the_strategy_are_what_another_strategy_is_resolved_with():
    given: ResolveOptions = {"strategy": "auto", "accelerator": "cpu", "devices": 2, "layout": "tp=2"}
    assert wiring_options(given) == {"accelerator": "cpu", "devices": 2, "layout": "tp=2"}
