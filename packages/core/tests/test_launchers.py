"""The subprocess and multiprocessing launchers, run as users run them: a script started from a shell.

Each test runs a small job script with 2 ranks joined in a real gloo group, tags the job's
environment with a unique value, and checks afterwards that no process of it is left.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from stratagem.environments import LocalEnvironment
from stratagem.launchers import MultiprocessingLauncher, SubprocessLauncher, create_launcher
from stratagem.testing import processes_with_variable, wait_until_no_process_has

pytestmark = pytest.mark.distributed

TAG = "STRATAGEM_TEST_TAG"

JOB = textwrap.dedent(
    """
    import json, os, sys, time
    from datetime import timedelta
    from pathlib import Path

    from stratagem.environments import LocalEnvironment
    from stratagem.launchers import create_launcher


    def work(behaviour, out):
        import torch
        import torch.distributed as dist

        rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=60))
        names = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
        Path(out, f"rank-{rank}.json").write_text(
            json.dumps({"pid": os.getpid(), "env": {name: os.environ[name] for name in names}})
        )
        if behaviour == "raise" and rank == 1:
            raise RuntimeError("rank one fails on purpose")
        if behaviour == "loop":
            while True:
                dist.all_reduce(torch.ones(1))
                time.sleep(0.02)
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
        dist.destroy_process_group()
        return {"rank": rank, "sum": total.item()}


    if __name__ == "__main__":
        start_method, behaviour, out = sys.argv[1:4]
        launcher = create_launcher(start_method, LocalEnvironment(), num_processes=2, num_nodes=1)
        result = launcher.launch(work, behaviour, out)
        Path(out, f"result-{os.environ.get('LOCAL_RANK', 'caller')}.json").write_text(json.dumps(result))
    """
)


def _interruptible():
    # CI runners start jobs in the background of a non-interactive shell, where SIGINT arrives
    # ignored and stays ignored across exec: Ctrl-C could then never reach the job. Give it the
    # disposition an interactive terminal gives, which is what these tests are about.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def job(tmp_path):
    """Write the job as a script and as a ``python -m`` package; return a function that starts it."""
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "jobpkg").mkdir()
    (tmp_path / "jobpkg" / "__init__.py").write_text("")
    (tmp_path / "jobpkg" / "__main__.py").write_text(JOB)
    out = tmp_path / "out"
    out.mkdir()
    tag = uuid.uuid4().hex
    environment = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "MASTER_PORT")}
    environment.update({TAG: tag, "OMP_NUM_THREADS": "1"})

    def start(start_method, behaviour, *, module=False, extra_env=None):
        target = ["-m", "jobpkg"] if module else [str(tmp_path / "job.py")]
        process = subprocess.Popen(
            [sys.executable, *target, start_method, behaviour, str(out)],
            cwd=tmp_path,
            env={**environment, **(extra_env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_interruptible,
        )
        process.tag = tag
        process.out = out
        return process

    yield start
    leftovers = processes_with_variable(TAG, tag)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)


def _finish(process, timeout=90):
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout + stderr


def _rank_info(out, rank, timeout=60):
    path = Path(out) / f"rank-{rank}.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"rank {rank} never started"
        time.sleep(0.1)
    time.sleep(0.2)
    return json.loads(path.read_text())


def _assert_nothing_left(process):
    assert wait_until_no_process_has(TAG, process.tag, timeout=10) == []


@pytest.mark.parametrize("module", [False, True], ids=["script", "python-m"])
def test_subprocess_launcher_reruns_the_command_once_per_extra_rank(job, module):
    process = job("popen", "ok", module=module)
    returncode, output = _finish(process)
    assert returncode == 0, output
    out = process.out
    assert json.loads((out / "result-0.json").read_text()) == {"rank": 0, "sum": 3.0}
    assert json.loads((out / "result-1.json").read_text()) == {"rank": 1, "sum": 3.0}
    assert not (out / "result-caller.json").exists()
    rank0, rank1 = _rank_info(out, 0), _rank_info(out, 1)
    assert rank0["pid"] == process.pid
    assert rank0["env"]["MASTER_PORT"] == rank1["env"]["MASTER_PORT"]
    assert (rank0["env"]["LOCAL_RANK"], rank1["env"]["LOCAL_RANK"]) == ("0", "1")
    assert rank1["env"]["WORLD_SIZE"] == "2"
    _assert_nothing_left(process)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_multiprocessing_launcher_returns_rank_zeros_value_to_the_caller(job, start_method):
    process = job(start_method, "ok")
    returncode, output = _finish(process)
    assert returncode == 0, output
    assert json.loads((process.out / "result-caller.json").read_text()) == {"rank": 0, "sum": 3.0}
    assert {_rank_info(process.out, rank)["pid"] for rank in (0, 1)}.isdisjoint({process.pid})
    _assert_nothing_left(process)


@pytest.mark.parametrize("start_method", ["popen", "spawn"])
def test_a_rank_that_raises_ends_the_job_with_its_rank_and_traceback(job, start_method):
    process = job(start_method, "raise")
    returncode, output = _finish(process)
    assert returncode != 0
    assert "RankFailedError: rank 1 (pid" in output
    assert "--- traceback of rank 1 ---" in output
    assert "RuntimeError: rank one fails on purpose" in output
    _assert_nothing_left(process)


@pytest.mark.parametrize("start_method", ["popen", "fork"])
def test_sigkill_of_one_rank_ends_the_whole_job_within_30_seconds(job, start_method):
    process = job(start_method, "loop")
    victim = _rank_info(process.out, 1)["pid"]
    _rank_info(process.out, 0)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    returncode, output = _finish(process, timeout=60)
    assert time.monotonic() - killed_at < 30
    assert returncode != 0
    assert f"rank 1 (pid {victim}) was killed by SIGKILL" in output
    _assert_nothing_left(process)


@pytest.mark.parametrize("start_method", ["popen", "spawn"])
def test_ctrl_c_in_the_launching_process_ends_every_rank(job, start_method):
    process = job(start_method, "loop")
    for rank in (0, 1):
        _rank_info(process.out, rank)
    process.send_signal(signal.SIGINT)
    returncode, output = _finish(process, timeout=60)
    assert returncode != 0
    assert "KeyboardInterrupt" in output
    _assert_nothing_left(process)


def test_ranks_end_when_their_launching_process_is_killed(job):
    process = job("spawn", "loop")
    for rank in (0, 1):
        _rank_info(process.out, rank)
    process.kill()
    process.communicate(timeout=30)
    _assert_nothing_left(process)


def test_master_port_in_use_is_refused_before_any_rank_starts(job):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        process = job("spawn", "ok", extra_env={"MASTER_PORT": str(port)})
        returncode, output = _finish(process)
    assert returncode != 0
    assert f"MASTER_PORT={port} is already in use" in output
    assert not list(process.out.iterdir())


def test_create_launcher_maps_start_methods_to_launchers():
    environment = LocalEnvironment()
    assert isinstance(create_launcher("popen", environment, 2, 1), SubprocessLauncher)
    spawn = create_launcher("spawn", environment, 2, 1)
    assert isinstance(spawn, MultiprocessingLauncher)
    assert not spawn.caller_is_worker
    assert not spawn.is_interactive_compatible
    assert create_launcher("fork", environment, 2, 1).is_interactive_compatible
    with pytest.raises(ValueError, match=r"start_method='thread' is not valid; expected one of 'popen', 'spawn'"):
        create_launcher("thread", environment, 2, 1)


@pytest.mark.parametrize("argv", [["python"], ["python", "-"], ["python", "-i"]])
def test_a_command_that_cannot_be_rerun_is_refused_before_any_rank_starts(monkeypatch, argv):
    monkeypatch.setattr(sys, "orig_argv", argv)
    launcher = SubprocessLauncher(LocalEnvironment(), num_processes=2, num_nodes=1)
    with pytest.raises(RuntimeError, match=r"cannot be re-run .* use a strategy that forks or spawns"):
        launcher.launch(print)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_ranks_started_by_a_scheduler_run_in_place_whatever_the_start_method(monkeypatch, start_method):
    monkeypatch.setenv("LOCAL_RANK", "1")
    launcher = create_launcher(start_method, LocalEnvironment(), 2, 1)
    assert launcher.caller_is_worker
    assert launcher.launch(lambda value: value * 2, 21) == 42


def test_rank_failed_error_names_the_rank_and_survives_pickling():
    import pickle

    from stratagem.launchers import RankFailedError, RankFailure

    error = RankFailedError(
        RankFailure(1, 4242, "was killed by SIGKILL"),
        [RankFailure(0, 4241, "raised an exception", "Traceback ...\nRuntimeError: Connection closed by peer")],
    )
    copy = pickle.loads(pickle.dumps(error))
    assert copy.rank == 1
    assert str(copy) == str(error)
    assert str(error).splitlines()[0] == "rank 1 (pid 4242) was killed by SIGKILL; every other rank was ended."
    assert "Also failed after it: rank 0 (pid 4241) raised an exception. RuntimeError: Connection closed" in str(error)
