"""Training across two hosts (network namespaces with their own addresses and hostnames), started as users
start it on several machines: by hand with MASTER_ADDR/NODE_RANK, and by torchrun's c10d rendezvous; and the
ways it goes wrong across machines, each ending on every host with a message that names the host or rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hosts import JOB, Host, assert_close, set_link

JOIN_TIMEOUT = 30
COLLECTIVE_TIMEOUT = 15  # the ranks end within 2x of it: a lost host costs 3.5 s of watching, then exiting
pytestmark = pytest.mark.timeout(240)


_port = iter(range(29600 + os.getpid() % 200 * 10, 65000))


def _environment(first: Host, node_rank: int, port: int) -> dict[str, str]:
    return {
        "MASTER_ADDR": first.address,
        "MASTER_PORT": str(port),
        "NODE_RANK": str(node_rank),
        "STRATAGEM_JOIN_TIMEOUT": str(JOIN_TIMEOUT),
        "OMP_NUM_THREADS": "1",
    }


def _run_on_hosts(
    hosts: list[Host],
    out: Path,
    arguments: list[list[str]],
    mounts: list[dict[str, str] | None] | None = None,
    torchrun: list[str] | None = None,
    timeout: float = 180,
    while_running: Callable[[list[subprocess.Popen]], None] | None = None,
) -> list[tuple[int, str]]:
    """Start ``job.py`` with each host's ``arguments`` on that host (NODE_RANK = its index), or torchrun with
    ``torchrun`` options; call ``while_running`` with the processes; wait for all, bounded by ``timeout``. Each
    host's exit code and output."""
    out.mkdir(parents=True, exist_ok=True)
    port = next(_port)
    processes = []
    for node_rank, (host, host_arguments) in enumerate(zip(hosts, arguments)):
        job = [str(JOB), "--out", str(out), *host_arguments]
        if torchrun is None:
            argv = [sys.executable, *job]
        else:
            endpoint = f"--rdzv-endpoint={hosts[0].address}:{port}"
            argv = [sys.executable, "-m", "torch.distributed.run", *torchrun, endpoint, *job]
        log = out / f"{host.name}.log"
        mount = mounts[node_rank] if mounts else None
        processes.append((host.start(argv, log, env=_environment(hosts[0], node_rank, port), mounts=mount), log))
    deadline = time.monotonic() + timeout
    if while_running is not None:
        while_running([process for process, _ in processes])
    results = []
    for process, log in processes:
        try:
            code = process.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for other, _ in processes:
                _kill(other)
            pytest.fail(f"the job on the hosts did not end within {timeout} s; {log}:\n{log.read_text()[-3000:]}")
        results.append((code, log.read_text()))
    return results


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _assert_succeeded(results: list[tuple[int, str]]) -> None:
    for code, output in results:
        assert code == 0, output[-4000:]


# -- the happy paths --------------------------------------------------------------------------


def test_ddp_started_by_hand_on_two_hosts_trains_as_one_device_on_the_same_global_batch(
    hosts, tmp_path, single_device_weights
):
    results = _run_on_hosts(hosts, tmp_path, [["--strategy", "ddp"]] * 2)
    _assert_succeeded(results)
    report = json.loads((tmp_path / "result.json").read_text())
    assert (report["global_step"], report["world_size"]) == (6, 2)
    assert_close(torch.load(tmp_path / "weights.pt"), single_device_weights)


def test_torchrun_c10d_on_two_hosts_trains_as_one_device(hosts, tmp_path, single_device_weights):
    torchrun = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-id=multihost"]
    _assert_succeeded(_run_on_hosts(hosts, tmp_path, [["--strategy", "ddp"]] * 2, torchrun=torchrun))
    assert_close(torch.load(tmp_path / "weights.pt"), single_device_weights)


def test_fsdp_on_two_hosts_saves_sharded_checkpoints_and_resumes_from_them(hosts, tmp_path):
    _assert_succeeded(_run_on_hosts(hosts, tmp_path, [["--strategy", "fsdp", "--steps", "4"]] * 2))
    resumed = ["--strategy", "fsdp", "--steps", "6", "--ckpt-path", "last"]
    _assert_succeeded(_run_on_hosts(hosts, tmp_path, [resumed] * 2))
    report = json.loads((tmp_path / "result.json").read_text())
    assert (report["started_at_step"], report["global_step"]) == (4, 6)


# -- what goes wrong across machines -----------------------------------------------------------


