"""Text read from a checkpoint or another file reaches the terminal with its control characters escaped and
its length bounded: a crafted file can neither clear the screen, retitle the window, nor forge a line of
stratagem's own output."""

from __future__ import annotations

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.checkpoint_io import CheckpointError, TorchCheckpointIO, read_full_checkpoint
from stratagem.cli import doctor
from stratagem.cli._listing import format_table
from stratagem.cli.main import main
from stratagem.launchers import RankFailedError, RankFailure

CLEAR_SCREEN = "\x1b[2J"
TITLE = "\x1b]0;owned\x07"
FORGED_LINE = "\nstratagem: resuming from /somewhere/else"


def _assert_escaped(text: str) -> None:
    assert "\x1b" not in text
    assert "\x07" not in text
    assert not any(line.startswith("stratagem: resuming from /somewhere") for line in text.splitlines())


def test_the_resume_message_escapes_the_checkpoints_fields_and_its_file_name(tmp_path, capsys):
    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(ClassifierModule(), make_loader())
    path = tmp_path / f"run{CLEAR_SCREEN}.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["saved_by"]["strategy"] = TITLE + FORGED_LINE
    torch.save(checkpoint, path)
    capsys.readouterr()
    quiet_trainer(tmp_path, max_steps=2).fit(ClassifierModule(), make_loader(), ckpt_path=path)
    error = capsys.readouterr().err
    assert "stratagem: resuming from" in error
    assert "\\x1b]0;owned\\x07\\nstratagem: resuming from /somewhere/else" in error
    assert "run\\x1b[2J.ckpt" in error
    _assert_escaped(error)


def test_consolidate_escapes_the_entry_names_it_lists(tmp_path, capsys):
    source = tmp_path / "crafted.ckpt"
    torch.save({"module": {}, CLEAR_SCREEN + TITLE + FORGED_LINE: 1}, source)
    assert main(["consolidate", str(source), str(tmp_path / "out.pt")]) == 0
    output = capsys.readouterr().out
    assert "with entries: module, \\x1b[2J" in output
    _assert_escaped(output)


def test_a_checkpoint_error_bounds_what_it_echoes_of_the_file(tmp_path):
    source = tmp_path / "crafted.ckpt"
    torch.save({"x" * (1 << 20): 1}, source)
    with pytest.raises(CheckpointError, match="lacks 'module'") as raised:
        read_full_checkpoint(source, TorchCheckpointIO(), required=["module"])
    assert len(str(raised.value)) < 2000


def test_a_rank_traceback_is_shown_escaped_and_bounded():
    text = "Traceback (most recent call last):\n" + "x" * (1 << 20) + f"\nRuntimeError: {TITLE}{CLEAR_SCREEN}"
    message = str(RankFailedError(RankFailure(1, 42, "raised an exception", text)))
    _assert_escaped(message)
    assert len(message) < 25_000
    assert message.endswith("RuntimeError: \\x1b]0;owned\\x07\\x1b[2J")


def test_doctor_escapes_what_plugins_and_the_environment_report():
    report = doctor.collect()
    report["cluster_environment"] = {"name": None, "repr": None, "error": TITLE + FORGED_LINE, "place": None}
    report["problems"] = [
        {
            "group": "stratagem.strategies",
            "distribution": "evil" + CLEAR_SCREEN,
            "entry_point": "x = y",
            "stage": "register",
            "error": "boom" + FORGED_LINE,
            "details": f"Traceback\n  line {TITLE}\nValueError: boom",
        }
    ]
    rendered = doctor.render(report, tracebacks=True)
    _assert_escaped(rendered)
    assert "evil\\x1b[2J" in rendered
    assert "      Traceback\n        line \\x1b]0;owned\\x07\n" in rendered


def test_listings_escape_what_a_plugin_declares():
    table = format_table(["NAME", "DESCRIPTION"], [["evil" + CLEAR_SCREEN, "a strategy" + TITLE + FORGED_LINE]])
    _assert_escaped(table)
    assert (
        table.splitlines()[1] == "evil\\x1b[2J  a strategy\\x1b]0;owned\\x07\\nstratagem: resuming from /somewhere/else"
    )
