import multiprocessing
import os
import shutil
import subprocess
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.callbacks import ModelCheckpoint
from stratagem.callbacks.model_checkpoint import find_last_checkpoint
from stratagem.checkpoint_io import PathLike, atomic, move_into_place, temporary_sibling
from stratagem.loggers import CSVLogger
from stratagem.strategies import SingleDeviceStrategy
from stratagem.trainer.checkpointing import resolve_ckpt_path


def _names(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


def _run_directory(root: Path, version: int = 0) -> Path:
    """Where the fit numbered ``version`` under ``root`` saves by default."""
    return root / "checkpoints" / f"version_{version}"


class _ScriptedMetric(ClassifierModule):
    """Logs ``score`` = the next value of a script at every validation."""

    def __init__(self, scores):
        super().__init__()
        self.scores = list(scores)

    def validation_step(self, batch, batch_idx, *args):
        pass

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.log("score", self.scores.pop(0))


def _fit(root, callback, module=None, ckpt_path=None, **options):
    trainer = quiet_trainer(root, enable_checkpointing=True, callbacks=[callback], **options)
    train, val = make_loader(num_samples=32, batch_size=8), make_loader(num_samples=8)
    trainer.fit(module or ClassifierModule(), train, val, ckpt_path=ckpt_path)
    return trainer


def test_every_n_train_steps_saves_and_keeps_the_most_recent_by_default(tmp_path):
    callback = ModelCheckpoint(every_n_train_steps=3, save_top_k=2)
    _fit(tmp_path, callback, max_steps=10)
    # Steps 3, 6, 9, and the final step 10 at the end of training; the two newest stay.
    assert _names(_run_directory(tmp_path)) == ["epoch=2-step=10.ckpt", "epoch=2-step=9.ckpt"]
    assert callback.best_model_path == str(_run_directory(tmp_path) / "epoch=2-step=10.ckpt")


def test_every_n_epochs_saves_at_the_end_of_epochs(tmp_path):
    callback = ModelCheckpoint(every_n_epochs=2, save_top_k=-1, dirpath=tmp_path / "ckpts")
    _fit(tmp_path, callback, max_epochs=4)
    assert _names(tmp_path / "ckpts") == ["epoch=1-step=8.ckpt", "epoch=3-step=16.ckpt"]


@pytest.mark.parametrize(("mode", "kept", "best"), [("min", [0.2, 0.3], 0.2), ("max", [0.9, 0.5], 0.9)])
def test_top_k_keeps_the_best_checkpoints_by_the_monitored_metric(tmp_path, mode, kept, best):
    scores = [0.5, 0.3, 0.9, 0.2, 0.4]
    callback = ModelCheckpoint(monitor="score", mode=mode, save_top_k=2, filename="{epoch}-{score:.1f}")
    _fit(tmp_path, callback, module=_ScriptedMetric(scores), max_epochs=5)
    epochs = {score: index for index, score in enumerate(scores)}
    expected = sorted(f"epoch={epochs[score]}-score={score:.1f}.ckpt" for score in kept)
    assert _names(_run_directory(tmp_path)) == expected
    assert sorted(callback.best_k_models.values()) == pytest.approx(sorted(kept))
    assert callback.best_model_score == pytest.approx(best)
    assert Path(callback.best_model_path).name == f"epoch={epochs[best]}-score={best:.1f}.ckpt"


def test_a_resumed_run_saves_into_a_new_directory_and_leaves_the_first_runs_checkpoints(tmp_path):
    _fit(tmp_path, ModelCheckpoint(every_n_train_steps=3), max_steps=6)
    assert _names(_run_directory(tmp_path)) == ["epoch=1-step=6.ckpt"]
    saved = torch.load(_run_directory(tmp_path) / "epoch=1-step=6.ckpt", weights_only=True)
    (state,) = saved["callbacks"].values()
    assert state["best_model_path"].endswith("epoch=1-step=6.ckpt")
    resumed = _fit(tmp_path, ModelCheckpoint(every_n_train_steps=3), max_steps=9, ckpt_path="last")
    assert resumed.global_step == 9
    assert _names(_run_directory(tmp_path)) == ["epoch=1-step=6.ckpt"]
    assert _names(_run_directory(tmp_path, 1)) == ["epoch=2-step=9.ckpt"]


def test_a_resumed_run_in_the_same_dirpath_deletes_only_what_it_wrote(tmp_path):
    dirpath = tmp_path / "ckpts"
    _fit(tmp_path, ModelCheckpoint(dirpath=dirpath, every_n_train_steps=3), max_steps=6)
    callback = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=3)
    _fit(tmp_path, callback, max_steps=12, ckpt_path="last")
    # The first run's step 6 left the top 1 at step 9 but stays; this run's step 9 made way for step 12.
    assert _names(dirpath) == ["epoch=1-step=6.ckpt", "epoch=2-step=12.ckpt"]
    assert callback.best_k_models == {str(dirpath / "epoch=2-step=12.ckpt"): 12.0}


