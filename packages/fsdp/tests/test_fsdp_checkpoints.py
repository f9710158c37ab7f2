"""FSDP checkpoints, sharded and full: saved on 2 ranks, loaded on 2, on 1, and by single_device; atomic writes."""

import argparse
import os

import pytest
import torch
from fsdp_testing import LEARNING_RATE, Block, Net, Opaque, build, global_batches, make_strategy, train
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.utils._pytree import tree_map

import stratagem
from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint
from stratagem.checkpoint_io.optimizer_state import to_index_keyed
from stratagem.checkpoint_io.sharded import DistributedCheckpointIO
from stratagem.cli import consolidate
from stratagem.testing import DistributedWorkers

pytestmark = pytest.mark.distributed

BEFORE, AFTER = global_batches(3, seed=1), global_batches(2, seed=2)
PLAIN_ENTRIES = {"loops": {"fit": {"step": 3}, "untouched": {}}, "note": "saved on 2 ranks"}


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


@pytest.fixture(scope="module")
def one_rank():
    with DistributedWorkers(1, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


def _save_then_continue(path, state_dict_type):
    """Train, save, and keep training: what a resumed run must reproduce."""
    strategy = make_strategy(state_dict_type=state_dict_type, auto_wrap_policy={Block})
    module, optimizer = build(strategy)
    train(strategy, optimizer, BEFORE)
    strategy.save_checkpoint(path, {"module": module, "optimizers": [optimizer], **PLAIN_ENTRIES})
    weights = strategy.module_full_state_dict()
    optimizer_state = get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True))
    optimizer_state = tree_map(
        lambda value: value.clone() if isinstance(value, torch.Tensor) else value, optimizer_state
    )
    continued = train(strategy, optimizer, AFTER)
    return {"weights": weights, "optimizer": to_index_keyed(optimizer_state), "continued": continued}


def _resume(path, devices, options=None, empty_init=None):
    strategy = make_strategy(devices=devices, **(options or {"auto_wrap_policy": {Block}}))
    module, optimizer = build(strategy, seed=99, empty_init=empty_init)
    remaining = strategy.load_checkpoint(path, {"module": module, "optimizers": [optimizer]})
    weights = strategy.module_full_state_dict()
    return {"remaining": remaining, "weights": weights, "continued": train(strategy, optimizer, AFTER)}


def _assert_same_weights(actual, expected):
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


def _assert_same_optimizer_state(actual, expected):
    assert actual["param_groups"] == expected["param_groups"]
    assert actual["state"].keys() == expected["state"].keys()
    for index, values in expected["state"].items():
        for name, value in values.items():
            assert torch.equal(torch.as_tensor(actual["state"][index][name]), torch.as_tensor(value)), (index, name)


@pytest.fixture(scope="module", params=["sharded", "full"])
def saved(request, workers, tmp_path_factory):
    """A checkpoint of each kind saved on 2 ranks, with what the run did afterwards."""
    path = tmp_path_factory.mktemp(request.param) / "checkpoint"
    original = workers.run(_save_then_continue, str(path), request.param)[0]
    return request.param, path, original


def test_sharded_checkpoint_is_a_directory_and_full_checkpoint_one_plain_file(saved):
    kind, path, original = saved
    if kind == "sharded":
        assert path.is_dir()
        assert {".metadata", "plain_state.pt"} <= set(os.listdir(path))
        assert not [name for name in os.listdir(path.parent) if name.startswith(".")]
    else:
        checkpoint = torch.load(path, weights_only=True)
        _assert_same_weights(checkpoint["module"], original["weights"])
        _assert_same_optimizer_state(checkpoint["optimizers"][0], original["optimizer"])


@pytest.mark.parametrize("empty_init", [None, True], ids=["initialised", "allocated_only"])
def test_checkpoint_resumes_exactly_on_two_ranks(saved, workers, empty_init):
    _, path, original = saved
    resumed = workers.run(_resume, str(path), 2, None, empty_init)
    _assert_same_weights(resumed[0]["weights"], original["weights"])
    for rank_result in resumed:
        assert rank_result["remaining"] == PLAIN_ENTRIES
        assert rank_result["continued"] == original["continued"]


