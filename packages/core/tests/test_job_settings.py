"""Settings that are wrong before anything starts fail at once, naming the variable, instead of hanging
until the 30-minute collective timeout; ranks that cannot meet fail within the join timeout."""

import os
import re
import socket
import time
import uuid
from datetime import timedelta

import pytest

import stratagem
from stratagem.environments.local import find_free_port
from stratagem.launchers import InProcessLauncher, Launcher, RankFailedError, create_launcher
from stratagem.launchers.rendezvous import check_main_port_free
from stratagem.strategies import ParallelStrategy
from stratagem.strategies._process_group import RendezvousTimeoutError, join

_JOB_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "STRATAGEM_JOIN_TIMEOUT",
)
_SCHEDULER_PREFIXES = ("SLURM_", "LSB_", "JSM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "KUBERNETES_", "PET_")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Only the variables a test sets; resolve() may export MASTER_PORT, which monkeypatch then restores."""
    for name in list(os.environ):
        if name.startswith(_SCHEDULER_PREFIXES) or name in _JOB_VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.delenv("MASTER_PORT", raising=False)


class _InProcessParallel(ParallelStrategy):
    """A parallel strategy that starts nothing: this process is the rank its environment says."""

    @property
    def launcher(self) -> Launcher:
        return InProcessLauncher()


class _ForkedParallel(ParallelStrategy):
    @property
    def launcher(self) -> Launcher:
        return create_launcher("fork", self._environment, self.num_processes, self.num_nodes)


def _resolve(devices=2, num_nodes=1, **options):
    return stratagem.resolve(
        strategy=_InProcessParallel(**options), accelerator="cpu", devices=devices, num_nodes=num_nodes
    )


def _set(monkeypatch, variables):
    for name, value in variables.items():
        monkeypatch.setenv(name, str(value))


_TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job-7",
    "RANK": 3,
    "LOCAL_RANK": 1,
    "WORLD_SIZE": 4,
    "GROUP_RANK": 1,
    "LOCAL_WORLD_SIZE": 2,
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": 29400,
}
_SRUN = {
    "SLURM_NTASKS": 4,
    "SLURM_PROCID": 3,
    "SLURM_LOCALID": 1,
    "SLURM_NODEID": 1,
    "SLURM_NNODES": 2,
    "SLURM_NTASKS_PER_NODE": 2,
    "SLURM_JOB_NODELIST": "localhost",
    "SLURM_JOB_ID": 1234567,
    "SLURM_JOB_NAME": "train.sh",
}
_MPIRUN = {
    "OMPI_COMM_WORLD_RANK": 3,
    "OMPI_COMM_WORLD_SIZE": 4,
    "OMPI_COMM_WORLD_LOCAL_RANK": 1,
    "OMPI_COMM_WORLD_LOCAL_SIZE": 2,
    "MASTER_ADDR": "127.0.0.1",
}
_KUBEFLOW = {
    "KUBERNETES_PORT": "tcp://10.0.0.1:443",
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": 23456,
    "WORLD_SIZE": 2,
    "RANK": 1,
}