def test_a_second_run_in_the_same_root_neither_overwrites_nor_deletes_the_first_ones_checkpoints(tmp_path):
    first = _fit(tmp_path, ModelCheckpoint(every_n_train_steps=2, save_last=True), max_steps=4)
    saved = {path.name: path.read_bytes() for path in _run_directory(tmp_path).iterdir()}
    second = _fit(tmp_path, ModelCheckpoint(every_n_train_steps=2, save_last=True), max_steps=6)
    assert {path.name: path.read_bytes() for path in _run_directory(tmp_path).iterdir()} == saved
    assert _names(_run_directory(tmp_path, 1)) == ["epoch=1-step=6.ckpt", "last.ckpt"]
    assert first.checkpoint_callback.best_model_path != second.checkpoint_callback.best_model_path


def test_a_runs_logs_and_checkpoints_share_its_version_number(tmp_path):
    first = _fit(tmp_path, ModelCheckpoint(), max_steps=2, logger="csv")
    (tmp_path / "checkpoints" / "version_1").mkdir()  # taken by a run that has not logged yet
    loggers = ["csv", CSVLogger(tmp_path, name="mine"), CSVLogger(tmp_path, name="fixed", version=7)]
    second = _fit(tmp_path, ModelCheckpoint(), max_steps=2, logger=loggers)
    assert (first.logger.version, first.checkpoint_callback.dirpath) == (0, _run_directory(tmp_path, 0))
    assert (second.logger.version, second.checkpoint_callback.dirpath) == (2, _run_directory(tmp_path, 2))
    assert (tmp_path / "csv_logs" / "version_2" / "metrics.csv").is_file()
    assert [logger.version for logger in second.loggers[1:]] == [2, 7]  # a version given is kept


def _concurrent_fit(root, steps, ready):
    ready.wait(timeout=60)
    trainer = _fit(root, ModelCheckpoint(every_n_train_steps=steps), max_steps=steps)
    return trainer.checkpoint_callback.best_model_path, steps


