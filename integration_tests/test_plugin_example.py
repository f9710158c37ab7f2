"""The third-party plugin example, installed beside a broken plugin, as a user would meet them."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from stratagem import registry
from stratagem.registry import Registry, _builtins

EXAMPLE = "stratagem-example-plugin"
BROKEN = "stratagem-broken-plugin"
BROKEN_MESSAGE = "stratagem-broken-plugin fails on purpose while registering"

_BUILTINS = {
    "strategies": _builtins.register_strategies,
    "accelerators": _builtins.register_accelerators,
    "precisions": _builtins.register_precisions,
    "environments": _builtins.register_environments,
    "checkpoint_io": _builtins.register_checkpoint_io,
}


@pytest.fixture
def plugins_on_path(installed_plugins, monkeypatch):
    """This process and its children see the installed plugins; the registries discover afresh."""
    monkeypatch.syspath_prepend(str(installed_plugins))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(installed_plugins), os.environ.get("PYTHONPATH")]))
    )
    fresh = {}
    for attribute, builtins in _BUILTINS.items():
        current = getattr(registry, attribute)
        fresh[attribute] = Registry(current.kind, current.group, builtins)
        monkeypatch.setattr(registry, attribute, fresh[attribute])
    monkeypatch.setattr(registry, "ALL", tuple(fresh.values()))
    yield installed_plugins
    for name in [
        name for name in sys.modules if name.startswith(("stratagem_example_plugin", "stratagem_broken_plugin"))
    ]:
        del sys.modules[name]


def _stratagem(*arguments):
    script = shutil.which("stratagem", path=os.path.dirname(sys.executable))
    assert script is not None, f"no 'stratagem' console script beside {sys.executable}"
    return subprocess.run([script, *arguments], capture_output=True, text=True, timeout=120, check=True)


def test_the_example_strategy_resolves_to_its_class_without_the_user_importing_it(plugins_on_path):
    code = textwrap.dedent(
        """
        import sys
        import stratagem
        from stratagem import registry

        assert "example_single_device" in registry.strategies.names()
        assert "stratagem_example_plugin.strategy" not in sys.modules, "discovery imported the strategy"
        assert "torch" not in sys.modules, "discovery imported torch"
        strategy = stratagem.resolve(strategy="example_single_device", accelerator="cpu")
        print(type(strategy).__module__, type(strategy).__name__)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["stratagem_example_plugin.strategy", "StepCountingStrategy"]


def test_the_registry_names_the_example_distribution_and_loads_its_class(plugins_on_path):
    registration = registry.strategies.get("example_single_device")
    assert registration.distribution == EXAMPLE
    assert registration.requires == "torch>=2.4"
    from stratagem_example_plugin.strategy import StepCountingStrategy

    assert registry.strategies.load_target("example_single_device") is StepCountingStrategy


def test_the_broken_plugin_is_recorded_and_does_not_stop_the_example_from_training(plugins_on_path, capsys):
    import stratagem

    [problem] = [problem for problem in registry.strategies.problems() if problem.distribution == BROKEN]
    assert problem.error == f"RuntimeError: {BROKEN_MESSAGE}"
    assert "broken_half_registered" not in registry.strategies

    strategy = stratagem.resolve(strategy="example_single_device", accelerator="cpu")
    model = strategy.setup_module(torch.nn.Linear(3, 1))
    [optimizer] = strategy.setup_optimizers([torch.optim.SGD(model.parameters(), lr=0.1)])
    for _ in range(2):
        strategy.backward(model(torch.ones(4, 3)).sum(), optimizer)
        strategy.optimizer_step(optimizer)
        strategy.zero_grad(optimizer)
    strategy.teardown()
    assert strategy.optimizer_steps == 2
    assert "example_single_device: 2 optimizer step(s)" in capsys.readouterr().err


def test_stratagem_strategies_lists_the_example_with_its_distribution(plugins_on_path):
    result = _stratagem("strategies", "--check")
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:] if line.strip()}
    assert rows["example_single_device"][:3] == ["example_single_device", EXAMPLE, "yes"]
    assert rows["single_device"][:3] == ["single_device", "stratagem", "yes"]
    assert "broken_half_registered" not in rows
    assert "1 plugin problem(s) in stratagem.strategies" in result.stderr

    listed = {row["name"]: row for row in json.loads(_stratagem("strategies", "--json").stdout)}
    assert listed["example_single_device"]["distribution"] == EXAMPLE
    assert listed["example_single_device"]["target"] == "stratagem_example_plugin.strategy:StepCountingStrategy"


def test_stratagem_doctor_reports_both_plugins_and_the_broken_ones_error(plugins_on_path):
    output = _stratagem("doctor").stdout
    plugins = output.split("plugins:")[1].split("problems:")[0]
    assert any(line.split()[:3] == [EXAMPLE, "0.1.0", "stratagem.strategies"] for line in plugins.splitlines())
    assert any(line.split()[:3] == [BROKEN, "0.1.0", "stratagem.strategies"] for line in plugins.splitlines())
    problems = output.split("problems:")[1]
    assert f"{BROKEN} [stratagem.strategies] broken = stratagem_broken_plugin:register" in problems
    assert f"RuntimeError: {BROKEN_MESSAGE}" in problems
