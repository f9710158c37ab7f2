"""A crafted DCP ``.metadata`` never runs code: refused by every load that the README calls weights-only
(a single-device fit or validate, consolidate, FSDP's sharded load on two ranks); a genuine one still loads."""

import builtins
import os
import pickle
import re

import pytest
from fsdp_testing import Block, build, make_strategy

from stratagem import Trainer
from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint
from stratagem.checkpoint_io.dcp_metadata import read_metadata
from stratagem.checkpoint_io.sharded import METADATA_FILE, DistributedCheckpointIO
from stratagem.cli.main import main
from stratagem.demo import DemoModule, demo_dataloaders
from stratagem.testing import DistributedWorkers

HIDDEN = 8


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


def make_loader():
    return demo_dataloaders(batch_size=16, num_samples=64)[0]


def demo_module():
    return DemoModule(hidden=HIDDEN)


class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _ExecThenGenuine:
    """Runs its payload, then hands back the genuine metadata, so that the load would look normal."""

    def __init__(self, marker, genuine):
        self.marker, self.genuine = marker, genuine

    def __reduce__(self):
        code = f"open({str(self.marker)!r}, 'w').close() or __import__('pickle').loads({self.genuine!r})"
        return (builtins.eval, (code,))


def _payloads(marker, genuine):
    return {
        "os.system": pickle.dumps(_System(marker)),
        "eval then genuine": pickle.dumps(_ExecThenGenuine(marker, genuine)),
        "nested in metadata": pickle.dumps({"state_dict_metadata": _System(marker)}),
    }


@pytest.fixture(scope="module")
def trainer_checkpoint(tmp_path_factory):
    """A Trainer checkpoint saved by single_device, rewritten as a DCP directory."""
    root = tmp_path_factory.mktemp("dcp")
    trainer = quiet_trainer(root, max_steps=1)
    trainer.fit(demo_module(), make_loader())
    trainer.save_checkpoint(root / "plain.ckpt")
    directory = root / "checkpoint"
    DistributedCheckpointIO().save_checkpoint(TorchCheckpointIO().load_checkpoint(root / "plain.ckpt"), directory)
    return directory


def _crafted(trainer_checkpoint, tmp_path, payload):
    directory = tmp_path / "crafted"
    directory.mkdir()
    for file in trainer_checkpoint.iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    (directory / METADATA_FILE).write_bytes(payload)
    return directory


def test_a_genuine_dcp_checkpoint_resumes_a_single_device_fit(trainer_checkpoint, tmp_path):
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(demo_module(), make_loader(), ckpt_path=trainer_checkpoint)
    assert trainer.global_step == 2


def test_the_restricted_reader_gives_what_pickle_gives_for_genuine_metadata(trainer_checkpoint):
    file = trainer_checkpoint / METADATA_FILE
    with file.open("rb") as stream:
        assert read_metadata(file) == pickle.load(stream)


_LOADS = {
    "read_full_checkpoint": lambda directory, _: read_full_checkpoint(directory, TorchCheckpointIO()),
    "load_into": lambda directory, _: DistributedCheckpointIO().load_into(
        directory, {"module": demo_module().state_dict()}
    ),
    "fit": lambda directory, root: quiet_trainer(root, max_steps=2).fit(
        demo_module(), make_loader(), ckpt_path=directory
    ),
    "validate": lambda directory, root: quiet_trainer(root).validate(demo_module(), make_loader(), ckpt_path=directory),
}


@pytest.mark.parametrize("kind", ["os.system", "eval then genuine", "nested in metadata"])
@pytest.mark.parametrize("entry", ["fit", "validate", "consolidate", "read_full_checkpoint", "load_into"])
def test_a_crafted_metadata_file_is_refused_without_running(trainer_checkpoint, tmp_path, capsys, kind, entry):
    marker = tmp_path / "ran"
    genuine = (trainer_checkpoint / METADATA_FILE).read_bytes()
    directory = _crafted(trainer_checkpoint, tmp_path, _payloads(marker, genuine)[kind])
    if entry == "consolidate":
        assert main(["consolidate", str(directory), str(tmp_path / "out.pt")]) == 2
        assert "not DCP metadata as torch writes it" in capsys.readouterr().err
        assert not (tmp_path / "out.pt").exists()
    else:
        with pytest.raises(CheckpointError, match=r"\.metadata' is not DCP metadata.*could run code"):
            _LOADS[entry](directory, tmp_path)
    assert not marker.exists(), "the payload ran"