# (job, overrides, devices, num_nodes, the error's words): a variable set to None is removed.
BAD_SETTINGS = {
    "master port 0": (
        {},
        {"MASTER_PORT": 0},
        2,
        1,
        r"MASTER_PORT='0' is not valid; expected an integer from 1 to 65535",
    ),
    "master port too large": ({}, {"MASTER_PORT": 70000}, 2, 1, r"MASTER_PORT='70000' is not valid; .* 1 to 65535"),
    "master port not a number": ({}, {"MASTER_PORT": "abc"}, 2, 1, r"MASTER_PORT='abc' is not valid; expected an int"),
    "stray local rank": (
        {},
        {"LOCAL_RANK": 0},
        2,
        1,
        r"LOCAL_RANK='0' is set.* WORLD_SIZE and MASTER_PORT are not.*`unset LOCAL_RANK`",
    ),
    "local rank beyond the devices": (
        {},
        {"LOCAL_RANK": 5, "WORLD_SIZE": 2, "MASTER_PORT": 29500},
        2,
        1,
        r"LOCAL_RANK=5 is out of range for devices=2; expected 0 to 1",
    ),
    "negative local rank": (
        {},
        {"LOCAL_RANK": -1},
        2,
        1,
        r"LOCAL_RANK='-1' is not valid; expected an integer of at least 0",
    ),
    "negative node rank": (
        {},
        {"NODE_RANK": -1},
        2,
        1,
        r"NODE_RANK='-1' is not valid; expected an integer of at least 0",
    ),
    "node rank beyond the nodes": (
        {},
        {"NODE_RANK": 2, "MASTER_ADDR": "127.0.0.1"},
        1,
        2,
        r"NODE_RANK=2 is out of range for num_nodes=2",
    ),
    "world size 0": ({}, {"WORLD_SIZE": 0}, 2, 1, r"WORLD_SIZE='0' is not valid; expected an integer of at least 1"),
    "torchrun rank not below the world size": (
        _TORCHRUN,
        {"RANK": 4},
        2,
        2,
        r"RANK=4 is out of range for WORLD_SIZE=4; expected 0 to 3 \(ranks count from 0\)\. torchrun sets it",
    ),
    "torchrun world size 0": (_TORCHRUN, {"WORLD_SIZE": 0}, 2, 2, r"WORLD_SIZE='0' is not valid"),
    "torchrun negative rank": (
        _TORCHRUN,
        {"RANK": -3},
        2,
        2,
        r"RANK='-3' is not valid; expected an integer of at least 0",
    ),
    "torchrun master port": (_TORCHRUN, {"MASTER_PORT": 70000}, 2, 2, r"MASTER_PORT='70000' is not valid"),
    "torchrun local rank": (_TORCHRUN, {"LOCAL_RANK": 2}, 2, 2, r"LOCAL_RANK=2 is out of range for LOCAL_WORLD_SIZE=2"),
    "slurm procid not below ntasks": (
        _SRUN,
        {"SLURM_PROCID": 4},
        2,
        2,
        r"SLURM_PROCID=4 is out of range for SLURM_NTASKS=4; expected 0 to 3.* srun sets it",
    ),
    "slurm ntasks 0": (
        _SRUN,
        {"SLURM_NTASKS": 0},
        2,
        2,
        r"SLURM_NTASKS='0' is not valid; expected an integer of at least 1",
    ),
    "slurm node id beyond the nodes": (
        _SRUN,
        {"SLURM_NODEID": 2},
        2,
        2,
        r"SLURM_NODEID=2 is out of range for SLURM_NNODES=2",
    ),
    "slurm local id beyond the devices": (
        _SRUN,
        {"SLURM_LOCALID": 2},
        2,
        2,
        r"SLURM_LOCALID=2 is out of range for devices=2",
    ),
    "slurm master port": (_SRUN, {"MASTER_PORT": "29500x"}, 2, 2, r"MASTER_PORT='29500x' is not valid"),
    "slurm job id": (_SRUN, {"SLURM_JOB_ID": "abc"}, 2, 2, r"SLURM_JOB_ID='abc' is not valid"),
    "mpi rank not below the size": (
        _MPIRUN,
        {"OMPI_COMM_WORLD_RANK": 4},
        2,
        2,
        r"OMPI_COMM_WORLD_RANK=4 is out of range for OMPI_COMM_WORLD_SIZE=4",
    ),
    "mpi local rank": (
        _MPIRUN,
        {"OMPI_COMM_WORLD_LOCAL_RANK": 2},
        2,
        2,
        r"OMPI_COMM_WORLD_LOCAL_RANK=2 is out of range for OMPI_COMM_WORLD_LOCAL_SIZE=2",
    ),
    "mpi master port": (_MPIRUN, {"MASTER_PORT": 0}, 2, 2, r"MASTER_PORT='0' is not valid"),
    "kubeflow rank beyond the pods": (
        _KUBEFLOW,
        {"RANK": 2},
        1,
        2,
        r"RANK=2 is out of range for the job's 2 pod\(s\) \(WORLD_SIZE=2\)",
    ),
    "kubeflow master port": (_KUBEFLOW, {"MASTER_PORT": -1}, 1, 2, r"MASTER_PORT='-1' is not valid"),
    "join timeout not a number": ({}, {"STRATAGEM_JOIN_TIMEOUT": "abc"}, 2, 1, r"STRATAGEM_JOIN_TIMEOUT='abc'"),
    "join timeout 0": (
        {},
        {"STRATAGEM_JOIN_TIMEOUT": 0},
        2,
        1,
        r"STRATAGEM_JOIN_TIMEOUT='0' is not valid; expected a pos",
    ),
    "join timeout beyond a timedelta": (
        {},
        {"STRATAGEM_JOIN_TIMEOUT": "1e14"},
        2,
        1,
        r"STRATAGEM_JOIN_TIMEOUT='1e14' is not valid; expected a positive number of seconds up to 2592000",
    ),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_a_bad_job_variable_fails_at_construction_naming_it(monkeypatch, case):
    job, overrides, devices, num_nodes, message = BAD_SETTINGS[case]
    _set(monkeypatch, job)
    for name, value in overrides.items():
        monkeypatch.setenv(name, str(value))
    started = time.monotonic()
    with pytest.raises(ValueError, match=message):
        _resolve(devices=devices, num_nodes=num_nodes)
    assert time.monotonic() - started < 10


def test_the_trainer_refuses_master_port_0_when_it_is_built(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "0")
    with pytest.raises(ValueError, match=r"MASTER_PORT='0' is not valid; expected an integer from 1 to 65535"):
        stratagem.Trainer(strategy=_InProcessParallel(), accelerator="cpu", devices=2)


@pytest.mark.timeout(30)
def test_an_unresolvable_master_addr_on_node_0_fails_at_construction(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    with pytest.raises(ValueError, match=r"MASTER_ADDR='no-such-host.invalid' does not resolve .* node 0"):
        _resolve(devices=2)


@pytest.mark.timeout(30)
def test_an_unresolvable_master_addr_on_another_node_is_only_a_warning(monkeypatch):
    # Node 0's host may not be in DNS before it starts (a cloud or Kubernetes name); the join timeout bounds it.
    _set(monkeypatch, {"MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": 29500, "NODE_RANK": 1})
    with pytest.warns(RuntimeWarning, match=r"MASTER_ADDR='no-such-host.invalid' does not resolve"):
        _resolve(devices=1, num_nodes=2)


def test_a_kubeflow_master_service_is_not_resolved_before_it_exists(monkeypatch):
    _set(monkeypatch, {**_KUBEFLOW, "MASTER_ADDR": "no-such-host.invalid"})
    _resolve(devices=1, num_nodes=2)


def test_local_rank_set_with_world_size_and_master_port_is_a_rank_started_by_hand(monkeypatch):
    _set(monkeypatch, {"LOCAL_RANK": 1, "WORLD_SIZE": 2, "MASTER_PORT": 29500})
    strategy = _resolve(devices=2)
    assert (strategy.global_rank, strategy.local_rank, strategy.world_size) == (1, 1, 2)


def test_a_stray_local_rank_0_is_harmless_with_one_device(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert _resolve(devices=1).world_size == 1


class _LyingEnvironment(stratagem.environments.LocalEnvironment):
    """A plugin environment that puts this process at a rank outside the job."""

    def global_rank(self) -> int:
        return 7


def test_an_environment_placing_the_process_outside_the_job_is_refused_whatever_it_is():
    with pytest.raises(ValueError, match=r"places this process at global rank 7, outside a world size of 2"):
        stratagem.resolve(strategy=_InProcessParallel(), accelerator="cpu", devices=2, plugins=[_LyingEnvironment()])


# -- ranks that cannot meet ------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_rank_that_never_starts_fails_the_join_naming_the_address_and_the_missing_rank(monkeypatch):
    # What a LOCAL_RANK left with WORLD_SIZE and MASTER_PORT in the shell leads to: this process is rank 0 of
    # two, and rank 1 never comes.
    port = find_free_port()
    _set(monkeypatch, {"LOCAL_RANK": 0, "WORLD_SIZE": 2, "MASTER_PORT": port, "STRATAGEM_JOIN_TIMEOUT": 3})
    strategy = _resolve(devices=2)
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as caught:
        strategy.setup_environment()
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert (
        f"Rank 0 at the rendezvous at MASTER_ADDR:MASTER_PORT = 127.0.0.1:{port}: only 1 of 2 ranks joined within "
        "the join timeout: rank 1 did not (rank 0 did)." in message
    )
    assert "STRATAGEM_JOIN_TIMEOUT" in message
    # The store was released with the failure: a retry finds the port free.
    check_main_port_free(strategy.cluster_environment)


@pytest.mark.timeout(30)
def test_a_rank_that_cannot_reach_rank_0_fails_within_the_join_timeout():
    port = find_free_port()  # nothing listens there: rank 0 is not running, or MASTER_PORT differs
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as caught:
        join("127.0.0.1", port, rank=1, world_size=2, prefix=uuid.uuid4().hex, timeout=timedelta(seconds=2))
    assert time.monotonic() - started < 10
    assert re.search(
        rf"Rank 1 could not reach the rendezvous at MASTER_ADDR:MASTER_PORT = 127.0.0.1:{port} within the join "
        r"timeout \(last attempt: Connection refused\)\. Rank 0 hosts it there\.",
        str(caught.value),
    )


@pytest.mark.timeout(30)
def test_an_unresolvable_address_fails_the_join_within_its_timeout():
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError, match=r"no-such-host.invalid:29500 within the join timeout"):
        join("no-such-host.invalid", 29500, rank=1, world_size=2, prefix="x", timeout=timedelta(seconds=2))
    assert time.monotonic() - started < 10


# -- a rank that hangs in a collective -------------------------------------------------------


def _one_rank_never_reaches_the_second_barrier(strategy, stuck_rank):
    strategy.setup_environment()
    strategy.barrier("warm-up")
    if strategy.global_rank == stuck_rank:
        time.sleep(60)
    strategy.barrier("after-epoch")


@pytest.mark.distributed
@pytest.mark.timeout(60)
@pytest.mark.parametrize("stuck_rank", [1, 0])
def test_a_collective_timeout_names_the_rank_that_never_arrived(monkeypatch, stuck_rank):
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    strategy = stratagem.resolve(strategy=_ForkedParallel(timeout=3), accelerator="cpu", devices=2)
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        strategy.launcher.launch(_one_rank_never_reaches_the_second_barrier, strategy, stuck_rank)
    assert time.monotonic() - started < 30
    waiting = 1 - stuck_rank
    assert caught.value.rank == waiting
    message = str(caught.value)
    assert f"The collective barrier 'after-epoch' did not complete within timeout=0:00:03 on rank {waiting}" in message
    # Asleep, not gone: its heartbeat goes on, and the message says so.
    assert (
        f"Rank {stuck_rank} (alive: its heartbeat goes on) never arrived at this collective (#2 on this rank): rank "
        f"{stuck_rank} (host {socket.gethostname()}) last entered #1 barrier 'warm-up'. (Only stratagem's own "
        "collectives are counted" in message
    )
    assert "lost" not in message
