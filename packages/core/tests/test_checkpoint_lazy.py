"""LazyCheckpoint: deferred entries are read when taken, by whatever means, and never before."""

from __future__ import annotations

import copy
import io
import json
import pickle

import pytest
import torch

from stratagem.checkpoint_io import LazyCheckpoint, TorchCheckpointIO, check_checkpoint
from stratagem.strategies import SingleDeviceStrategy


class CountedRead:
    def __init__(self, value: object) -> None:
        self.value, self.calls = value, 0

    def __call__(self) -> object:
        self.calls += 1
        return self.value


def lazy_checkpoint() -> tuple[LazyCheckpoint, CountedRead]:
    read = CountedRead({"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": [{"params": [0]}]})
    checkpoint = LazyCheckpoint(loops={"fit": {"epoch": 1}})
    checkpoint.defer("optimizers", read)
    return checkpoint, read


def test_key_lookups_read_nothing():
    checkpoint, read = lazy_checkpoint()
    assert "optimizers" in checkpoint
    assert len(checkpoint) == 2
    assert list(checkpoint) == ["loops", "optimizers"]
    assert list(checkpoint.keys()) == ["loops", "optimizers"]
    assert checkpoint.unread_keys() == ["optimizers"]
    assert checkpoint.read_entries() == {"loops": {"fit": {"epoch": 1}}}
    assert "not read yet" in repr(checkpoint)
    check_checkpoint(checkpoint, "lazy.pt", required=["optimizers"])
    assert read.calls == 0


def test_taking_an_entry_reads_it_once_and_keeps_it():
    checkpoint, read = lazy_checkpoint()
    first = checkpoint["optimizers"]
    assert checkpoint.get("optimizers") is first
    assert checkpoint.is_read("optimizers")
    assert read.calls == 1
    assert checkpoint.pop("optimizers") is first
    assert "optimizers" not in checkpoint


@pytest.mark.parametrize(
    "take",
    [
        dict,
        lambda checkpoint: {**checkpoint},
        lambda checkpoint: list(checkpoint.values()),
        lambda checkpoint: list(checkpoint.items()),
        lambda checkpoint: checkpoint.copy(),
        copy.copy,
        copy.deepcopy,
        lambda checkpoint: pickle.loads(pickle.dumps(checkpoint)),
        lambda checkpoint: (lambda **entries: entries)(**checkpoint),
        lambda checkpoint: checkpoint | {},
        lambda checkpoint: {} | checkpoint,
        lambda checkpoint: checkpoint.popitem()[1],
        lambda checkpoint: checkpoint.setdefault("optimizers"),
    ],
    ids=[
        "dict",
        "unpacking",
        "values",
        "items",
        "copy",
        "copy.copy",
        "deepcopy",
        "pickle",
        "keywords",
        "or",
        "ror",
        "popitem",
        "setdefault",
    ],
)
def test_every_way_of_taking_values_reads_the_deferred_ones(take):
    checkpoint, read = lazy_checkpoint()
    taken = take(checkpoint)
    assert read.calls == 1
    assert "not read yet" not in repr(taken)


def test_json_and_equality_see_read_values():
    checkpoint = LazyCheckpoint(epoch=1)
    checkpoint.defer("step", lambda: 7)
    other = LazyCheckpoint(epoch=1)
    other.defer("step", lambda: 7)
    assert checkpoint == {"epoch": 1, "step": 7}
    assert checkpoint == other
    assert json.loads(json.dumps(LazyCheckpoint.shallow_copy(other))) == {"epoch": 1, "step": 7}


def test_a_saved_lazy_checkpoint_loads_back_weights_only(tmp_path):
    checkpoint, _ = lazy_checkpoint()
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    torch.testing.assert_close(loaded["optimizers"]["state"][0]["exp_avg"], torch.ones(3))


def test_a_failing_read_raises_to_the_taker_and_leaves_the_entry_unread():
    checkpoint = LazyCheckpoint()

    def broken() -> object:
        raise ValueError("shard 1 is truncated")

    checkpoint.defer("optimizers", broken)
    with pytest.raises(ValueError, match="truncated"):
        checkpoint["optimizers"]
    assert checkpoint.unread_keys() == ["optimizers"]


def test_shallow_copy_keeps_entries_unread():
    checkpoint, read = lazy_checkpoint()
    copied = LazyCheckpoint.shallow_copy(checkpoint)
    copied.pop("loops")
    assert copied.unread_keys() == ["optimizers"]
    assert "loops" in checkpoint
    assert read.calls == 0


class DeferringCheckpointIO(TorchCheckpointIO):
    """Defers every entry but the module, as a reader of sharded optimizer state would."""

    reads: list[str] = []

    def load_checkpoint(self, path, map_location="cpu", weights_only=True):
        whole = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        checkpoint = LazyCheckpoint(module=whole.pop("module"))
        for key, value in whole.items():
            checkpoint.defer(key, lambda key=key, value=value: self.reads.append(key) or value)
        return checkpoint


def test_loading_only_the_weights_leaves_what_the_reader_deferred_unread_until_taken(tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    TorchCheckpointIO().save_checkpoint(
        {"module": model.state_dict(), "optimizers": [optimizer.state_dict()], "loops": {}}, tmp_path / "c.pt"
    )
    strategy = SingleDeviceStrategy(checkpoint_io=DeferringCheckpointIO())
    DeferringCheckpointIO.reads = []
    fresh = torch.nn.Linear(2, 2)
    remaining = strategy.load_checkpoint(tmp_path / "c.pt", {"module": fresh})
    torch.testing.assert_close(fresh.weight, model.weight)
    assert DeferringCheckpointIO.reads == []
    assert sorted(remaining) == ["loops", "optimizers"]
    [state] = remaining["optimizers"]
    torch.testing.assert_close(state["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert DeferringCheckpointIO.reads == ["optimizers"]
