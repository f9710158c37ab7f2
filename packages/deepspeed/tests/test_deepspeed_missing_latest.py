"""A checkpoint the strategy saved through DeepSpeed's engine, whose ``latest`` file is gone, is refused
naming the missing file and the tag directories found, never read as a checkpoint without its module."""

import pytest
import torch

from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint
from stratagem.cli.main import main
from stratagem_deepspeed.checkpoint_layout import METADATA_KEY, STATE_FILE


def _engine_saved_without_latest(directory):
    """The layout the strategy writes (shards in a tag directory, plain entries beside), less ``latest``."""
    (directory / "global_step3").mkdir(parents=True)
    torch.save({"module": {}}, directory / "global_step3" / "mp_rank_00_model_states.pt")
    metadata = {"module_key": "module", "optimizers_key": "optimizers", "world_size": 2, "zero_stage": 3}
    torch.save({"loops": {"fit": {"global_step": 3}}, METADATA_KEY: metadata}, directory / STATE_FILE)
    return directory


def test_a_checkpoint_without_latest_is_refused_naming_the_file_and_the_tags_found(tmp_path, capsys):
    directory = _engine_saved_without_latest(tmp_path / "checkpoint")
    message = r"checkpoint' lacks its 'latest' file.*tag directories with shards: 'global_step3'"
    with pytest.raises(CheckpointError, match=message):
        read_full_checkpoint(directory, TorchCheckpointIO())
    assert main(["consolidate", str(directory), str(tmp_path / "out.pt")]) == 2
    assert "lacks its 'latest' file" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()