@pytest.fixture(scope="module")
def spawned_runs():
    """Three spawned processes (and a manager for events) that the concurrency tests share."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(3, mp_context=context) as pool:
        yield manager, pool


def test_concurrent_runs_in_the_same_root_keep_every_runs_checkpoints(tmp_path, spawned_runs):
    manager, pool = spawned_runs
    ready = manager.Event()
    futures = [pool.submit(_concurrent_fit, tmp_path, steps, ready) for steps in (2, 3, 4)]
    ready.set()
    results = [future.result(timeout=120) for future in futures]
    paths = [Path(path) for path, _ in results]
    assert len({path.parent for path in paths}) == 3
    assert sorted(path.parent.name for path in paths) == ["version_0", "version_1", "version_2"]
    for path, steps in results:
        assert torch.load(path, weights_only=True)["loops"]["fit"]["global_step"] == steps
        assert _names(Path(path).parent) == [Path(path).name]


def test_last_is_the_newest_complete_checkpoint_of_every_run_under_the_root(tmp_path):
    def write(path, seconds_ago):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        then = time.time() - seconds_ago
        os.utime(path, (then, then))
        return path

    root = tmp_path / "checkpoints"
    write(root / "version_0" / "epoch=0-step=30.ckpt", 50)
    write(root / "version_1" / "last.ckpt", 40)  # a crash came after the next top-k save, before last
    newest = write(root / "version_1" / "epoch=0-step=40.ckpt", 30)
    write(root / "version_2" / temporary_sibling(root / "version_2" / "last.ckpt").name, 0)  # half-written
    write(root / "version_2" / "notes.txt", 0)
    (root / "version_2" / "last.ckpt").symlink_to("missing.ckpt")
    write(root / "not_a_version" / "epoch=0-step=99.ckpt", 0)
    assert find_last_checkpoint(root) == newest
    trainer = quiet_trainer(tmp_path, enable_checkpointing=True)
    assert resolve_ckpt_path(trainer, "last", "fit") == str(newest)
    write(root / "epoch=0-step=50.ckpt", 10)  # the layout before version directories still counts
    assert resolve_ckpt_path(trainer, "last", "fit") == str(root / "epoch=0-step=50.ckpt")


def test_a_fit_removes_what_a_crashed_run_left_under_temporary_names_and_nothing_else(tmp_path):
    crashed = _run_directory(tmp_path, 0)
    crashed.mkdir(parents=True)
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    token = temporary_sibling(crashed / "last.ckpt").name.rsplit("-", 1)[1]
    host = atomic._host_tag()
    left = crashed / f".epoch=0-step=4.ckpt.tmp-{host}-{process.pid}-{token}"
    (left / "shards").mkdir(parents=True)  # a directory checkpoint, half written
    (left / "shards" / "0.pt").write_bytes(b"x" * 1000)
    kept = [
        crashed / "epoch=0-step=2.ckpt",
        crashed / ".notes",
        crashed / f".last.ckpt.tmp-{host}-{os.getpid()}-{token}",
    ]
    for path in [left, left / "shards", left / "shards" / "0.pt", *kept]:
        if not path.exists():
            path.write_bytes(b"x")
        os.utime(path, (time.time() - 120, time.time() - 120))
    _fit(tmp_path, ModelCheckpoint(every_n_train_steps=2), max_steps=2)
    assert sorted(crashed.iterdir()) == sorted(kept)
    assert _names(_run_directory(tmp_path, 1)) == ["epoch=0-step=2.ckpt"]


def test_resuming_says_which_checkpoint_and_what_differs_from_the_run_that_saved_it(tmp_path, capsys):
    _fit(tmp_path, ModelCheckpoint(every_n_train_steps=2), max_steps=2, precision="bf16-mixed")
    capsys.readouterr()
    _fit(tmp_path, ModelCheckpoint(every_n_train_steps=2), max_steps=4, ckpt_path="last")
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"stratagem: resuming from {_run_directory(tmp_path) / 'epoch=0-step=2.ckpt'} (epoch 0, step 2); "
        "it was saved with precision bf16-mixed, this run uses precision 32-true"
    )


def test_a_metric_that_was_never_logged_saves_nothing_and_warns(tmp_path):
    callback = ModelCheckpoint(monitor="missing", every_n_train_steps=2)
    with pytest.warns(UserWarning, match="ModelCheckpoint\\(monitor='missing'\\) found no such metric"):
        _fit(tmp_path, callback, max_steps=2)
    assert _names(_run_directory(tmp_path)) == []


def test_save_last_writes_last_and_best_resumes_from_the_best(tmp_path):
    callback = ModelCheckpoint(monitor="score", save_last=True)
    trainer = _fit(tmp_path, callback, module=_ScriptedMetric([0.3, 0.1, 0.2]), max_epochs=3)
    assert _names(_run_directory(tmp_path)) == ["epoch=1-step=8.ckpt", "last.ckpt"]
    last = torch.load(_run_directory(tmp_path) / "last.ckpt", weights_only=True)
    assert last["loops"]["fit"]["global_step"] == 12
    resumed = quiet_trainer(tmp_path, max_epochs=3)
    resumed.validate(ClassifierModule(), make_loader(), ckpt_path=callback.best_model_path)
    assert trainer.checkpoint_callback is callback


def test_save_last_as_link_points_at_the_newest_checkpoint(tmp_path):
    callback = ModelCheckpoint(save_last="link", every_n_train_steps=2)
    _fit(tmp_path, callback, max_steps=4)
    last = _run_directory(tmp_path) / "last.ckpt"
    assert last.is_symlink()
    assert os.readlink(last) == "epoch=0-step=4.ckpt"
    assert torch.load(last, weights_only=True)["loops"]["fit"]["global_step"] == 4


def test_finding_the_last_checkpoint_skips_temporary_files_and_dangling_links(tmp_path):
    (tmp_path / "epoch=0-step=2.ckpt").write_bytes(b"x")
    temporary_sibling(tmp_path / "last.ckpt").write_bytes(b"partial")
    (tmp_path / "last.ckpt").symlink_to("epoch=9-step=99.ckpt")
    assert find_last_checkpoint(tmp_path) == tmp_path / "epoch=0-step=2.ckpt"
    assert find_last_checkpoint(tmp_path / "missing") is None


def test_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="mode='best'"):
        ModelCheckpoint(mode="best")
    with pytest.raises(ValueError, match="save_top_k=-2"):
        ModelCheckpoint(save_top_k=-2)
    with pytest.raises(ValueError, match="every_n_train_steps=0"):
        ModelCheckpoint(every_n_train_steps=0)
    with pytest.raises(ValueError, match="give one of them"):
        ModelCheckpoint(every_n_train_steps=1, every_n_epochs=1)
    with pytest.raises(ValueError, match="save_last='yes'"):
        ModelCheckpoint(save_last="yes")


def test_state_is_restored_only_for_the_same_directory(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path / "a")
    callback.best_k_models = {str(tmp_path / "a" / "x.ckpt"): 1.0}
    callback.best_model_path = str(tmp_path / "a" / "x.ckpt")
    same, other = ModelCheckpoint(dirpath=tmp_path / "a"), ModelCheckpoint(dirpath=tmp_path / "b")
    same.load_state_dict(callback.state_dict())
    other.load_state_dict(callback.state_dict())
    assert same.best_model_path == callback.best_model_path
    assert other.best_model_path == ""


class _DirectoryStrategy(SingleDeviceStrategy):
    """Saves a checkpoint as a directory with one file per entry, as sharded strategies save shards."""

    def save_checkpoint(self, path: PathLike, state):
        target = Path(path)
        temporary = temporary_sibling(target)
        temporary.mkdir(parents=True)
        for key, value in state.items():
            torch.save(self._state_of(value), temporary / f"{key}.pt")
        self.before_move_into_place(target)
        move_into_place(temporary, target)

    def before_move_into_place(self, target: Path) -> None:
        """The new checkpoint is whole under its temporary name; the previous one must still be at ``target``."""

    def load_checkpoint(self, path: PathLike, state, strict=True, weights_only=True):
        directory = Path(path)
        remaining = {file.stem: torch.load(file, weights_only=weights_only) for file in directory.iterdir()}
        state["module"].load_state_dict(remaining.pop("module"), strict=strict)
        if "optimizers" in state:
            for optimizer, optimizer_state in zip(state["optimizers"], remaining.pop("optimizers")):
                optimizer.load_state_dict(optimizer_state)
        return remaining

    def remove_checkpoint(self, path: PathLike) -> None:
        shutil.rmtree(path)


def test_directory_checkpoints_are_kept_replaced_and_resumed_like_files(tmp_path):
    callback = ModelCheckpoint(every_n_train_steps=2, save_last=True)
    trainer = _fit(tmp_path, callback, strategy=_DirectoryStrategy(), max_steps=5)
    assert _names(_run_directory(tmp_path)) == ["epoch=1-step=5.ckpt", "last.ckpt"]
    assert (_run_directory(tmp_path) / "last.ckpt" / "module.pt").is_file()
    assert trainer.global_step == 5
    resumed = _fit(
        tmp_path, ModelCheckpoint(every_n_train_steps=2, save_last=True), strategy=_DirectoryStrategy(), max_steps=6
    )
    assert resumed.global_step == 6


class _LastSaveFails(_DirectoryStrategy):
    """Records whether the previous ``last.ckpt`` is whole while the next is written; fails writing the second."""

    def __init__(self):
        super().__init__()
        self.previous_last_whole = []

    def before_move_into_place(self, target: Path) -> None:
        if target.name != "last.ckpt":
            return
        self.previous_last_whole.append((target / "module.pt").is_file() and (target / "loops.pt").is_file())
        if len(self.previous_last_whole) == 2:
            raise OSError("disk full")


def test_saving_last_over_a_directory_checkpoint_keeps_the_previous_one_whole_until_the_new_one_is(tmp_path):
    strategy = _LastSaveFails()
    with pytest.raises(OSError, match="disk full"):
        _fit(tmp_path, ModelCheckpoint(every_n_train_steps=2, save_last=True), strategy=strategy, max_steps=5)
    assert strategy.previous_last_whole == [False, True]
    last = _run_directory(tmp_path) / "last.ckpt"
    assert torch.load(last / "loops.pt", weights_only=True)["fit"]["global_step"] == 2


def test_saving_last_over_a_link_replaces_the_link_and_leaves_the_checkpoint_it_pointed_to(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    first = ModelCheckpoint(dirpath=checkpoints, save_last="link", every_n_train_steps=2)
    _fit(tmp_path, first, strategy=_DirectoryStrategy(), max_steps=2)
    [linked] = [path for path in checkpoints.iterdir() if path.name != "last.ckpt"]
    second = ModelCheckpoint(dirpath=checkpoints, save_last=True, every_n_train_steps=2, save_top_k=0)
    # Resumed, the run carries on the first one's last (another run would take a name of its own).
    _fit(tmp_path, second, strategy=_DirectoryStrategy(), max_steps=4, ckpt_path="last")
    last = checkpoints / "last.ckpt"
    assert not last.is_symlink()
    assert torch.load(last / "loops.pt", weights_only=True)["fit"]["global_step"] == 4
    assert torch.load(linked / "loops.pt", weights_only=True)["fit"]["global_step"] == 2
    assert not [path for path in checkpoints.iterdir() if path.name.startswith(".")], "no temporary left"


def _contents(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def test_a_second_run_given_the_same_dirpath_takes_new_names_and_leaves_the_first_runs_files(tmp_path):
    dirpath = tmp_path / "shared"
    _fit(tmp_path, ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_top_k=-1, save_last=True), max_steps=4)
    first = _contents(dirpath)
    assert sorted(first) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
    second = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_top_k=-1, save_last=True)
    with pytest.warns(UserWarning, match=r"already holds last\.ckpt, which another run wrote.*as last-v1\.ckpt"):
        _fit(tmp_path, second, module=ClassifierModule(lr=0.5), max_steps=4)
    assert {name: content for name, content in _contents(dirpath).items() if name in first} == first
    assert _names(dirpath) == sorted([*first, "epoch=0-step=2-v1.ckpt", "epoch=0-step=4-v1.ckpt", "last-v1.ckpt"])
    assert second.best_model_path == str(dirpath / "epoch=0-step=4-v1.ckpt")
    assert second.last_model_path == str(dirpath / "last-v1.ckpt")
    assert not [name for name in _names(dirpath) if name.startswith(".")], "no claim marker left"


def test_a_run_resumed_into_its_own_dirpath_carries_on_its_last_and_its_names(tmp_path, recwarn):
    dirpath = tmp_path / "own"
    _fit(tmp_path, ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_top_k=-1, save_last=True), max_steps=2)
    resumed = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_top_k=-1, save_last=True)
    _fit(tmp_path, resumed, max_steps=4, ckpt_path="last")
    assert _names(dirpath) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
    assert torch.load(dirpath / "last.ckpt", weights_only=True)["loops"]["fit"]["global_step"] == 4
    assert not [warning for warning in recwarn if "already holds" in str(warning.message)]


def test_a_last_path_named_by_a_checkpoint_outside_its_dirpath_is_never_written(tmp_path):
    dirpath = tmp_path / "own"
    _fit(tmp_path, ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_last=True), max_steps=2)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    checkpoint = torch.load(dirpath / "last.ckpt", weights_only=True)
    (state,) = checkpoint["callbacks"].values()
    state["last_model_path"] = str(victim)
    torch.save(checkpoint, dirpath / "last.ckpt")
    resumed = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_last=True)
    with pytest.warns(UserWarning, match="already holds last.ckpt"):
        _fit(tmp_path, resumed, max_steps=4, ckpt_path=dirpath / "last.ckpt")
    assert victim.read_text() == "keep me"
    assert resumed.last_model_path == str(dirpath / "last-v1.ckpt")


def test_a_name_is_claimed_by_one_writer_only_until_its_checkpoint_is_in_place(tmp_path):
    target = tmp_path / "epoch=0-step=2.ckpt"
    assert atomic.claim_name(target)
    assert not atomic.claim_name(target), "reserved by a writer in progress"
    target.write_bytes(b"written")
    atomic.release_name(target)
    assert not atomic.claim_name(target), "held by a checkpoint"
    other = tmp_path / "other.ckpt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".other.ckpt.claim").write_text(f"{atomic._host_tag()}-{dead.stdout.strip()}")
    assert atomic.claim_name(other), "a crashed writer's reservation is taken over"
    (tmp_path / ".epoch=0-step=2.ckpt.claim").write_text(f"{atomic._host_tag()}-{os.getpid()}")
    assert atomic.remove_stale_temporaries(tmp_path) == [tmp_path / ".epoch=0-step=2.ckpt.claim"]
    assert _names(tmp_path) == [".other.ckpt.claim", "epoch=0-step=2.ckpt"], "a live writer's reservation stays"


def _concurrent_fit_into(root, dirpath, lr, ready):
    ready.wait(timeout=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the run that takes the -v1 name says so
        trainer = _fit(
            root, ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2), ClassifierModule(lr=lr), max_steps=2
        )
    return trainer.checkpoint_callback.best_model_path, trainer.model.layers[0].weight.detach().clone()


def test_concurrent_runs_given_the_same_dirpath_each_keep_their_own_checkpoint(tmp_path, spawned_runs):
    manager, pool = spawned_runs
    ready = manager.Event()
    shared = tmp_path / "shared"
    futures = [pool.submit(_concurrent_fit_into, tmp_path / str(lr), shared, lr, ready) for lr in (0.1, 0.5)]
    ready.set()
    results = [future.result(timeout=120) for future in futures]
    assert sorted(Path(path).name for path, _ in results) == ["epoch=0-step=2-v1.ckpt", "epoch=0-step=2.ckpt"]
    for path, weight in results:
        assert torch.equal(torch.load(path, weights_only=True)["module"]["layers.0.weight"], weight)
    assert _names(tmp_path / "shared") == ["epoch=0-step=2-v1.ckpt", "epoch=0-step=2.ckpt"]


@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_nan_monitored_value_ranks_last_and_leaves_the_top_k_to_finite_ones(tmp_path, mode):
    callback = ModelCheckpoint(monitor="score", mode=mode, save_top_k=1, filename="{epoch}")
    _fit(tmp_path, callback, module=_ScriptedMetric([float("nan"), 0.5, float("nan")]), max_epochs=3)
    assert _names(_run_directory(tmp_path)) == ["epoch=1.ckpt"]
    assert callback.best_model_score == pytest.approx(0.5)
