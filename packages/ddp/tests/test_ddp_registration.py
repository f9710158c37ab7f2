"""The names stratagem-ddp registers, and that discovering them stays light."""

import subprocess
import sys

import pytest

import stratagem
from stratagem import registry
from stratagem.launchers import InProcessLauncher, MultiprocessingLauncher, SubprocessLauncher
from stratagem.registry.first_party import PACKAGES
from stratagem_ddp import DataParallelStrategy, DDPStrategy

DDP_NAMES = {
    "ddp": ("popen", SubprocessLauncher),
    "ddp_spawn": ("spawn", MultiprocessingLauncher),
    "ddp_fork": ("fork", MultiprocessingLauncher),
    "ddp_notebook": ("fork", MultiprocessingLauncher),
}


def test_registered_names_are_exactly_the_first_party_catalogue():
    catalogue = next(package for package in PACKAGES if package.distribution == "stratagem-ddp")
    strategies = registry.strategies
    ours = {name for name in strategies.names() if strategies.get(name).distribution == "stratagem-ddp"}
    assert ours == set(catalogue.names["strategy"])


@pytest.mark.parametrize("name", sorted(DDP_NAMES))
@pytest.mark.parametrize(
    ("suffix", "find_unused"),
    [("", False), ("_find_unused_parameters_true", True), ("_find_unused_parameters_false", False)],
)
def test_each_ddp_name_resolves_to_its_start_method_and_launcher(name, suffix, find_unused):
    full_name = name + suffix
    strategy = stratagem.resolve(strategy=full_name, accelerator="cpu", devices=2)
    start_method, launcher_type = DDP_NAMES[name]
    assert isinstance(strategy, DDPStrategy)
    assert strategy.start_method == start_method
    assert strategy.find_unused_parameters is find_unused
    assert isinstance(strategy.launcher, launcher_type)
    assert strategy.process_group_backend == "gloo"
    assert strategy.world_size == 2


def test_dp_is_registered_with_its_own_class_and_runs_in_process():
    assert registry.strategies.load_target("dp") is DataParallelStrategy
    assert isinstance(DataParallelStrategy().launcher, InProcessLauncher)


def test_discovering_the_plugin_imports_neither_torch_nor_the_strategies():
    code = (
        "import sys; from importlib.metadata import entry_points; "
        "[ep.load() for ep in entry_points(group='stratagem.strategies') if ep.dist.name == 'stratagem-ddp']; "
        "print(sorted(m for m in ('torch', 'stratagem_ddp.strategy', 'stratagem_ddp.dp') if m in sys.modules))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert output.stdout.strip() == "[]"