def _private_checkpoints(hosts: list[Host], tmp_path: Path) -> tuple[Path, list[dict[str, str]]]:
    """A checkpoint path that each host backs with a directory of its own (a filesystem they do not share)."""
    shared_path = tmp_path / "checkpoints"
    shared_path.mkdir()
    mounts = []
    for host in hosts:
        private = tmp_path / f"checkpoints-on-{host.name}"
        private.mkdir()
        mounts.append({str(shared_path): str(private)})
    return shared_path, mounts


def test_a_checkpoint_directory_the_hosts_do_not_share_names_the_holding_host_in_model_paths_and_fails_a_resume(
    hosts, tmp_path
):
    path, mounts = _private_checkpoints(hosts, tmp_path)
    first = ["--strategy", "ddp", "--steps", "4", "--checkpoints", str(path), "--save-last"]
    results = _run_on_hosts(hosts, tmp_path, [first] * 2, mounts=mounts)
    _assert_succeeded(results)
    assert "is not one filesystem for every node" in results[0][1]
    assert f"host {hosts[1].name} (rank 1)" in results[0][1]
    # On the second host, best_model_path and last_model_path once named files that exist on the first only.
    ranks = [json.loads((tmp_path / f"paths-rank{rank}.json").read_text()) for rank in (0, 1)]
    best, last, holder = f"{path}/epoch=0-step=4.ckpt", f"{path}/last.ckpt", hosts[0].name
    assert ranks[0] == {"best_model_path": best, "last_model_path": last, "best_exists_here": True}
    assert ranks[1] == {
        "best_model_path": f"{holder}:{best}",
        "last_model_path": f"{holder}:{last}",
        "best_exists_here": False,
    }
    assert (tmp_path / f"checkpoints-on-{holder}" / "epoch=0-step=4.ckpt").is_file()
    resume = ["--strategy", "ddp", "--steps", "6", "--checkpoints", str(path), "--ckpt-path", "last"]
    started = time.monotonic()
    results = _run_on_hosts(hosts, tmp_path, [resume] * 2, mounts=mounts)
    assert time.monotonic() - started < 2 * JOIN_TIMEOUT
    for code, output in results:
        assert code != 0
        assert f"Rank 0 (host {hosts[0].name}) resumes from '{path}/" in output
        assert f"which host {hosts[1].name} (rank 1: No such file or directory) cannot read" in output


def test_fsdp_refuses_a_checkpoint_directory_the_hosts_do_not_share_before_training(hosts, tmp_path):
    path, mounts = _private_checkpoints(hosts, tmp_path)
    arguments = ["--strategy", "fsdp", "--checkpoints", str(path)]
    started = time.monotonic()
    results = _run_on_hosts(hosts, tmp_path, [arguments] * 2, mounts=mounts)
    assert time.monotonic() - started < 2 * JOIN_TIMEOUT
    for code, output in results:
        assert code != 0
        assert "is not one filesystem for every node" in output
        assert f"host {hosts[1].name} (rank 1)" in output
        assert "every checkpoint would be incomplete" in output
    assert not [path for host in hosts for path in Path(tmp_path, f"checkpoints-on-{host.name}").iterdir()]


def test_a_host_whose_name_resolves_to_loopback_trains_over_the_interface_that_reaches_master_addr(
    hosts, tmp_path, single_device_weights
):
    # Debian's /etc/hosts maps the machine's own name to 127.0.1.1: gloo listened there, and the other host hung.
    mounts = []
    for host in hosts:
        loopback = tmp_path / f"{host.name}.hosts"
        lines = ["127.0.0.1 localhost", f"127.0.1.1 {host.name}"]
        lines += [f"{other.address} {other.name}" for other in hosts if other is not host]
        loopback.write_text("\n".join(lines) + "\n")
        mounts.append({"/etc/hosts": str(loopback)})
    results = _run_on_hosts(hosts, tmp_path, [["--strategy", "ddp"]] * 2, mounts=mounts, timeout=2 * JOIN_TIMEOUT + 60)
    _assert_succeeded(results)
    for _, output in results:
        assert "(loopback), where the other nodes cannot reach gloo; it listens on v" in output
    assert_close(torch.load(tmp_path / "weights.pt"), single_device_weights)


