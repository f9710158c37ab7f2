import os

import pytest

from stratagem.connector import detect_environment
from stratagem.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from stratagem.environments.slurm import expand_nodelist, expand_tasks_per_node

# The jobs below name hosts (node0, gpu007, h1) that exist on their clusters only: resolving them warns here.
pytestmark = pytest.mark.filterwarnings("ignore:.*does not resolve to an address:RuntimeWarning")

_SCHEDULER_PREFIXES = ("SLURM_", "LSB_", "JSM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "KUBERNETES_", "PET_")
_TORCH_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No scheduler variables from the machine running the tests leak into them."""
    for name in list(os.environ):
        if name.startswith(_SCHEDULER_PREFIXES) or name in _TORCH_VARIABLES:
            monkeypatch.delenv(name)


def _set(monkeypatch, **variables):
    for name, value in variables.items():
        monkeypatch.setenv(name, str(value))


def _torchrun(monkeypatch, rank=3, local_rank=1, world_size=4, group_rank=1, local_world_size=2):
    _set(
        monkeypatch,
        TORCHELASTIC_RUN_ID="job-7",
        RANK=rank,
        LOCAL_RANK=local_rank,
        WORLD_SIZE=world_size,
        GROUP_RANK=group_rank,
        LOCAL_WORLD_SIZE=local_world_size,
        MASTER_ADDR="node0",
        MASTER_PORT=29400,
    )


def _srun(monkeypatch, **overrides):
    variables = {
        "SLURM_NTASKS": 8,
        "SLURM_PROCID": 5,
        "SLURM_LOCALID": 1,
        "SLURM_NODEID": 1,
        "SLURM_NNODES": 2,
        "SLURM_NTASKS_PER_NODE": 4,
        "SLURM_JOB_NODELIST": "gpu[007-008]",
        "SLURM_JOB_ID": 1234567,
        "SLURM_JOB_NAME": "train.sh",
    }
    variables.update(overrides)
    _set(monkeypatch, **{name: value for name, value in variables.items() if value is not None})


def _jsrun(monkeypatch, tmp_path, rank=3, local_rank=1, size=4):
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("batch1\nh1\nh1\nh2\nh2\n")
    _set(
        monkeypatch,
        LSB_JOBID=4242,
        LSB_DJOB_RANKFILE=rankfile,
        JSM_NAMESPACE_RANK=rank,
        JSM_NAMESPACE_LOCAL_RANK=local_rank,
        JSM_NAMESPACE_SIZE=size,
    )


def _kubeflow(monkeypatch, rank=2, world_size=3, **extra):
    _set(
        monkeypatch,
        KUBERNETES_PORT="tcp://10.0.0.1:443",
        MASTER_ADDR="job-master-0",
        MASTER_PORT=23456,
        WORLD_SIZE=world_size,
        RANK=rank,
        **extra,
    )


# -- torchelastic ---------------------------------------------------------------------------


def test_torchelastic_reads_ranks_and_rendezvous_from_torchrun_variables(monkeypatch):
    _torchrun(monkeypatch)
    environment = TorchElasticEnvironment()
    assert TorchElasticEnvironment.detect()
    assert environment.creates_processes_externally
    assert (environment.global_rank(), environment.local_rank(), environment.node_rank()) == (3, 1, 1)
    assert environment.world_size() == 4
    assert (environment.main_address, environment.main_port) == ("node0", 29400)
    environment.validate_settings(num_devices=2, num_nodes=2)


def test_only_torchruns_agent_store_outlives_the_workers(monkeypatch):
    _torchrun(monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert TorchElasticEnvironment().store_outlives_workers
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert not TorchElasticEnvironment().store_outlives_workers
    assert not LocalEnvironment().store_outlives_workers


def test_torchelastic_is_not_detected_without_the_run_id(monkeypatch):
    _torchrun(monkeypatch)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert not TorchElasticEnvironment.detect()


def test_torchelastic_ignores_ranks_computed_by_stratagem(monkeypatch):
    _torchrun(monkeypatch)
    environment = TorchElasticEnvironment()
    environment.set_global_rank(0)
    environment.set_world_size(99)
    assert (environment.global_rank(), environment.world_size()) == (3, 4)


def test_torchelastic_rejects_devices_other_than_processes_per_node(monkeypatch):
    _torchrun(monkeypatch)
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE=2.*devices=4.*--nproc-per-node=4"):
        TorchElasticEnvironment().validate_settings(num_devices=4, num_nodes=1)


def test_torchelastic_rejects_num_nodes_that_contradicts_world_size(monkeypatch):
    _torchrun(monkeypatch)
    with pytest.raises(ValueError, match=r"WORLD_SIZE=4.*devices=2 x num_nodes=3 = 6"):
        TorchElasticEnvironment().validate_settings(num_devices=2, num_nodes=3)


def test_torchelastic_names_a_missing_variable(monkeypatch):
    _torchrun(monkeypatch)
    monkeypatch.delenv("MASTER_ADDR")
    with pytest.raises(ValueError, match=r"MASTER_ADDR is not set\. torchrun sets it"):
        _ = TorchElasticEnvironment().main_address


# -- slurm ----------------------------------------------------------------------------------


def test_slurm_reads_ranks_from_srun_variables(monkeypatch):
    _srun(monkeypatch)
    environment = SLURMEnvironment()
    assert SLURMEnvironment.detect()
    assert environment.creates_processes_externally
    assert (environment.global_rank(), environment.local_rank(), environment.node_rank()) == (5, 1, 1)
    assert environment.world_size() == 8
    environment.validate_settings(num_devices=4, num_nodes=2)


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_slurm_is_not_detected_in_an_interactive_allocation(monkeypatch, job_name):
    _srun(monkeypatch, SLURM_JOB_NAME=job_name)
    assert not SLURMEnvironment.detect()


def test_srun_tasks_under_a_wrapper_shell_are_ranks_although_the_job_is_named_bash(monkeypatch):
    # srun -n8 bash -c "python train.py --devices 4 --num-nodes 2": each task is one rank, not a session
    # that starts a local job of its own (which ran as many duplicate trainings as there were tasks).
    _srun(monkeypatch, SLURM_JOB_NAME="bash", SLURM_STEP_NUM_TASKS=8)
    assert isinstance(detect_environment(), SLURMEnvironment)
    _srun(monkeypatch, SLURM_JOB_NAME="bash", SLURM_STEP_NUM_TASKS=1)
    assert isinstance(detect_environment(), LocalEnvironment)


def test_slurm_main_address_is_the_first_host_of_the_node_list(monkeypatch):
    _srun(monkeypatch, SLURM_JOB_NODELIST="node[001-004,7],login2")
    assert SLURMEnvironment().main_address == "node001"


def test_slurm_main_address_falls_back_to_the_old_node_list_variable(monkeypatch):
    _srun(monkeypatch, SLURM_JOB_NODELIST=None, SLURM_NODELIST="cn17,cn18")
    assert SLURMEnvironment().main_address == "cn17"


def test_slurm_master_addr_and_port_win_over_the_job(monkeypatch):
    _srun(monkeypatch, MASTER_ADDR="10.1.2.3", MASTER_PORT=31000)
    environment = SLURMEnvironment()
    assert (environment.main_address, environment.main_port) == ("10.1.2.3", 31000)


def test_slurm_port_is_derived_from_the_job_id_and_the_same_on_every_task(monkeypatch):
    _srun(monkeypatch, SLURM_JOB_ID=1234567)
    first = SLURMEnvironment().main_port
    _srun(monkeypatch, SLURM_JOB_ID=1234567, SLURM_PROCID=0, SLURM_NODEID=0)
    assert SLURMEnvironment().main_port == first
    assert 1024 < first < 65536
    _srun(monkeypatch, SLURM_JOB_ID=1234568)
    assert SLURMEnvironment().main_port != first


def test_slurm_rejects_devices_other_than_tasks_per_node(monkeypatch):
    _srun(monkeypatch)
    with pytest.raises(ValueError, match=r"4 task\(s\) on this node.*SLURM_NTASKS_PER_NODE=4.*devices=2"):
        SLURMEnvironment().validate_settings(num_devices=2, num_nodes=2)


def test_slurm_reads_tasks_per_node_from_the_compressed_layout(monkeypatch):
    _srun(monkeypatch, SLURM_NTASKS_PER_NODE=None, SLURM_TASKS_PER_NODE="4,2", SLURM_NODEID=1)
    SLURMEnvironment().validate_settings(num_devices=2, num_nodes=2)
    with pytest.raises(ValueError, match=r"2 task\(s\) on this node.*devices=4"):
        SLURMEnvironment().validate_settings(num_devices=4, num_nodes=2)


def test_slurm_rejects_num_nodes_other_than_the_job_nodes(monkeypatch):
    _srun(monkeypatch)
    with pytest.raises(ValueError, match=r"SLURM_NNODES=2 node\(s\), but num_nodes=1.*--nodes=1"):
        SLURMEnvironment().validate_settings(num_devices=4, num_nodes=1)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[001-004,7]", ["node001", "node002", "node003", "node004", "node7"]),
        ("gpu[8-10],cpu3", ["gpu8", "gpu9", "gpu10", "cpu3"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("ib[3]-eth", ["ib3-eth"]),
        ("host-1.cluster,host-2.cluster", ["host-1.cluster", "host-2.cluster"]),
    ],
)
def test_slurm_node_lists_expand_in_order_keeping_zero_padding(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["node[1-3", "node1-3]", "node[a-b]", "node[5-2]", "n[[1]]"])
def test_slurm_malformed_node_lists_are_errors_naming_the_list(nodelist):
    with pytest.raises(ValueError, match="SLURM node list"):
        expand_nodelist(nodelist)


def test_slurm_tasks_per_node_layout_expands_repeats():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        expand_tasks_per_node("2x3")


# -- lsf ------------------------------------------------------------------------------------


def test_lsf_reads_ranks_from_jsrun_and_hosts_from_the_rankfile(monkeypatch, tmp_path):
    _jsrun(monkeypatch, tmp_path)
    monkeypatch.setattr("socket.gethostname", lambda: "h2")
    environment = LSFEnvironment()
    assert LSFEnvironment.detect()
    assert environment.creates_processes_externally
    assert environment.compute_hosts() == ["h1", "h2"]
    assert environment.main_address == "h1"
    assert (environment.global_rank(), environment.local_rank(), environment.node_rank()) == (3, 1, 1)
    assert environment.world_size() == 4
    environment.validate_settings(num_devices=2, num_nodes=2)


def test_lsf_reads_hosts_from_mcpu_hosts_without_a_rankfile(monkeypatch, tmp_path):
    _jsrun(monkeypatch, tmp_path)
    monkeypatch.delenv("LSB_DJOB_RANKFILE")
    monkeypatch.setenv("LSB_MCPU_HOSTS", "batch2 1 c01 42 c02 42 c03 42")
    assert LSFEnvironment().compute_hosts() == ["c01", "c02", "c03"]


def test_lsf_port_is_derived_from_the_job_id_unless_master_port_is_set(monkeypatch, tmp_path):
    _jsrun(monkeypatch, tmp_path)
    derived = LSFEnvironment().main_port
    assert 1024 < derived < 65536
    monkeypatch.setenv("MASTER_PORT", "31001")
    assert LSFEnvironment().main_port == 31001


def test_lsf_rejects_num_nodes_other_than_the_compute_hosts(monkeypatch, tmp_path):
    _jsrun(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match=r"2 compute host\(s\) \(h1, h2\), but num_nodes=3"):
        LSFEnvironment().validate_settings(num_devices=2, num_nodes=3)


def test_lsf_rejects_devices_that_contradict_the_rank_count(monkeypatch, tmp_path):
    _jsrun(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match=r"JSM_NAMESPACE_SIZE=4.*devices=4 x num_nodes=2 = 8"):
        LSFEnvironment().validate_settings(num_devices=4, num_nodes=2)


def test_lsf_node_rank_matches_a_fully_qualified_hostname_to_a_short_host_name(monkeypatch, tmp_path):
    _jsrun(monkeypatch, tmp_path)
    monkeypatch.setattr("socket.gethostname", lambda: "h2.cluster.example")
    assert LSFEnvironment().node_rank() == 1


def test_lsf_node_rank_fails_on_a_host_outside_the_job(monkeypatch, tmp_path):
    _jsrun(monkeypatch, tmp_path)
    monkeypatch.setattr("socket.gethostname", lambda: "elsewhere")
    with pytest.raises(ValueError, match=r"elsewhere.*not among.*\['h1', 'h2'\]"):
        LSFEnvironment().node_rank()


# -- mpi ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variables",
    [
        {
            "OMPI_COMM_WORLD_RANK": 3,
            "OMPI_COMM_WORLD_SIZE": 4,
            "OMPI_COMM_WORLD_LOCAL_RANK": 1,
            "OMPI_COMM_WORLD_LOCAL_SIZE": 2,
            "PMIX_RANK": 3,
        },
        {"PMI_RANK": 3, "PMI_SIZE": 4, "MPI_LOCALRANKID": 1, "MPI_LOCALNRANKS": 2},
        {"PMIX_RANK": 3, "WORLD_SIZE": 4, "LOCAL_RANK": 1, "LOCAL_WORLD_SIZE": 2},
    ],
    ids=["openmpi", "mpich-intel", "pmix"],
)
def test_mpi_reads_ranks_of_each_implementation_without_mpi4py(monkeypatch, variables):
    _set(monkeypatch, MASTER_ADDR="rank0-host", **variables)
    environment = MPIEnvironment()
    assert MPIEnvironment.detect()
    assert environment.creates_processes_externally
    assert (environment.global_rank(), environment.local_rank(), environment.node_rank()) == (3, 1, 1)
    assert environment.world_size() == 4
    assert (environment.main_address, environment.main_port) == ("rank0-host", 29500)
    environment.validate_settings(num_devices=2, num_nodes=2)


def test_mpi_across_nodes_without_master_addr_is_a_clear_error(monkeypatch):
    _set(monkeypatch, PMI_RANK=0, PMI_SIZE=4, MPI_LOCALRANKID=0, MPI_LOCALNRANKS=2)
    with pytest.raises(ValueError, match=r"spans several nodes.*export MASTER_ADDR"):
        MPIEnvironment().validate_settings(num_devices=2, num_nodes=2)


def test_mpi_on_one_node_defaults_to_the_loopback_address(monkeypatch):
    _set(monkeypatch, PMI_RANK=1, PMI_SIZE=2, MPI_LOCALRANKID=1, MPI_LOCALNRANKS=2, MASTER_PORT=31002)
    environment = MPIEnvironment()
    assert (environment.main_address, environment.main_port) == ("127.0.0.1", 31002)


def test_mpi_rejects_devices_other_than_ranks_per_node(monkeypatch):
    _set(monkeypatch, PMI_RANK=0, PMI_SIZE=4, MPI_LOCALRANKID=0, MPI_LOCALNRANKS=4)
    with pytest.raises(ValueError, match=r"MPI_LOCALNRANKS=4 rank\(s\) on this node, but devices=2"):
        MPIEnvironment().validate_settings(num_devices=2, num_nodes=2)


def test_mpi_rejects_num_nodes_that_contradict_the_rank_count(monkeypatch):
    _set(monkeypatch, PMI_RANK=0, PMI_SIZE=4, MPI_LOCALRANKID=0, MPI_LOCALNRANKS=2, MASTER_ADDR="h")
    with pytest.raises(ValueError, match=r"PMI_SIZE=4 ranks, but devices=2 x num_nodes=3 = 6"):
        MPIEnvironment().validate_settings(num_devices=2, num_nodes=3)


def test_mpi_bare_pmix_says_which_sizes_to_export(monkeypatch):
    monkeypatch.setenv("PMIX_RANK", "0")
    with pytest.raises(ValueError, match=r"WORLD_SIZE is not set\. A PMIx launcher exports only PMIX_RANK"):
        MPIEnvironment().world_size()


# -- kubeflow -------------------------------------------------------------------------------


def test_kubeflow_pod_is_one_node_with_one_process(monkeypatch):
    _kubeflow(monkeypatch)
    environment = KubeflowEnvironment()
    assert KubeflowEnvironment.detect()
    assert environment.creates_processes_externally
    assert (environment.global_rank(), environment.local_rank(), environment.node_rank()) == (2, 0, 2)
    assert environment.world_size() == 3
    assert (environment.main_address, environment.main_port) == ("job-master-0", 23456)
    environment.validate_settings(num_devices=1, num_nodes=3)


def test_kubeflow_counts_pods_when_world_size_counts_processes(monkeypatch):
    _kubeflow(monkeypatch, world_size=8, PET_NPROC_PER_NODE=4)
    assert KubeflowEnvironment().pod_count() == 2
    _kubeflow(monkeypatch, world_size=8, PET_NPROC_PER_NODE=4, PET_NNODES=2)
    assert KubeflowEnvironment().pod_count() == 2


def test_kubeflow_rejects_several_devices_per_pod_pointing_to_torchrun(monkeypatch):
    _kubeflow(monkeypatch)
    with pytest.raises(ValueError, match=r"devices=2.*torchrun --nproc-per-node=2"):
        KubeflowEnvironment().validate_settings(num_devices=2, num_nodes=3)


def test_kubeflow_rejects_num_nodes_other_than_the_pod_count(monkeypatch):
    _kubeflow(monkeypatch)
    with pytest.raises(ValueError, match=r"3 pod\(s\), but num_nodes=2"):
        KubeflowEnvironment().validate_settings(num_devices=1, num_nodes=2)


# -- detection order ------------------------------------------------------------------------


def test_nothing_set_detects_the_local_environment():
    assert isinstance(detect_environment(), LocalEnvironment)


def test_torchrun_inside_a_slurm_job_detects_torchelastic(monkeypatch):
    _srun(monkeypatch)
    _torchrun(monkeypatch)
    assert isinstance(detect_environment(), TorchElasticEnvironment)


def test_srun_with_pmix_detects_slurm_before_mpi(monkeypatch):
    _srun(monkeypatch, PMIX_RANK=5)
    assert isinstance(detect_environment(), SLURMEnvironment)


def test_an_interactive_slurm_allocation_detects_local(monkeypatch):
    _srun(monkeypatch, SLURM_JOB_NAME="bash")
    assert isinstance(detect_environment(), LocalEnvironment)


def test_jsrun_detects_lsf(monkeypatch, tmp_path):
    _jsrun(monkeypatch, tmp_path)
    assert isinstance(detect_environment(), LSFEnvironment)


def test_mpirun_detects_mpi(monkeypatch):
    _set(monkeypatch, OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=1)
    assert isinstance(detect_environment(), MPIEnvironment)


def test_a_kubeflow_pod_detects_kubeflow_and_torchrun_in_the_pod_detects_torchelastic(monkeypatch):
    _kubeflow(monkeypatch)
    assert isinstance(detect_environment(), KubeflowEnvironment)
    _torchrun(monkeypatch)
    assert isinstance(detect_environment(), TorchElasticEnvironment)


@pytest.mark.parametrize(
    "environment_class",
    [TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment, KubeflowEnvironment],
)
def test_scheduler_environments_are_not_detected_on_a_plain_machine(environment_class):
    assert issubclass(environment_class, ClusterEnvironment)
    assert not environment_class.detect()
