"""A crafted ``xla_fsdp`` sharded checkpoint directory never runs code, hangs or allocates what its metadata
claims: each is refused with a CheckpointError naming the file and the fault, by every reader (a single-device
validate, ``read_full_checkpoint``, ``stratagem consolidate``); consolidate never replaces or half-writes DST."""

import os
import pickle
import re
import shutil

import pytest
import torch
from stratagem_xla.checkpoint_io import SHARD_FILE
from xla_testing import Regression, loader

from stratagem import Trainer
from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint
from stratagem.cli.main import main

WORLD_SIZE = 2
_SEPARATOR = "_FSDP_SHARD_SEPARATOR_"

pytestmark = pytest.mark.timeout(60)


def quiet_trainer(root, **options):
    return Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        **options,
    )


def shard_key(name):
    return _SEPARATOR.join(["_fsdp_shard", *name.split(".")])


def sharded(checkpoint, world_size=WORLD_SIZE):
    """``checkpoint`` as the rank files XlaFSDP (flatten_parameters=False) saves: every parameter flattened,
    padded to a multiple of the world size and split; rank 0's file also holds the rest of the checkpoint."""
    state = checkpoint["module"]
    info = {shard_key(name): {"_orig_name": name, "_orig_size": value.shape} for name, value in state.items()}
    files = []
    for rank in range(world_size):
        module_shard = {}
        for name, value in state.items():
            length = -(-value.numel() // world_size)
            padded = torch.zeros(length * world_size, dtype=value.dtype)
            padded[: value.numel()] = value.reshape(-1)
            module_shard[shard_key(name)] = padded[rank * length : (rank + 1) * length].clone()
        metadata = {"shard_info": {"": info}, "flatten_info": {}, "buffer_info": {}, "world_size": world_size}
        rest = {key: value for key, value in checkpoint.items() if key != "module"} if rank == 0 else {}
        files.append({"module_shard": module_shard, "shard_metadata": {**metadata, "rank": rank}, **rest})
    return files


def write(directory, shards):
    directory.mkdir()
    for rank, shard in enumerate(shards):
        torch.save(shard, directory / SHARD_FILE.format(rank=rank, world_size=len(shards)))
    return directory


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A single-device Trainer checkpoint (as loaded) and the plain file it came from."""
    root = tmp_path_factory.mktemp("plain")
    trainer = quiet_trainer(root, max_steps=1)
    trainer.fit(Regression(), loader())
    trainer.save_checkpoint(root / "plain.ckpt")
    return TorchCheckpointIO().load_checkpoint(root / "plain.ckpt")


@pytest.fixture
def genuine(trained, tmp_path):
    return write(tmp_path / "checkpoint", sharded(trained))


def test_a_genuine_sharded_directory_reads_as_the_saved_weights_everywhere(trained, genuine, tmp_path):
    whole = read_full_checkpoint(genuine, TorchCheckpointIO())
    assert whole.keys() - {"optimizers"} == trained.keys() - {"optimizers"}
    assert whole["module"].keys() == trained["module"].keys()
    for name, value in trained["module"].items():
        assert torch.equal(whole["module"][name], value), name
    quiet_trainer(tmp_path).validate(Regression(), loader(), ckpt_path=genuine)
    assert main(["consolidate", str(genuine), str(tmp_path / "out.pt")]) == 0
    consolidated = TorchCheckpointIO().load_checkpoint(tmp_path / "out.pt")
    assert all(torch.equal(consolidated["module"][name], value) for name, value in trained["module"].items())


class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _read(directory, root):
    return read_full_checkpoint(directory, TorchCheckpointIO())


def _validate(directory, root):
    return quiet_trainer(root).validate(Regression(), loader(), ckpt_path=directory)


def _refused(entry, directory, tmp_path, capsys, message):
    """Asserts that ``entry`` refuses ``directory`` with a CheckpointError matching ``message``; consolidate
    exits with 2 and writes nothing."""
    if entry == "consolidate":
        output = tmp_path / "out.pt"
        assert main(["consolidate", str(directory), str(output)]) == 2
        error = capsys.readouterr().err
        assert re.search(message, error), error
        assert not output.exists()
        return
    with pytest.raises(CheckpointError, match=message):
        {"read_full_checkpoint": _read, "validate": _validate}[entry](directory, tmp_path)


_ENTRIES = ["read_full_checkpoint", "validate", "consolidate"]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("form", ["torch.save", "bare pickle"])
@pytest.mark.parametrize("entry", _ENTRIES)
def test_a_shard_carrying_code_is_refused_without_running_it(trained, tmp_path, capsys, rank, form, entry):
    marker = tmp_path / "ran"
    shards = sharded(trained)
    directory = write(tmp_path / "checkpoint", shards)
    file = directory / SHARD_FILE.format(rank=rank, world_size=WORLD_SIZE)
    if form == "torch.save":
        torch.save({**shards[rank], "module_shard": _System(marker)}, file)
    else:
        file.write_bytes(pickle.dumps(_System(marker), protocol=2))
    _refused(entry, directory, tmp_path, capsys, rf"{file.name}.*could run code")
    assert not marker.exists(), "the payload ran"


def _rename_all(directory, world_size):
    for rank, file in enumerate(sorted(directory.iterdir())):
        file.rename(directory / SHARD_FILE.format(rank=rank, world_size=world_size))


def _rewrite(rank, change):
    def craft(directory, shards):
        changed = change(shards[rank])
        torch.save(changed, directory / SHARD_FILE.format(rank=rank, world_size=WORLD_SIZE))

    return craft


def _with_module_shard(change):
    def changed(shard):
        module_shard = dict(shard["module_shard"])
        change(module_shard)
        return {**shard, "module_shard": module_shard}

    return changed


def _with_info(change):
    def changed(shard):
        info = {key: dict(value) for key, value in shard["shard_metadata"]["shard_info"][""].items()}
        change(info)
        return {**shard, "shard_metadata": {**shard["shard_metadata"], "shard_info": {"": info}}}

    return changed


def _longer(module_shard):
    key = next(iter(module_shard))
    module_shard[key] = torch.cat([module_shard[key], torch.zeros(1)])


def _halved(module_shard):
    for key, value in module_shard.items():
        module_shard[key] = value[: value.numel() // 2].clone()


def _sized(size):
    def change(info):
        next(iter(info.values()))["_orig_size"] = size

    return change


def _ghost(info):
    info[shard_key("ghost.weight")] = {"_orig_name": "ghost.weight", "_orig_size": torch.Size([4])}


def _renamed_param(info):
    next(iter(info.values()))["_orig_name"] = "elsewhere.weight"


def _extra_entry(module_shard):
    module_shard["stray"] = torch.zeros(1)


def _not_a_tensor(module_shard):
    module_shard[next(iter(module_shard))] = [1.0, 2.0]


def _file(rank):
    return lambda directory: directory / SHARD_FILE.format(rank=rank, world_size=WORLD_SIZE)


def _link_outside(directory, shards):
    outside = directory.parent / "outside.pt"
    shutil.copy(_file(1)(directory), outside)
    _file(1)(directory).unlink()
    _file(1)(directory).symlink_to(outside)


def _fifo(directory, shards):
    _file(1)(directory).unlink()
    os.mkfifo(_file(1)(directory))


def _directory_instead(directory, shards):
    _file(1)(directory).unlink()
    _file(1)(directory).mkdir()


def _truncated(directory, shards):
    _file(1)(directory).write_bytes(_file(1)(directory).read_bytes()[:100])


def _swapped(directory, shards):
    torch.save(shards[1], _file(0)(directory))
    torch.save(shards[0], _file(1)(directory))


_CRAFTED = {
    "missing shard": (lambda d, s: _file(1)(d).unlink(), r"lacks 1 of its 2 shards: rank-1-of-2\.pt"),
    "shard of a rank beyond the world": (
        lambda d, s: shutil.copy(_file(1)(d), d / "rank-2-of-2.pt"),
        r"rank-2-of-2\.pt: no such rank in a world of 2",
    ),
    "another world size's shards": (
        lambda d, s: shutil.copy(_file(0)(d), d / "rank-0-of-3.pt"),
        r"world sizes \[2, 3\]",
    ),
    "absurd world size": (lambda d, s: _rename_all(d, 10**12), r"lacks 999999999998 of its 1000000000000 shards"),
    "world size of zero": (lambda d, s: _rename_all(d, 0), r"rank-0-of-0\.pt.*not a shard's name"),
    "odd shard name": (lambda d, s: _file(1)(d).rename(d / "rank-01-of-2.pt"), r"rank-01-of-2\.pt.*not a shard's"),
    "metadata of another world size": (
        _rewrite(1, lambda shard: {**shard, "shard_metadata": {**shard["shard_metadata"], "world_size": 3}}),
        r"rank-1-of-2\.pt' says world_size=3",
    ),
    "rank that is a tensor": (
        _rewrite(1, lambda shard: {**shard, "shard_metadata": {**shard["shard_metadata"], "rank": torch.ones(2)}}),
        r"rank-1-of-2\.pt' says rank=tensor",
    ),
    "size that is a tensor on one rank": (
        _rewrite(1, _with_info(_sized(torch.ones(3)))),
        r"rank-1-of-2\.pt': shard_info.*_orig_size'\] is tensor",
    ),
    "shards swapped": (_swapped, r"rank-0-of-2\.pt' says rank=1"),
    "one shard too long": (_rewrite(1, _with_module_shard(_longer)), r"rank-1-of-2\.pt': the shard .* same length"),
    "shards too short for the size": (
        lambda d, s: [_rewrite(rank, _with_module_shard(_halved))(d, s) for rank in range(WORLD_SIZE)],
        r"hold \d+ values in all, but shard_metadata gives",
    ),
    "negative size": (
        lambda d, s: [_rewrite(rank, _with_info(_sized((-4, 3))))(d, s) for rank in range(WORLD_SIZE)],
        r"_orig_size'\] is \(-4, 3\), not a shape of non-negative integers",
    ),
    "terabyte size": (
        lambda d, s: [_rewrite(rank, _with_info(_sized((10**6,) * 4)))(d, s) for rank in range(WORLD_SIZE)],
        r"\(1000000000000000000000000 values\)",
    ),
    "size that is not a shape": (
        lambda d, s: [_rewrite(rank, _with_info(_sized("big")))(d, s) for rank in range(WORLD_SIZE)],
        r"_orig_size'\] is 'big'",
    ),
    "metadata naming a shard that does not exist": (
        lambda d, s: [_rewrite(rank, _with_info(_ghost))(d, s) for rank in range(WORLD_SIZE)],
        r"names the shard .*ghost.* which module_shard lacks",
    ),
    "metadata that differs between ranks": (
        _rewrite(1, _with_info(_renamed_param)),
        r"rank-1-of-2\.pt' describes other parameters than rank-0-of-2\.pt",
    ),
    "module_shard entries that differ between ranks": (
        _rewrite(1, _with_module_shard(_extra_entry)),
        r"rank-1-of-2\.pt' holds other module_shard entries .*'stray'",
    ),
    "an entry that is not a tensor": (_rewrite(0, _with_module_shard(_not_a_tensor)), r"is a list, not a tensor"),
    "a shard that is not a dict": (_rewrite(1, lambda shard: [1, 2]), r"rank-1-of-2\.pt' is not an xla_fsdp shard"),
    "link to a file outside": (
        _link_outside,
        r"rank-1-of-2\.pt' leads outside the checkpoint .* \(to '.*outside\.pt'\)",
    ),
    "a pipe in place of a shard": (_fifo, r"rank-1-of-2\.pt' is a named pipe \(FIFO\), not a checkpoint file"),
    "a directory in place of a shard": (_directory_instead, r"rank-1-of-2\.pt' is a directory, not a checkpoint file"),
    "truncated shard": (_truncated, r"rank-1-of-2\.pt' is truncated or corrupt"),
    "empty shard": (lambda d, s: _file(1)(d).write_bytes(b""), r"rank-1-of-2\.pt' is an empty file"),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", list(_CRAFTED))
@pytest.mark.parametrize("entry", _ENTRIES)
def test_a_malformed_sharded_directory_is_refused_naming_the_fault(trained, tmp_path, capsys, case, entry):
    shards = sharded(trained)
    directory = write(tmp_path / "checkpoint", shards)
    craft, message = _CRAFTED[case]
    craft(directory, shards)
    _refused(entry, directory, tmp_path, capsys, message)


def test_a_failed_consolidation_keeps_the_existing_output_intact(genuine, tmp_path, capsys):
    output = tmp_path / "out.pt"
    output.write_bytes(b"the previous checkpoint")
    _truncated(genuine, [])
    assert main(["consolidate", str(genuine), str(output), "--overwrite"]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err
    assert output.read_bytes() == b"the previous checkpoint"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint", "out.pt"]


def test_an_interrupted_write_leaves_neither_a_partial_output_nor_a_changed_old_one(genuine, tmp_path, monkeypatch):
    output = tmp_path / "out.pt"
    output.write_bytes(b"the previous checkpoint")
    real_save = torch.save

    def save_then_fail(obj, stream, *args, **kwargs):
        if hasattr(stream, "write") and isinstance(obj, dict) and "module" in obj:
            stream.write(b"half a checkpoint")
            raise OSError(28, "No space left on device")
        return real_save(obj, stream, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_then_fail)
    with pytest.raises(OSError, match="No space left"):
        main(["consolidate", str(genuine), str(output), "--overwrite"])
    assert output.read_bytes() == b"the previous checkpoint"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint", "out.pt"]
    fresh = tmp_path / "fresh.pt"
    with pytest.raises(OSError, match="No space left"):
        main(["consolidate", str(genuine), str(fresh)])
    assert not fresh.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint", "out.pt"]