def test_only_an_explicit_opt_out_reads_metadata_with_plain_pickle(trainer_checkpoint, tmp_path):
    marker = tmp_path / "ran"
    genuine = (trainer_checkpoint / METADATA_FILE).read_bytes()
    directory = _crafted(trainer_checkpoint, tmp_path, _payloads(marker, genuine)["eval then genuine"])
    read_full_checkpoint(directory, TorchCheckpointIO(), weights_only=False)
    assert marker.exists()


def test_metadata_that_would_change_a_class_or_read_outside_the_directory_is_refused(trainer_checkpoint, tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    file = tmp_path / METADATA_FILE
    before = dict(vars(Metadata))
    # The class Metadata, then BUILD with (no dict state, slot state {"version": 0}): setattr(Metadata, ...).
    build_on_class = b"\x80\x02" + pickle.dumps(Metadata, protocol=2)[2:-1] + b"N}X\x07\x00\x00\x00versionK\x00s\x86b."
    file.write_bytes(build_on_class)
    with pytest.raises(CheckpointError, match="sets attributes of the class Metadata"):
        read_metadata(file)
    assert dict(vars(Metadata)) == before
    metadata = read_metadata(trainer_checkpoint / METADATA_FILE)
    for info in metadata.storage_data.values():
        info.relative_path = "../elsewhere.distcp"
    file.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        read_metadata(file)


@pytest.mark.parametrize(("content", "message"), [(b"", "is an empty file"), (b"\x80\x04\x95", "truncated or corrupt")])
def test_empty_or_truncated_metadata_is_called_so(trainer_checkpoint, tmp_path, content, message):
    directory = _crafted(trainer_checkpoint, tmp_path, content)
    with pytest.raises(CheckpointError, match=message):
        read_full_checkpoint(directory, TorchCheckpointIO())


def test_a_truncated_shard_file_is_one_checkpoint_error(trainer_checkpoint, tmp_path):
    directory = _crafted(trainer_checkpoint, tmp_path, (trainer_checkpoint / METADATA_FILE).read_bytes())
    [shard] = directory.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="crafted"):
        dict(read_full_checkpoint(directory, TorchCheckpointIO()))


def _load_sharded(path):
    strategy = make_strategy(auto_wrap_policy={Block})
    module, optimizer = build(strategy)
    try:
        strategy.load_checkpoint(path, {"module": module, "optimizers": [optimizer]})
    except CheckpointError as error:
        return str(error)
    return "loaded"


def test_fsdp_on_two_ranks_refuses_a_crafted_metadata_file_on_every_rank(tmp_path):
    marker = tmp_path / "ran"
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    (directory / METADATA_FILE).write_bytes(pickle.dumps(_System(marker)))
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as workers:
        outcomes = workers.run(_load_sharded, str(directory))
    assert all("not DCP metadata as torch writes it" in outcome for outcome in outcomes), outcomes
    assert not marker.exists()


def _distcp_linked_outside(directory, tmp_path):
    [piece] = directory.glob("*.distcp")
    moved = tmp_path / "elsewhere.distcp"
    os.rename(piece, moved)
    piece.symlink_to(moved)


def _distcp_replaced_by_a_pipe(directory, tmp_path):
    [piece] = directory.glob("*.distcp")
    piece.unlink()
    os.mkfifo(piece)


def _plain_state_linked_outside(directory, tmp_path):
    moved = tmp_path / "elsewhere.pt"
    os.rename(directory / "plain_state.pt", moved)
    (directory / "plain_state.pt").symlink_to(moved)


_LAYOUTS = {
    "a .distcp piece linked outside": (_distcp_linked_outside, r"\.distcp' leads outside the checkpoint"),
    "a pipe in place of a .distcp piece": (_distcp_replaced_by_a_pipe, r"\.distcp' is a named pipe"),
    "plain_state.pt linked outside": (_plain_state_linked_outside, r"plain_state\.pt' leads outside the checkpoint"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", list(_LAYOUTS))
@pytest.mark.parametrize("entry", ["fit", "validate", "consolidate", "read_full_checkpoint", "load_into"])
def test_a_piece_that_is_a_link_out_or_a_pipe_is_refused_by_every_reader_without_blocking(
    trainer_checkpoint, tmp_path, capsys, layout, entry
):
    directory = _crafted(trainer_checkpoint, tmp_path, (trainer_checkpoint / METADATA_FILE).read_bytes())
    craft, message = _LAYOUTS[layout]
    craft(directory, tmp_path)
    if entry == "consolidate":
        assert main(["consolidate", str(directory), str(tmp_path / "out.pt")]) == 2
        assert re.search(message, capsys.readouterr().err)
        assert not (tmp_path / "out.pt").exists()
    else:
        with pytest.raises(CheckpointError, match=message):
            dict(_LOADS[entry](directory, tmp_path))