@pytest.mark.parametrize("how", ["vanished", "killed"])
def test_a_host_lost_during_training_is_named_with_the_last_step_every_rank_completed_together(hosts, tmp_path, how):
    # Its process stops at step 5, then it is killed: "vanished" takes its link down first, so that no packet tells
    # the other host, which waits until the collective timeout; "killed" closes its connections, and the other
    # host's collective fails at once. The rank was said to have never arrived, "last in #1 broadcast" from before
    # training (vanished), or not named at all (killed).
    marker = tmp_path / "stopped"
    arguments = ["--strategy", "ddp", "--steps", "10", "--collective-timeout", str(COLLECTIVE_TIMEOUT)]
    arguments += ["--vanish-at-step", "5", "--vanish-marker", str(marker)]
    lost_at = []

    def take_the_second_host_away(processes: list[subprocess.Popen]) -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if how == "vanished":
            set_link(hosts[1], "down")
        _kill(processes[1])
        lost_at.append(time.monotonic())

    try:
        results = _run_on_hosts(hosts, tmp_path, [arguments] * 2, while_running=take_the_second_host_away)
    finally:
        set_link(hosts[1], "up")
    assert marker.exists()
    assert time.monotonic() - lost_at[0] < 2 * COLLECTIVE_TIMEOUT
    code, output = results[0]
    assert code != 0
    ending = f"did not complete within timeout=0:00:{COLLECTIVE_TIMEOUT}" if how == "vanished" else "failed"
    assert (
        f"The collective all_reduce (of the training step's outcome, after training_step) {ending} on rank 0" in output
    )
    assert (
        f"Rank 1 (host {hosts[1].name}) was lost: its heartbeat stopped (none in the last 3.5 s), so its "
        "process ended or its host left the network. That was during training: the last training batch every rank "
        "checked together was #5 of this run." in output
    )
    assert "never arrived" not in output


def test_hosts_started_with_different_layouts_fail_at_once_naming_both(hosts, tmp_path):
    started = time.monotonic()
    results = _run_on_hosts(hosts, tmp_path, [["--devices", "1"], ["--devices", "2"]])
    assert time.monotonic() - started < JOIN_TIMEOUT
    for code, output in results:
        assert code != 0
        assert "do not belong to one job" in output
        assert "num_nodes=2, devices=1 (world size 2)" in output
        assert "num_nodes=2, devices=2 (world size 4)" in output


def test_an_elastic_restart_of_one_host_rejoins_the_other_and_resumes_exactly(hosts, tmp_path, single_device_weights):
    # A worker on the second host dies at step 3: torchrun restarts it there (counting the restart) and restarts
    # the first host's worker too (not counting it). The new attempt resumes from the step-2 checkpoint.
    torchrun = ["--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=2", "--rdzv-backend=c10d", "--rdzv-id=elastic"]
    marker = tmp_path / "died"
    arguments = ["--strategy", "ddp", "--ckpt-path", "last", "--die-at-step", "3", "--die-marker", str(marker)]
    results = _run_on_hosts(hosts, tmp_path, [arguments] * 2, torchrun=torchrun, timeout=2 * JOIN_TIMEOUT + 120)
    _assert_succeeded(results)
    assert marker.exists()
    report = json.loads((tmp_path / "result.json").read_text())
    assert (report["started_at_step"], report["global_step"]) == (2, 6)
    assert_close(torch.load(tmp_path / "weights.pt"), single_device_weights)


def test_a_signal_on_one_host_saves_on_every_host_at_the_next_step_and_the_resumed_run_ends_exactly(
    hosts, tmp_path, single_device_weights
):
    # A preemption's SIGTERM (USR1 in test_slurm), reaching one host only: the ranks must agree when to stop.
    checkpoints = tmp_path / "checkpoints"
    arguments = ["--strategy", "ddp", "--preemption", "--step-seconds", "1", "--steps", "6"]

    def signal_once_a_checkpoint_is_there(processes: list[subprocess.Popen]) -> None:
        deadline = time.monotonic() + 120
        while not list(checkpoints.glob("*step=2.ckpt")) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(processes[1].pid, signal.SIGTERM)

    results = _run_on_hosts(hosts, tmp_path, [arguments] * 2, while_running=signal_once_a_checkpoint_is_there)
    _assert_succeeded(results)
    saved = sorted(path.name for path in checkpoints.glob("preempted-step=*.ckpt"))
    assert len(saved) == 1, saved
    report = json.loads((tmp_path / "result.json").read_text())
    assert report["global_step"] < 6
    assert saved == [f"preempted-step={report['global_step']}.ckpt"]
    assert "SIGTERM" not in results[0][1]  # rank 0 did not receive it: it learnt it from rank 1
    assert "a signal on another rank: saved" in results[0][1]
    resume = ["--strategy", "ddp", "--steps", "6", "--ckpt-path", "last"]
    _assert_succeeded(_run_on_hosts(hosts, tmp_path, [resume] * 2))
    report = json.loads((tmp_path / "result.json").read_text())
    assert report["global_step"] == 6
    assert_close(torch.load(tmp_path / "weights.pt"), single_device_weights)