def test_checkpoint_resumes_on_another_world_size(saved, one_rank):
    _, path, original = saved
    [resumed] = one_rank.run(_resume, str(path), 1)
    _assert_same_weights(resumed["weights"], original["weights"])
    assert resumed["remaining"] == PLAIN_ENTRIES
    assert resumed["continued"] == pytest.approx(original["continued"], rel=1e-5)


def test_checkpoint_resumes_under_another_sharding_strategy(saved, workers):
    _, path, original = saved
    resumed = workers.run(_resume, str(path), 2, {"sharding_strategy": "NO_SHARD"})[0]
    _assert_same_weights(resumed["weights"], original["weights"])
    assert resumed["continued"] == pytest.approx(original["continued"], rel=1e-5)


def test_checkpoint_loads_into_single_device_through_its_ordinary_load(saved):
    _, path, original = saved
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    module = strategy.setup_module(Net())
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE)])
    remaining = strategy.load_checkpoint(path, {"module": module, "optimizers": [optimizer]})
    assert remaining == PLAIN_ENTRIES
    _assert_same_weights(module.state_dict(), original["weights"])
    _assert_same_optimizer_state(optimizer.state_dict(), original["optimizer"])
    continued = []
    for batch in AFTER:
        loss = module.training_step(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        continued.append(loss.item())
    assert continued == pytest.approx(original["continued"], rel=1e-5)


def _resume_under_ddp(path):
    strategy = stratagem.resolve(strategy="ddp", accelerator="cpu", devices=2)
    strategy.setup_environment()
    torch.manual_seed(99)
    strategy.setup_module(Net())
    module = strategy.module
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE)])
    remaining = strategy.load_checkpoint(path, {"module": module, "optimizers": [optimizer]})
    weights = {key: value.clone() for key, value in module.state_dict().items()}
    return {"remaining": remaining, "weights": weights, "continued": train(strategy, optimizer, AFTER)}


def test_checkpoint_loads_into_ddp_through_its_ordinary_load(saved, workers):
    _, path, original = saved
    for resumed in workers.run(_resume_under_ddp, str(path)):
        assert resumed["remaining"] == PLAIN_ENTRIES
        _assert_same_weights(resumed["weights"], original["weights"])
        assert resumed["continued"] == pytest.approx(original["continued"], rel=1e-5)


def test_read_full_checkpoint_gives_the_plain_layout_without_a_process_group(saved):
    _, path, original = saved
    checkpoint = read_full_checkpoint(path, TorchCheckpointIO())
    assert {key: checkpoint[key] for key in PLAIN_ENTRIES} == PLAIN_ENTRIES
    _assert_same_weights(checkpoint["module"], original["weights"])
    [optimizer_state] = checkpoint["optimizers"]
    plain = torch.optim.AdamW(Net().parameters(), lr=LEARNING_RATE)
    plain.load_state_dict(optimizer_state)
    _assert_same_optimizer_state(plain.state_dict(), original["optimizer"])


def test_loading_only_the_weights_reads_sharded_optimizer_state_only_when_taken(saved):
    kind, path, original = saved
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    module = strategy.setup_module(Net())
    remaining = strategy.load_checkpoint(path, {"module": module})
    _assert_same_weights(module.state_dict(), original["weights"])
    if kind == "sharded":
        assert remaining.unread_keys() == ["optimizers"]
        template = {"module": Net().state_dict()}
        resharded = DistributedCheckpointIO().load_into(path, template)
        _assert_same_weights(template["module"], original["weights"])
        assert resharded.unread_keys() == ["optimizers"]
    assert {key: remaining[key] for key in PLAIN_ENTRIES} == PLAIN_ENTRIES
    [optimizer_state] = remaining["optimizers"]
    plain = torch.optim.AdamW(Net().parameters(), lr=LEARNING_RATE)
    plain.load_state_dict(optimizer_state)
    _assert_same_optimizer_state(plain.state_dict(), original["optimizer"])


