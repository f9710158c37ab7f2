"""What a user sees without PopTorch, and the settings ipu_strategy refuses before anything starts."""

import os
import subprocess
import sys

import pytest
import torch

from stratagem import Module, Trainer
from stratagem_ipu import IPUStrategy


def _without_poptorch(code: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)


def test_without_poptorch_the_names_are_listed_as_unavailable_with_why():
    listed = _without_poptorch("from stratagem.cli.main import main; main(['strategies']); main(['accelerators'])")
    assert "ipu_strategy: not available here: needs poptorch>=3.0" in listed.stdout
    assert "ipu: not available here: needs poptorch>=3.0" in listed.stdout
    assert "Poplar SDK" in listed.stdout


def test_without_poptorch_construction_says_what_is_missing():
    built = _without_poptorch("from stratagem_ipu import IPUStrategy; IPUStrategy()")
    assert "ModuleNotFoundError: ipu_strategy needs PopTorch" in built.stderr
    assert "Poplar SDK" in built.stderr
    resolved = _without_poptorch("from stratagem import Trainer; Trainer(strategy='ipu_strategy', accelerator='ipu')")
    assert "needs poptorch>=3.0, which is not installed" in resolved.stderr


def test_importing_the_package_and_discovering_its_names_imports_no_poptorch():
    standin = os.environ["PYTHONPATH"].split(os.pathsep)[0]
    code = (
        f"import sys; sys.path.insert(0, {standin!r}); import stratagem_ipu; from stratagem import registry; "
        "registry.strategies.names(); registry.accelerators.names(); print('poptorch' in sys.modules)"
    )
    assert _without_poptorch(code).stdout.strip() == "False"


class _TwoOptimizers(Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gradient_clip_val": 1.0}, r"gradient_clip_val=1.0 cannot work with strategy='ipu_strategy'"),
        ({"precision": "bf16-true"}, r"precision='bf16-true' is not supported by ipu_strategy; use one of 32-true"),
        ({"precision": "bf16-mixed"}, r"precision='bf16-mixed' needs torch.bfloat16 autocast, which 'ipu' does not"),
        ({"accelerator": "cpu"}, r"runs on accelerator='ipu', not 'cpu'"),
        ({"strategy": IPUStrategy(replication_factor=4)}, r"replication_factor=4 contradicts devices=2"),
    ],
)
def test_settings_that_cannot_work_are_refused_when_the_trainer_is_built(options, message):
    settings = {"strategy": "ipu_strategy", "accelerator": "ipu", "devices": 2, "logger": False}
    settings.update(options)
    with pytest.raises(ValueError, match=message):
        Trainer(**settings)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"device_iterations": 0}, ValueError, r"device_iterations=0 is not valid; expected a positive int"),
        ({"replication_factor": "2"}, ValueError, r"replication_factor='2' is not valid"),
        ({"autoreport": "yes"}, TypeError, r"autoreport='yes' is not valid; expected True or False"),
        ({"autoreport_dir": "reports"}, ValueError, r"autoreport_dir='reports' is given but autoreport=False"),
        ({"training_opts": {"deviceIterations": 2}}, TypeError, r"training_opts=.* expected a poptorch.Options"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, error, message):
    with pytest.raises(error, match=message):
        IPUStrategy(**options)


def test_options_that_contradict_the_user_s_poptorch_options_are_refused():
    import poptorch

    options = poptorch.Options().deviceIterations(4)
    with pytest.raises(ValueError, match=r"device_iterations=2 contradicts training_opts.device_iterations=4"):
        IPUStrategy(device_iterations=2, training_opts=options)
    accumulating = poptorch.Options()
    accumulating.Training.gradientAccumulation(4)
    strategy = IPUStrategy(training_opts=accumulating)
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=2 contradicts training_opts"):
        Trainer(strategy=strategy, accelerator="ipu", devices=2, accumulate_grad_batches=2, logger=False)


def test_more_than_one_optimizer_is_refused():
    from torch.utils.data import DataLoader, TensorDataset

    run = Trainer(strategy="ipu_strategy", accelerator="ipu", devices=2, logger=False, enable_progress_bar=False)
    data = DataLoader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), batch_size=2)
    with pytest.raises(ValueError, match=r"at most 1 optimizer"):
        run.fit(_TwoOptimizers(), data)
