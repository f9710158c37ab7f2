"""The example plugins in examples/ (local_sgd, env_precision) resolve by name, as an installed plugin would.

They are made visible through dist-info folders written from their pyproject.toml (no pip, nothing
installed into the environment), and the registries discover afresh.
"""

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem import Module, Trainer, registry
from stratagem.connector import detect_environment
from stratagem.registry import Registry, _builtins
from stratagem.testing.plugins import write_distribution_of_project

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture
def examples_installed(tmp_path, monkeypatch):
    for project in ("local_sgd", "env_precision"):
        monkeypatch.syspath_prepend(str(write_distribution_of_project(tmp_path, EXAMPLES / project)))
    monkeypatch.syspath_prepend(str(tmp_path))
    for attribute, builtins in {
        "strategies": _builtins.register_strategies,
        "precisions": _builtins.register_precisions,
        "environments": _builtins.register_environments,
    }.items():
        current = getattr(registry, attribute)
        monkeypatch.setattr(registry, attribute, Registry(current.kind, current.group, builtins))
    yield
    for name in [name for name in sys.modules if name.startswith(("stratagem_local_sgd", "stratagem_example_env"))]:
        del sys.modules[name]


def test_the_example_local_sgd_strategy_resolves_with_its_default_period(examples_installed):
    assert registry.strategies.get("local_sgd").distribution == "stratagem-local-sgd"
    strategy = stratagem.resolve(strategy="local_sgd", accelerator="cpu", devices=2)
    assert type(strategy).__name__ == "LocalSGDStrategy"
    assert strategy.average_every == 4


def test_the_example_local_sgd_strategy_refuses_a_period_below_one(examples_installed):
    with pytest.raises(ValueError, match=r"average_every=0.*positive int"):
        registry.strategies.create("local_sgd", average_every=0)


def test_the_example_precision_resolves_as_exact_fp32(examples_installed):
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", precision="32-finite")
    assert type(strategy.precision).__name__ == "FiniteLossPrecision"
    assert strategy.precision.exact is True


class _NaNLoss(Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum() * float("nan")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_example_precision_stops_training_at_a_non_finite_loss(examples_installed, tmp_path):
    trainer = Trainer(
        strategy="single_device",
        accelerator="cpu",
        precision="32-finite",
        max_steps=1,
        # The Trainer's own check (nonfinite="error") would stop the run before the precision's backward sees it.
        nonfinite="ignore",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    data = DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)
    with pytest.raises(FloatingPointError, match="32-finite"):
        trainer.fit(_NaNLoss(), data)


def test_the_example_environment_is_detected_from_its_variables(examples_installed, monkeypatch):
    monkeypatch.setenv("EXAMPLE_SCHEDULER_RANK", "1")
    monkeypatch.setenv("EXAMPLE_SCHEDULER_WORLD_SIZE", "2")
    monkeypatch.setenv("EXAMPLE_SCHEDULER_PORT", "29555")
    environment = detect_environment()
    assert type(environment).__name__ == "ExampleSchedulerEnvironment"
    assert (environment.global_rank(), environment.world_size(), environment.main_port) == (1, 2, 29555)


def test_the_example_environment_is_not_detected_without_its_variables(examples_installed, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "PORT"):
        monkeypatch.delenv(f"EXAMPLE_SCHEDULER_{name}", raising=False)
    assert type(detect_environment()).__name__ != "ExampleSchedulerEnvironment"