def test_consolidate_writes_one_file_that_plain_torch_load_reads(saved, tmp_path):
    _, path, original = saved
    parser = argparse.ArgumentParser()
    consolidate.add_arguments(parser)
    destination = tmp_path / "consolidated.pt"
    assert consolidate.run(parser.parse_args([str(path), str(destination)])) == 0
    checkpoint = torch.load(destination, weights_only=True)
    _assert_same_weights(checkpoint["module"], original["weights"])
    assert checkpoint["loops"] == PLAIN_ENTRIES["loops"]


def test_consolidate_replaces_an_existing_file_only_when_asked(saved, tmp_path):
    _, path, _ = saved
    parser = argparse.ArgumentParser()
    consolidate.add_arguments(parser)
    destination = tmp_path / "taken.pt"
    destination.write_bytes(b"keep me")
    with pytest.raises(ValueError, match="exists; pass --overwrite"):
        consolidate.run(parser.parse_args([str(path), str(destination)]))
    assert destination.read_bytes() == b"keep me"
    assert consolidate.run(parser.parse_args([str(path), str(destination), "--overwrite"])) == 0
    assert torch.load(destination, weights_only=True)["note"] == PLAIN_ENTRIES["note"]


def _save_single_device_checkpoint(path):
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    torch.manual_seed(0)
    module = strategy.setup_module(Net())
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE)])
    for batch in BEFORE:
        module.training_step(batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    strategy.save_checkpoint(path, {"module": module, "optimizers": [optimizer], **PLAIN_ENTRIES})
    weights = {key: value.clone() for key, value in module.state_dict().items()}
    continued = []
    for batch in AFTER:
        loss = module.training_step(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        continued.append(loss.item())
    return weights, continued


def test_single_device_checkpoint_loads_into_fsdp(workers, tmp_path):
    path = tmp_path / "single.ckpt"
    weights, continued = _save_single_device_checkpoint(path)
    resumed = workers.run(_resume, str(path), 2)
    _assert_same_weights(resumed[0]["weights"], weights)
    for rank_result in resumed:
        assert rank_result["remaining"] == PLAIN_ENTRIES
        assert rank_result["continued"] == pytest.approx(continued, rel=1e-5)


def _save_with(path, state_dict_type, extra, unpicklable_entry=False):
    strategy = make_strategy(state_dict_type=state_dict_type)
    module, optimizer = build(strategy)
    if unpicklable_entry:
        extra = {**extra, "note": lambda: "torch.save cannot write this"}
    try:
        strategy.save_checkpoint(path, {"module": module, "optimizers": [optimizer], **extra})
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


@pytest.mark.parametrize("state_dict_type", ["sharded", "full"])
def test_a_failed_write_fails_every_rank_and_leaves_the_previous_checkpoint_whole(workers, tmp_path, state_dict_type):
    path = tmp_path / "checkpoint"
    assert workers.run(_save_with, str(path), state_dict_type, {"note": "first"}) == [None, None]
    errors = workers.run(_save_with, str(path), state_dict_type, {}, True)
    assert all(error is not None for error in errors)
    assert "rank 0" in errors[1]
    assert os.listdir(tmp_path) == ["checkpoint"]
    assert read_full_checkpoint(path, TorchCheckpointIO())["note"] == "first"


def test_saving_over_a_checkpoint_replaces_it_whole(workers, tmp_path):
    path = tmp_path / "checkpoint"
    assert workers.run(_save_with, str(path), "sharded", {"note": "first", "gone": 1}) == [None, None]
    assert workers.run(_save_with, str(path), "sharded", {"note": "second"}) == [None, None]
    checkpoint = read_full_checkpoint(path, TorchCheckpointIO())
    assert checkpoint["note"] == "second"
    assert "gone" not in checkpoint
    assert os.listdir(tmp_path) == ["checkpoint"]


def test_pickled_objects_in_a_sharded_checkpoint_load_only_when_weights_only_is_off(workers, tmp_path):
    path = tmp_path / "checkpoint"
    assert workers.run(_save_with, str(path), "sharded", {"custom": Opaque(3)}) == [None, None]
    with pytest.raises(CheckpointError, match="weights-only load does not allow"):
        read_full_checkpoint(path, TorchCheckpointIO())
    assert read_full_checkpoint(path, TorchCheckpointIO(), weights_only=False)["custom"] == Opaque(3)
