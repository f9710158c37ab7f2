"""``Module.load_pretrained``: safetensors weights matched to a module's state, read whole or in slices."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from stratagem.checkpoint_io.safetensors_export import write_safetensors_directory
from stratagem.checkpoint_io.safetensors_import import SafetensorsWeights, copy_whole, load_pretrained_weights


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embedding.weight
        self.register_buffer("scale", torch.ones(4))


def _saved(directory, module: nn.Module, max_shard_size: int = 10**9):
    write_safetensors_directory(module.state_dict(), directory, max_shard_size=max_shard_size)
    return directory


def test_weights_load_whole_from_one_file_or_from_shards_with_tied_weights_stored_once(tmp_path):
    torch.manual_seed(0)
    source = Tied()
    source.scale.fill_(3.0)
    for name, max_shard_size in (("one", 10**9), ("shards", 100)):
        target = Tied()
        with SafetensorsWeights(_saved(tmp_path / name, source, max_shard_size)) as weights:
            assert "head.weight" not in weights.names()
            load_pretrained_weights(target, weights, copy_whole)
        for key, value in source.state_dict().items():
            assert torch.equal(target.state_dict()[key], value), (name, key)
        assert target.head.weight is target.embedding.weight


def test_a_slice_is_read_without_the_rest(tmp_path):
    save_file({"w": torch.arange(24.0).reshape(4, 6)}, tmp_path / "model.safetensors")
    with SafetensorsWeights(tmp_path) as weights:
        assert weights.shape("w") == (4, 6)
        assert torch.equal(weights.read("w", (slice(2, 4), slice(1, 3))), torch.tensor([[13.0, 14.0], [19.0, 20.0]]))


def test_weights_that_do_not_fit_are_all_named_before_anything_is_copied(tmp_path):
    torch.manual_seed(0)
    state = Tied().state_dict()
    state.pop("norm.bias")
    state["extra.weight"] = torch.zeros(2)
    state["norm.weight"] = torch.ones(5)
    save_file(
        {key: value.contiguous() for key, value in state.items() if key != "head.weight"},
        tmp_path / "model.safetensors",
    )
    target = Tied()
    before = {key: value.clone() for key, value in target.state_dict().items()}
    with SafetensorsWeights(tmp_path) as weights, pytest.raises(ValueError, match="does not fit Tied") as raised:
        load_pretrained_weights(target, weights, copy_whole)
    message = str(raised.value)
    assert "missing from the files: norm.bias" in message
    assert "not in the module: extra.weight" in message
    assert "of another shape: norm.weight ([5] in the files, [4] in the module)" in message
    assert all(torch.equal(target.state_dict()[key], value) for key, value in before.items())


def test_a_directory_without_safetensors_weights_is_refused_naming_what_is_expected(tmp_path):
    with pytest.raises(ValueError, match=r"no model\.safetensors or model\.safetensors\.index\.json there"):
        SafetensorsWeights(tmp_path)
