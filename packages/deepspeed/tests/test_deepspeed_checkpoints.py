"""Checkpoints: DeepSpeed's directory plus the loop state, written atomically by every rank,
resumed exactly at the same stage and world size, and read as plain fp32 state anywhere else."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from deepspeed_testing import (
    NotATensor,
    RegressionNet,
    load_and_train,
    reference_run,
    reference_setup,
    reference_train,
    save_twice,
    train_and_save,
    worker_pool,
)

import stratagem
from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint
from stratagem_deepspeed import DeepSpeedCheckpointIO, convert_zero_checkpoint_to_fp32_state_dict
from stratagem_deepspeed.checkpoint_layout import read_tag

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

STEPS = 3


@pytest.fixture(scope="module")
def workers():
    with worker_pool() as pool:
        yield pool


@pytest.fixture(scope="module")
def saved(workers, tmp_path_factory):
    """Stage-3 and stage-2 checkpoints after 3 steps, with the weights each run held when saving."""
    root = tmp_path_factory.mktemp("checkpoints")
    found = {}
    for alias in ("deepspeed_stage_2", "deepspeed_stage_3"):
        path = root / alias
        _, weights = workers.run(train_and_save, alias, STEPS, str(path))[0]
        found[alias] = (path, weights)
    return found


def assert_identical(weights, expected):
    assert set(weights) == set(expected)
    for name, value in expected.items():
        assert torch.equal(weights[name], value), name


@pytest.mark.parametrize("alias", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_a_checkpoint_resumes_exactly_at_the_same_stage_and_world_size(workers, saved, alias):
    path, weights_at_save = saved[alias]
    remaining, loaded, losses, final, warned = workers.run(load_and_train, alias, str(path), STEPS, STEPS)[0]
    assert remaining == {"loops": {"step": STEPS}}
    assert_identical(loaded, weights_at_save)
    assert warned == []
    assert_continues_the_reference(losses, final)


def assert_continues_the_reference(losses, final):
    uninterrupted_losses, uninterrupted_weights = reference_run(2 * STEPS)
    assert losses == pytest.approx(uninterrupted_losses[STEPS:], abs=1e-5)
    for name, value in uninterrupted_weights.items():
        torch.testing.assert_close(final[name], value, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize(
    ("saved_by", "loaded_by"), [("deepspeed_stage_2", "deepspeed_stage_3"), ("deepspeed_stage_3", "deepspeed_stage_1")]
)
def test_a_checkpoint_of_another_stage_resumes_with_its_weights_and_optimizer_state(
    workers, saved, saved_by, loaded_by
):
    path, weights_at_save = saved[saved_by]
    remaining, loaded, losses, final, warned = workers.run(load_and_train, loaded_by, str(path), STEPS, STEPS)[0]
    assert remaining == {"loops": {"step": STEPS}}
    assert_identical(loaded, weights_at_save)
    assert warned == []
    assert_continues_the_reference(losses, final)


def test_the_reader_gathers_the_optimizer_state_as_a_plain_torch_state_dict(saved):
    model, optimizer = reference_setup()
    reference_train(model, optimizer, STEPS)
    expected = optimizer.state_dict()
    for path, _ in saved.values():
        [state] = read_full_checkpoint(path, TorchCheckpointIO())["optimizers"]
        assert state["param_groups"][0]["params"] == expected["param_groups"][0]["params"]
        assert state["param_groups"][0]["lr"] == expected["param_groups"][0]["lr"]
        for index, per_parameter in expected["state"].items():
            assert set(state["state"][index]) == set(per_parameter)
            for key, value in per_parameter.items():
                torch.testing.assert_close(state["state"][index][key], value, atol=1e-6, rtol=0)


def test_a_stage_3_checkpoint_stepped_in_sub_groups_gathers_its_optimizer_state(workers, tmp_path):
    from stratagem.checkpoint_io import load_torch_file
    from stratagem_deepspeed.shards import deepspeed_checkpoint_globals

    path = tmp_path / "sub_groups"
    workers.run(train_and_save, {"stage": 3, "sub_group_size": 16}, STEPS, str(path))
    model_states = sorted(path.glob("*/*model_states.pt"))[0]
    shapes = load_torch_file(model_states, safe_globals=deepspeed_checkpoint_globals())["param_shapes"]
    assert len(shapes) > 1
    model, optimizer = reference_setup()
    reference_train(model, optimizer, STEPS)
    expected = optimizer.state_dict()
    [state] = read_full_checkpoint(path, TorchCheckpointIO())["optimizers"]
    assert state["param_groups"][0]["params"] == expected["param_groups"][0]["params"]
    for index, per_parameter in expected["state"].items():
        for key, value in per_parameter.items():
            torch.testing.assert_close(state["state"][index][key], value, atol=1e-6, rtol=0)


def test_single_device_resumes_a_stage_3_checkpoint_with_its_optimizer_state(saved):
    path, _ = saved["deepspeed_stage_3"]
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    model, optimizer = reference_setup()
    strategy.setup_module(model)
    strategy.load_checkpoint(path, {"module": model, "optimizers": [optimizer]})
    losses = reference_train(model, optimizer, STEPS, start_step=STEPS)
    assert_continues_the_reference(losses, model.state_dict())


@pytest.mark.parametrize("alias", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_a_single_process_checkpoint_resumes_under_deepspeed_with_its_optimizer_state(workers, tmp_path, alias):
    model, optimizer = reference_setup()
    reference_train(model, optimizer, STEPS)
    checkpoint = {"module": model.state_dict(), "optimizers": [optimizer.state_dict()], "loops": {"step": STEPS}}
    TorchCheckpointIO().save_checkpoint(checkpoint, tmp_path / "one.pt")
    remaining, loaded, losses, final, warned = workers.run(
        load_and_train, alias, str(tmp_path / "one.pt"), STEPS, STEPS
    )[0]
    assert remaining == {"loops": {"step": STEPS}}
    assert_identical(loaded, model.state_dict())
    assert warned == []
    assert_continues_the_reference(losses, final)


def test_a_checkpoint_without_optimizer_state_loads_the_weights_and_warns_on_rank_zero(workers, tmp_path):
    initial = RegressionNet()
    TorchCheckpointIO().save_checkpoint({"module": initial.state_dict()}, tmp_path / "weights.pt")
    rank_zero, rank_one = workers.run(load_and_train, "deepspeed_stage_3", str(tmp_path / "weights.pt"), 1, 0)
    assert_identical(rank_zero[1], initial.state_dict())
    assert len(rank_zero[4]) == 1
    assert "fresh optimizer state" in rank_zero[4][0]
    assert rank_one[4] == []


def test_the_reader_gathers_full_fp32_weights_without_a_process_group(saved):
    for path, weights_at_save in saved.values():
        checkpoint = read_full_checkpoint(path, TorchCheckpointIO())
        assert set(checkpoint) == {"module", "optimizers", "loops"}
        assert_identical(checkpoint["module"], weights_at_save)


def test_single_device_loads_a_stage_3_checkpoint_through_its_ordinary_load(saved):
    path, weights_at_save = saved["deepspeed_stage_3"]
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    module = strategy.setup_module(RegressionNet())
    remaining = strategy.load_checkpoint(path, {"module": module})
    assert remaining["loops"] == {"step": STEPS}
    assert_identical(module.state_dict(), weights_at_save)


@pytest.mark.parametrize("alias", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_loading_only_the_weights_gathers_the_optimizer_state_only_when_taken(saved, monkeypatch, alias):
    from stratagem_deepspeed import shards

    gathered = []
    gather = shards.gather_optimizer_state
    monkeypatch.setattr(shards, "gather_optimizer_state", lambda *args: gathered.append(args) or gather(*args))
    path, weights_at_save = saved[alias]
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    module = strategy.setup_module(RegressionNet())
    remaining = strategy.load_checkpoint(path, {"module": module})
    assert_identical(module.state_dict(), weights_at_save)
    assert gathered == []
    assert remaining.unread_keys() == ["optimizers"]
    [state] = remaining["optimizers"]
    assert len(gathered) == 1
    [expected] = read_full_checkpoint(path, TorchCheckpointIO())["optimizers"]
    assert state["param_groups"] == expected["param_groups"]
    for index, per_parameter in expected["state"].items():
        for key, value in per_parameter.items():
            assert torch.equal(state["state"][index][key], value), (index, key)


def test_convert_zero_checkpoint_to_fp32_state_dict_writes_one_plain_file(saved, tmp_path):
    path, weights_at_save = saved["deepspeed_stage_3"]
    returned = convert_zero_checkpoint_to_fp32_state_dict(path, tmp_path / "full.pt")
    on_disk = torch.load(tmp_path / "full.pt", weights_only=True)
    assert_identical(on_disk["module"], weights_at_save)
    assert on_disk["loops"] == returned["loops"] == {"step": STEPS}


def test_a_single_device_checkpoint_loads_into_stage_3(workers, tmp_path):
    initial = RegressionNet()
    TorchCheckpointIO().save_checkpoint({"module": initial.state_dict(), "loops": {"step": 7}}, tmp_path / "one.pt")
    checkpoint = str(tmp_path / "one.pt")
    remaining, loaded, *_ = workers.run(load_and_train, "deepspeed_stage_3", checkpoint, 1, 0, "32-true", False)[0]
    assert remaining == {"loops": {"step": 7}}
    assert_identical(loaded, initial.state_dict())


def test_saving_over_a_checkpoint_replaces_it_whole(workers, tmp_path):
    path = tmp_path / "last.ckpt"
    assert workers.run(save_twice, str(path), False)[0] == ["saved", "saved"]
    assert (path / "latest").read_text() == "global_step2"
    assert sorted(entry.name for entry in path.iterdir() if entry.name.startswith("global_step")) == ["global_step2"]
    assert [entry.name for entry in tmp_path.iterdir()] == ["last.ckpt"], "no temporary directory left"


def test_a_failed_save_leaves_the_previous_checkpoint_whole_and_fails_on_every_rank(workers, tmp_path):
    path = tmp_path / "last.ckpt"
    rank_zero, rank_one = workers.run(save_twice, str(path), True)
    assert rank_zero[0] == rank_one[0] == "saved"
    assert "pickle" in rank_zero[1]
    assert rank_one[1].startswith("RuntimeError")
    assert "failed on rank 0" in rank_one[1]
    assert (path / "latest").read_text() == "global_step1"
    assert read_full_checkpoint(path, TorchCheckpointIO())["loops"] == {"step": 1}
    assert [entry.name for entry in tmp_path.iterdir()] == ["last.ckpt"], "the partial directory is removed"


def test_pickled_objects_load_only_when_weights_only_is_off(workers, tmp_path):
    path = tmp_path / "custom"
    workers.run(train_and_save, "deepspeed_stage_2", 1, str(path), "32-true", NotATensor(5))
    with pytest.raises(CheckpointError, match="weights_only=False"):
        read_full_checkpoint(path, TorchCheckpointIO())
    assert read_full_checkpoint(path, TorchCheckpointIO(), weights_only=False)["extra"].value == 5


def test_a_foreign_object_in_the_shard_directory_is_refused_by_a_weights_only_load(saved, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(saved["deepspeed_stage_3"][0], path)
    tag = (path / "latest").read_text()
    torch.save({"payload": NotATensor(1)}, path / tag / "zz_extra_model_states.pt")
    with pytest.raises(CheckpointError, match=r"zz_extra_model_states.pt.*NotATensor.*weights_only=False"):
        read_full_checkpoint(path, TorchCheckpointIO())


def test_save_full_weights_stores_the_gathered_module_so_readers_need_no_shards(workers, tmp_path):
    path = tmp_path / "full_weights"
    _, weights_at_save = workers.run(train_and_save, {"stage": 3, "save_full_weights": True}, 2, str(path))[0]
    shutil.rmtree(path / (path / "latest").read_text())
    (path / "latest").unlink()
    assert_identical(read_full_checkpoint(path, TorchCheckpointIO())["module"], weights_at_save)


def test_the_checkpoint_io_alone_writes_a_directory_it_reads_back_and_removes(tmp_path):
    io = DeepSpeedCheckpointIO()
    io.save_checkpoint({"module": {"w": torch.ones(2)}, "loops": {"step": 1}}, tmp_path / "plain")
    assert DeepSpeedCheckpointIO.can_read(tmp_path / "plain")
    assert not DeepSpeedCheckpointIO.can_read(tmp_path / "missing")
    loaded = io.load_checkpoint(tmp_path / "plain")
    assert loaded["loops"] == {"step": 1}
    assert torch.equal(loaded["module"]["w"], torch.ones(2))
    io.remove_checkpoint(tmp_path / "plain")
    assert not Path(tmp_path / "plain").exists()


class _RunsAShellCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _crafted_copy(saved, tmp_path):
    """A stage-2 checkpoint whose first optimizer shard runs a command when unpickled, and whose
    directory holds a zero_to_fp32.py that would mark being run or imported."""
    path = tmp_path / "crafted"
    shutil.copytree(saved["deepspeed_stage_2"][0], path)
    marker = tmp_path / "ran"
    tag = (path / "latest").read_text()
    [shard] = (path / tag).glob("*zero_pp_rank_0_*optim_states.pt")
    torch.save({"optimizer_state_dict": _RunsAShellCommand(marker)}, shard)
    (path / "zero_to_fp32.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    return path, marker


def _resume_refusal(alias: str, path: str) -> str:
    try:
        load_and_train(alias, path, 1, STEPS)
    except CheckpointError as error:
        return str(error)
    return "loaded"


def test_a_crafted_pickle_in_a_shard_is_refused_without_running_by_every_reader(workers, saved, tmp_path, capsys):
    from stratagem.cli.main import main

    path, marker = _crafted_copy(saved, tmp_path)
    with pytest.raises(CheckpointError, match=r"optim_states\.pt' references posix\.system.*Only if you trust"):
        read_full_checkpoint(path, TorchCheckpointIO())
    with pytest.raises(CheckpointError, match=r"references posix\.system"):
        convert_zero_checkpoint_to_fp32_state_dict(path, tmp_path / "out.pt")
    assert main(["consolidate", str(path), str(tmp_path / "consolidated.pt")]) == 2
    assert "references posix.system" in capsys.readouterr().err
    outcomes = workers.run(_resume_refusal, "deepspeed_stage_2", str(path))
    assert all("references posix.system" in outcome for outcome in outcomes), outcomes
    assert not marker.exists(), "the payload or the directory's zero_to_fp32.py ran"
    assert not (tmp_path / "out.pt").exists()
    assert not (tmp_path / "consolidated.pt").exists()


@pytest.mark.parametrize("tag", ["../elsewhere", "/tmp", ".."])
def test_a_latest_file_naming_a_directory_outside_the_checkpoint_is_refused(saved, tmp_path, tag):
    path = tmp_path / "copy"
    shutil.copytree(saved["deepspeed_stage_2"][0], path)
    (tmp_path / "elsewhere").mkdir()
    (path / "latest").write_text(tag)
    with pytest.raises(CheckpointError, match="not a tag directory inside the checkpoint"):
        read_full_checkpoint(path, TorchCheckpointIO())


@pytest.mark.parametrize("tag", ["\x1b[2J" + "x" * 100_000, "global_step1\x1b]0;owned\x07", b"\xff\xfe"])
def test_a_latest_file_naming_no_possible_tag_is_refused_with_what_it_holds_escaped_and_cut(tmp_path, tag):
    (tmp_path / "latest").write_bytes(tag if isinstance(tag, bytes) else tag.encode())
    with pytest.raises(CheckpointError, match="not a tag directory inside the checkpoint") as raised:
        read_tag(tmp_path)
    assert len(str(raised.value)) < 1000
    assert "\x1b" not in str(raised.value)


def test_a_truncated_shard_is_one_checkpoint_error(saved, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(saved["deepspeed_stage_2"][0], path)
    [shard] = (path / (path / "latest").read_text()).glob("*zero_pp_rank_1_*optim_states.pt")
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"optim_states\.pt' is truncated or corrupt"):
        read_full_checkpoint(path, TorchCheckpointIO())
