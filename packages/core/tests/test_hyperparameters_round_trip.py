"""Every hyperparameter save_hyperparameters() accepts loads back with load_from_checkpoint under the default
weights_only=True; what could not is refused when save_hyperparameters() is called, naming the argument."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections import OrderedDict
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
import torch
from torch import nn

import stratagem
from stratagem import Module
from stratagem.checkpoint_io import CheckpointError


class Regressor(Module):
    def __init__(self, hidden: int = 4, **extra: object) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(3, hidden)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Config:
    lr: float = 0.1


# What each value is stored (and loaded back) as.
KEPT = {
    "path": (Path("/data/train"), "/data/train"),
    "pure_path": (PurePosixPath("runs/a"), "runs/a"),
    "float64": (np.float64(0.25), 0.25),
    "float32": (np.float32(0.5), 0.5),
    "int64": (np.int64(7), 7),
    "bool_": (np.bool_(True), True),
    "numpy_str": (np.str_("adam"), "adam"),
    "none": (None, None),
    "tuple": ((1, 2.5, "x"), (1, 2.5, "x")),
    "nested": ({"a": {"b": [Path("c"), np.int32(3)]}, 1: None}, {"a": {"b": ["c", 3]}, 1: None}),
    "ordered": (OrderedDict(x=1), OrderedDict(x=1)),
    "set": ({1, 2}, {1, 2}),
    "list_of_tuples": ([(1, Path("p"))], [(1, "p")]),
    "complex": (1 + 2j, 1 + 2j),
    "bytes": (b"\x00\x01", b"\x00\x01"),
    "infinity": (float("inf"), float("inf")),
    "dtype": (torch.bfloat16, torch.bfloat16),
    "device": (torch.device("cpu"), torch.device("cpu")),
    "size": (torch.Size([2, 3]), torch.Size([2, 3])),
    "tensor": (torch.arange(3), torch.arange(3)),
}


def _equal(left: object, right: object) -> bool:
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and torch.equal(left, right)
    return type(left) is type(right) and left == right


def test_a_catalogue_of_common_hyperparameters_saves_and_loads_back_weights_only(tmp_path):
    module = Regressor(hidden=5, **{name: given for name, (given, _) in KEPT.items()})
    for name, (_, stored) in KEPT.items():
        assert _equal(module.hparams[name], stored), name
    trainer = stratagem.Trainer(
        strategy="single_device", accelerator="cpu", devices=1, max_steps=1, default_root_dir=tmp_path, logger=False,
        enable_progress_bar=False,
    )  # fmt: skip
    trainer.fit(module, [torch.randn(2, 3)])
    loaded = Regressor.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
    assert loaded.net.out_features == 5
    for name, (_, stored) in KEPT.items():
        assert _equal(loaded.hparams[name], stored), name


def _nested(depth: int) -> list[object]:
    value: list[object] = [1]
    for _ in range(depth):
        value = [value]
    return value


REFUSED = {
    "enum": (Colour.RED, r"an enum member \(.*Colour\).*pass its value \('red'\)"),
    "dataclass": (Config(), r"a dataclass \(.*Config\).*dataclasses.asdict"),
    "module": (nn.Linear(1, 1), r"torch.nn.modules.linear.Linear.*weights already"),
    "array": (np.zeros(2), r"numpy.ndarray.*tolist\(\)"),
    "function": (len, r"a function \(builtins.len\)"),
    "class": (nn.ReLU, r"a class \(torch.nn.modules.activation.ReLU\)"),
    "in_a_list": ([1, [Colour.RED]], r"argument 'in_a_list'\[1\]\[0\] is an enum member"),
    "tuple_key": ({(1, 2): 3}, r"a key of argument 'tuple_key' is of type tuple"),
    "int_enum_key": ({"a": {Colour.RED: 1}}, r"a key of argument 'int_enum_key'\['a'\]"),
    "deep": (_nested(60), r"nested more than 50 levels"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_a_weights_only_load_cannot_read_back_is_refused_at_save_hyperparameters_naming_it(name):
    value, detail = REFUSED[name]
    with pytest.raises(TypeError, match=rf"save_hyperparameters\(\): .*{name}.*") as raised:
        Regressor(**{name: value})
    assert re.search(detail, str(raised.value)), str(raised.value)
    assert f"ignore=[{name!r}]" in str(raised.value)


def test_a_value_set_on_hparams_later_is_stored_alike():
    module = Regressor()
    module.hparams.root = Path("/x")
    assert module.hparams.root == "/x"
    with pytest.raises(TypeError, match="argument 'mode' is an enum member"):
        module.hparams["mode"] = Colour.RED
    with pytest.raises(TypeError, match="argument 'config' is a dataclass"):
        module.hparams.update(ok=1, config=Config())
    assert "ok" not in module.hparams  # a refused update leaves hparams as they were


def _checkpoint_with_hparams(tmp_path: Path, hparams: object) -> Path:
    path = tmp_path / "crafted.ckpt"
    torch.save({"module": Regressor().state_dict(), "hyper_parameters": hparams}, path)
    return path


@pytest.mark.parametrize(
    ("saved", "shown"),
    [
        ([1, 2, 3], r"\[1, 2, 3\] \(a list\)"),
        (torch.ones(3), r"tensor\(.*\) \(a Tensor\)"),
        ({1: 2}, r"\{1: 2\} \(a dict\)"),
    ],
)
def test_hyperparameters_that_are_not_a_dict_of_names_name_the_file_and_what_they_are(tmp_path, saved, shown):
    path = _checkpoint_with_hparams(tmp_path, saved)
    with pytest.raises(CheckpointError, match=rf"crafted.ckpt.*'hyper_parameters' entry is {shown}"):
        Regressor.load_from_checkpoint(path)


def test_a_huge_saved_hyperparameter_is_not_echoed_whole_into_the_error(tmp_path):
    class Narrow(Regressor):
        def __init__(self, hidden: int = 4) -> None:
            super().__init__(hidden)

    path = _checkpoint_with_hparams(tmp_path, {"hidden": 4, "tag": "\x1b[2J" + "x" * (50 << 20)})
    with pytest.raises(TypeError, match="cannot call Narrow") as raised:
        Narrow.load_from_checkpoint(path)
    message = str(raised.value)
    assert len(message) < 2000
    assert "\x1b" not in message
