"""``stratagem consolidate --format safetensors``: a checkpoint's module weights as a Hugging Face model directory."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem.checkpoint_io.safetensors_export import (
    hugging_face_weights,
    parse_size,
    write_safetensors_directory,
)
from stratagem.cli.main import main


class TiedModel(nn.Module):
    """A language-model head sharing its weight with the input embedding, as GPT-2's does."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(16, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embedding.weight


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = TiedModel()


def _saved_checkpoint(path, module: nn.Module) -> None:
    TorchCheckpointIO().save_checkpoint({"module": module.state_dict(), "loops": {"step": 3}}, path)


def _read_directory(directory) -> dict[str, torch.Tensor]:
    index = directory / "model.safetensors.index.json"
    files = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        weights.update(load_file(directory / name))
    return weights


def test_export_strips_the_modules_attribute_and_writes_tied_weights_once(tmp_path):
    torch.manual_seed(0)
    module = Holder()
    _saved_checkpoint(tmp_path / "run.ckpt", module)
    assert main(["consolidate", str(tmp_path / "run.ckpt"), str(tmp_path / "hf"), "--format", "safetensors"]) == 0
    assert sorted(path.name for path in (tmp_path / "hf").iterdir()) == ["model.safetensors"]
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as file:
        assert file.metadata() == {"format": "pt"}
    weights = _read_directory(tmp_path / "hf")
    # head.weight is the embedding's memory: written once, under the first name, as save_pretrained does.
    assert sorted(weights) == ["body.bias", "body.weight", "embedding.weight"]
    for key, value in weights.items():
        assert torch.equal(value, module.model.state_dict()[key]), key


def test_large_weights_are_split_into_numbered_files_with_an_index_naming_each_keys_file(tmp_path):
    weights = {f"layer{number}.weight": torch.full((10, 10), float(number)) for number in range(5)}
    written = write_safetensors_directory(weights, tmp_path / "hf", max_shard_size=850)
    assert [path.name for path in written] == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": 5 * 400}
    assert index["weight_map"]["layer0.weight"] == "model-00001-of-00003.safetensors"
    assert index["weight_map"]["layer4.weight"] == "model-00003-of-00003.safetensors"
    read = _read_directory(tmp_path / "hf")
    assert set(read) == set(weights)
    assert all(torch.equal(read[key], value) for key, value in weights.items())


def test_a_tensor_larger_than_the_shard_size_gets_a_file_of_its_own(tmp_path):
    weights = {"small": torch.zeros(2), "large": torch.zeros(100), "last": torch.zeros(2)}
    written = write_safetensors_directory(weights, tmp_path / "hf", max_shard_size=40)
    assert len(written) == 4  # three files and the index
    assert set(_read_directory(tmp_path / "hf")) == set(weights)


def test_exporting_again_needs_overwrite_then_keeps_the_config_and_drops_the_old_shards(tmp_path):
    directory = tmp_path / "hf"
    write_safetensors_directory({f"w{n}": torch.zeros(100) for n in range(3)}, directory, max_shard_size=400)
    (directory / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match=r"already holds weights .*--overwrite"):
        write_safetensors_directory({"w": torch.ones(3)}, directory)
    write_safetensors_directory({"w": torch.ones(3)}, directory, overwrite=True)
    # A stale index or shard beside the new single file would make from_pretrained read old weights.
    assert sorted(path.name for path in directory.iterdir()) == ["config.json", "model.safetensors"]
    assert (directory / "config.json").read_text() == '{"model_type": "gpt2"}'
    assert torch.equal(_read_directory(directory)["w"], torch.ones(3))


def test_a_directory_holding_only_a_config_receives_the_weights_beside_it(tmp_path):
    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    write_safetensors_directory({"w": torch.ones(3)}, directory)
    assert sorted(path.name for path in directory.iterdir()) == ["config.json", "model.safetensors"]


def test_the_prefix_option_chooses_which_attribute_is_the_model():
    checkpoint = {"module": {"model.a": torch.zeros(1), "model.b.c": torch.zeros(1), "loss.weight": torch.ones(1)}}
    with pytest.raises(ValueError, match=r"several attributes \(loss, model\).*--prefix model\."):
        hugging_face_weights(checkpoint)
    assert sorted(hugging_face_weights(checkpoint, "model.")) == ["a", "b.c"]
    assert sorted(hugging_face_weights(checkpoint, "")) == ["loss.weight", "model.a", "model.b.c"]
    unknown = "--prefix='net.' matches no weight; the keys start with loss., model."
    with pytest.raises(ValueError, match=re.escape(unknown)):
        hugging_face_weights(checkpoint, "net.")


def test_entries_safetensors_cannot_hold_are_named():
    with pytest.raises(ValueError, match="are not: extra_state"):
        hugging_face_weights({"module": {"model.w": torch.zeros(1), "model.extra_state": {"a": 1}}})
    with pytest.raises(ValueError, match="no 'module' entry"):
        hugging_face_weights({"optimizers": []})


@pytest.mark.parametrize(
    ("text", "size"), [("5GB", 5 * 1000**3), ("500MB", 500 * 1000**2), ("2GiB", 2 * 1024**3), ("1234", 1234)]
)
def test_shard_sizes_are_read_as_transformers_writes_them(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "5 parsecs", "-1GB"])
def test_a_shard_size_that_is_not_one_is_refused_naming_the_option(text):
    with pytest.raises(ValueError, match="--max-shard-size"):
        parse_size(text)


def test_the_command_refuses_a_bad_shard_size_before_reading_the_checkpoint(tmp_path, capsys):
    _saved_checkpoint(tmp_path / "run.ckpt", Holder())
    arguments = ["consolidate", str(tmp_path / "run.ckpt"), str(tmp_path / "hf"), "--format", "safetensors"]
    assert main([*arguments, "--max-shard-size", "lots"]) == 2
    assert "--max-shard-size='lots'" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_the_command_writes_into_a_file_destination_never(tmp_path, capsys):
    _saved_checkpoint(tmp_path / "run.ckpt", Holder())
    (tmp_path / "out.pt").write_text("keep")
    assert main(["consolidate", str(tmp_path / "run.ckpt"), str(tmp_path / "out.pt"), "--format", "safetensors"]) == 2
    assert "is a file; --format safetensors writes a directory" in capsys.readouterr().err
    assert (tmp_path / "out.pt").read_text() == "keep"
