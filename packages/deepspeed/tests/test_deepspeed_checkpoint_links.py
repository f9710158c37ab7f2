"""A DeepSpeed checkpoint is read only from files inside its directory, each checked weights-only first.

DeepSpeed's own reader unpickles every file it opens without restriction, so a crafted checkpoint whose
payload sits behind a link (a ``zero/`` folder, a tag directory, a shard, ``latest``), a hard link, or a
pipe must be refused, naming the file, by every way stratagem reads it: the plain reader, consolidation,
and resuming through DeepSpeed's engine (also with ``load_universal``, which reads ``<tag>/zero/``), at
stage 2 and stage 3.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from deepspeed_testing import load_and_train, train_and_save, worker_pool

from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint
from stratagem.cli.main import main

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


class _TouchesAFile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def workers():
    with worker_pool() as pool:
        yield pool


@pytest.fixture(scope="module")
def saved(workers, tmp_path_factory):
    root = tmp_path_factory.mktemp("linked")
    for alias in ("deepspeed_stage_2", "deepspeed_stage_3"):
        workers.run(train_and_save, alias, 2, str(root / alias))
    return root


def _tag(checkpoint: Path) -> Path:
    return checkpoint / (checkpoint / "latest").read_text().strip()


def _payload(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"optimizer_state_dict": _TouchesAFile(marker)}, path)
    return path


def _zero_linked_outside(checkpoint: Path, outside: Path, marker: Path) -> None:
    # The reported case: <tag>/zero is a link to a folder elsewhere holding universal-checkpoint files.
    _payload(outside / "zero" / "optimizer_state.pt", marker)
    _payload(outside / "zero" / "weight" / "fp32.pt", marker)
    (_tag(checkpoint) / "zero").symlink_to(outside / "zero")


def _tag_linked_outside(checkpoint: Path, outside: Path, marker: Path) -> None:
    tag = _tag(checkpoint)
    shutil.move(tag, outside / tag.name)
    [shard] = (outside / tag.name).glob("*zero_pp_rank_0_*optim_states.pt")
    _payload(shard, marker)
    tag.symlink_to(outside / tag.name)


def _shard_linked_outside(checkpoint: Path, outside: Path, marker: Path) -> None:
    [shard] = _tag(checkpoint).glob("*zero_pp_rank_1_*optim_states.pt")
    shard.unlink()
    shard.symlink_to(_payload(outside / "shard.pt", marker))


def _shard_hard_linked_to_a_payload(checkpoint: Path, outside: Path, marker: Path) -> None:
    # A hard link is a regular file inside the directory: its content, not its location, is what is checked.
    [shard] = _tag(checkpoint).glob("*zero_pp_rank_0_*optim_states.pt")
    shard.unlink()
    os.link(_payload(outside / "shard.pt", marker), shard)


def _pt_name_linked_to_another_file_inside(checkpoint: Path, outside: Path, marker: Path) -> None:
    # DeepSpeed opens zero/optimizer_state.pt by that name; the file it reaches is named otherwise.
    _payload(checkpoint / "notes.txt", marker)
    (_tag(checkpoint) / "zero").mkdir()
    (_tag(checkpoint) / "zero" / "optimizer_state.pt").symlink_to(checkpoint / "notes.txt")


def _latest_linked_outside(checkpoint: Path, outside: Path, marker: Path) -> None:
    (outside / "latest").write_text(_tag(checkpoint).name)
    (checkpoint / "latest").unlink()
    (checkpoint / "latest").symlink_to(outside / "latest")


def _fifo_in_place_of_a_shard(checkpoint: Path, outside: Path, marker: Path) -> None:
    [shard] = _tag(checkpoint).glob("*zero_pp_rank_1_*optim_states.pt")
    shard.unlink()
    os.mkfifo(shard)


LAYOUTS: dict[str, tuple[Callable[[Path, Path, Path], None], str]] = {
    "zero folder linked outside": (_zero_linked_outside, r"zero' leads outside the checkpoint"),
    "tag folder linked outside": (_tag_linked_outside, r"global_step\d+' leads outside the checkpoint"),
    "shard linked outside": (_shard_linked_outside, r"optim_states\.pt' leads outside the checkpoint"),
    "shard hard-linked to a payload": (_shard_hard_linked_to_a_payload, r"optim_states\.pt' references posix\.system"),
    "a .pt name linked to another file inside": (
        _pt_name_linked_to_another_file_inside,
        r"optimizer_state\.pt' references posix\.system",
    ),
    "latest linked outside": (_latest_linked_outside, r"latest' leads outside the checkpoint"),
    "a pipe in place of a shard": (_fifo_in_place_of_a_shard, r"optim_states\.pt' is a named pipe"),
}


def _crafted(saved: Path, alias: str, tmp_path: Path, layout: str) -> tuple[Path, Path, str]:
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(saved / alias, checkpoint)
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "payload-ran"
    craft, message = LAYOUTS[layout]
    craft(checkpoint, outside, marker)
    return checkpoint, marker, message


def _resume(strategy: str | dict, path: str) -> str:
    try:
        load_and_train(strategy, path, 1, 2)
    except CheckpointError as error:
        return str(error)
    return "loaded"


def _universal(stage: int) -> dict:
    return {"config": {"zero_optimization": {"stage": stage}, "checkpoint": {"load_universal": True}}}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("alias", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_a_payload_reached_through_any_link_layout_never_runs_and_is_refused_naming_the_file(
    workers, saved, tmp_path, capsys, alias, layout
):
    checkpoint, marker, message = _crafted(saved, alias, tmp_path, layout)
    with pytest.raises(CheckpointError, match=message):
        read_full_checkpoint(checkpoint, TorchCheckpointIO())
    assert main(["consolidate", str(checkpoint), str(tmp_path / "out.pt")]) == 2
    assert _matches(message, capsys.readouterr().err)
    stage = int(alias[-1])
    for strategy in (alias, _universal(stage)):
        outcomes = workers.run(_resume, strategy, str(checkpoint))
        assert all(_matches(message, outcome) for outcome in outcomes), (strategy, outcomes)
    assert not marker.exists(), "the payload ran"
    assert not (tmp_path / "out.pt").exists()


def _matches(pattern: str, text: str) -> bool:
    return re.search(pattern, text) is not None


def test_a_checkpoint_reached_through_a_link_to_it_and_with_links_inside_it_loads(workers, saved, tmp_path):
    # What ModelCheckpoint(save_last="link") makes: the checkpoint path itself is a link; and links that
    # stay inside the directory are followed as DeepSpeed's own reader follows them.
    checkpoint = tmp_path / "real"
    shutil.copytree(saved / "deepspeed_stage_2", checkpoint)
    [shard] = _tag(checkpoint).glob("*zero_pp_rank_1_*optim_states.pt")
    moved = checkpoint / "kept" / shard.name
    moved.parent.mkdir()
    shutil.move(shard, moved)
    shard.symlink_to(moved)
    link = tmp_path / "last.ckpt"
    link.symlink_to(checkpoint)
    expected = read_full_checkpoint(saved / "deepspeed_stage_2", TorchCheckpointIO())["module"]
    loaded = read_full_checkpoint(link, TorchCheckpointIO())["module"]
    assert all(torch.equal(loaded[name], expected[name]) for name in expected)
    outcomes = workers.run(_resume, "deepspeed_stage_2", str(link))
    assert outcomes == ["loaded", "loaded"]


def test_load_universal_on_a_plain_checkpoint_is_refused_by_name_also_through_a_link(workers, saved, tmp_path):
    # Before: DeepSpeed's bare "AssertionError: .../zero/optimizer_state.pt ... is missing" on every rank.
    link = tmp_path / "last.ckpt"
    link.symlink_to(saved / "deepspeed_stage_2")
    for path in (saved / "deepspeed_stage_2", link):
        outcomes = workers.run(_resume, _universal(2), str(path))
        assert all(_matches(r"sets checkpoint\.load_universal, but .* is not a universal", o) for o in outcomes), (
            outcomes
        )
