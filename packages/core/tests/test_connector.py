import importlib
import multiprocessing
import os
import re
import subprocess
import sys
import uuid
from importlib import metadata

import pytest
import torch

import stratagem
from stratagem import registry
from stratagem.accelerators.cpu import CPUAccelerator
from stratagem.checkpoint_io import TorchCheckpointIO
from stratagem.connector import detect_environment
from stratagem.environments import LocalEnvironment, SLURMEnvironment
from stratagem.launchers import InProcessLauncher, Launcher
from stratagem.mesh import MeshLayout
from stratagem.precision import MixedPrecision, Precision, TruePrecision
from stratagem.registry import Registry, _builtins
from stratagem.strategies import ParallelStrategy, SingleDeviceStrategy, TakesMeshLayout

_ENVIRONMENT_VARIABLES = ("SLURM_NTASKS", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


@pytest.fixture(autouse=True)
def no_process_starts(monkeypatch):
    """resolve() validates in the calling process: starting any process is a failure."""

    def refuse(*args, **kwargs):
        raise AssertionError("resolve() started a process")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    for name in _ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def core_only_strategies(monkeypatch):
    """The strategies registry as if no backend package were installed."""
    strategies = Registry("strategy", f"stratagem_test_{uuid.uuid4().hex}.strategies", _builtins.register_strategies)
    monkeypatch.setattr(registry, "strategies", strategies)
    real_version = metadata.version

    def version_of_core_only(name):
        if name.startswith("stratagem-"):
            raise metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(metadata, "version", version_of_core_only)
    return strategies


class _InProcessParallel(ParallelStrategy):
    """A parallel strategy that starts nothing, to check what the connector hands to one."""

    @property
    def launcher(self) -> Launcher:
        return InProcessLauncher()


# -- strategy names -------------------------------------------------------------------------


def test_a_misspelt_strategy_suggests_the_close_name():
    with pytest.raises(ValueError, match=r"Unknown strategy 'dpp'\. .*Did you mean [^?]*'ddp'"):
        stratagem.resolve(strategy="dpp", accelerator="cpu")


def test_a_strategy_of_a_package_not_installed_gives_the_pip_command(core_only_strategies):
    with pytest.raises(
        ValueError, match=r'stratagem-deepspeed, which is not installed: pip install "stratagem\[deepspeed\]"'
    ):
        stratagem.resolve(strategy="deepspeed_stage_3", accelerator="cpu")


def test_auto_with_several_devices_and_no_ddp_package_says_to_install_it(core_only_strategies):
    with pytest.raises(ValueError, match=r'devices x num_nodes = 2 .* pip install "stratagem\[ddp\]"'):
        stratagem.resolve(accelerator="cpu", devices=2)


def test_auto_with_one_device_is_single_device_wired_with_everything():
    strategy = stratagem.resolve(accelerator="cpu", devices=1)
    assert isinstance(strategy, SingleDeviceStrategy)
    assert strategy.root_device == torch.device("cpu")
    assert strategy.accelerator.device_type == "cpu"
    assert strategy.precision.name == "32-true"
    assert isinstance(strategy.checkpoint_io, TorchCheckpointIO)
    assert isinstance(strategy.launcher, InProcessLauncher)


def test_a_strategy_instance_is_configured_not_replaced():
    mine = SingleDeviceStrategy()
    assert stratagem.resolve(strategy=mine, accelerator="cpu") is mine


def _bf16_on_two_devices() -> _InProcessParallel:
    return _InProcessParallel(precision=MixedPrecision("bfloat16"), parallel_devices=[torch.device("cpu")] * 2)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"precision": "16-mixed"}, r"=_InProcessParallel\(precision='bf16-mixed'\) contradicts precision='16-mixed'"),
        ({"plugins": [MixedPrecision("float16")]}, r"\(precision='bf16-mixed'\) contradicts plugins=\[MixedPrecision"),
        ({"devices": 3}, r"\(parallel_devices=\['cpu', 'cpu'\]\) contradicts devices=3 \(3 device"),
        ({"devices": "0,1,2,3"}, r"\(parallel_devices=\['cpu', 'cpu'\]\) contradicts devices='0,1,2,3'"),
    ],
)  # fmt: skip
def test_a_setting_given_to_the_strategy_instance_and_contradicted_is_refused_naming_both(options, message):
    with pytest.raises(ValueError, match=message):
        stratagem.resolve(strategy=_bf16_on_two_devices(), accelerator="cpu", **options)


def test_a_setting_given_to_the_strategy_instance_and_agreed_with_or_left_unset_is_used():
    agreed = stratagem.resolve(strategy=_bf16_on_two_devices(), accelerator="cpu", precision="bf16", devices=2)
    unset = stratagem.resolve(strategy=_bf16_on_two_devices(), accelerator="cpu")
    for strategy in (agreed, unset):
        assert strategy.precision.name == "bf16-mixed"
        assert strategy.num_processes == strategy.world_size == 2


def test_the_trainer_precision_applies_to_a_strategy_instance_without_one():
    strategy = stratagem.resolve(strategy=_InProcessParallel(), accelerator="cpu", devices=2, precision="bf16-true")
    assert strategy.precision.name == "bf16-true"


@pytest.mark.parametrize(
    ("option", "own", "plugin"),
    [
        ("checkpoint_io", TorchCheckpointIO(), TorchCheckpointIO()),
        ("cluster_environment", LocalEnvironment(), LocalEnvironment()),
    ],
)
def test_a_plugin_given_to_the_strategy_instance_and_in_plugins_is_refused(option, own, plugin):
    with pytest.raises(ValueError, match=rf"strategy=_InProcessParallel\({option}=.*\) contradicts plugins=\["):
        stratagem.resolve(strategy=_InProcessParallel(**{option: own}), accelerator="cpu", devices=2, plugins=plugin)


def test_an_accelerator_given_to_the_strategy_instance_and_contradicted_is_refused():
    class _StandInCUDA(CPUAccelerator):
        device_type = "cuda"

    with pytest.raises(
        ValueError, match=r"strategy=_InProcessParallel\(accelerator='cuda'\) contradicts accelerator='cpu'"
    ):
        stratagem.resolve(strategy=_InProcessParallel(accelerator=_StandInCUDA()), accelerator="cpu", devices=2)


def test_a_strategy_instance_used_by_one_trainer_is_refused_by_the_next():
    strategy = _InProcessParallel()
    stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2)
    with pytest.raises(
        ValueError, match=r"was already configured by an earlier Trainer .*create a new _InProcessParallel"
    ):
        stratagem.resolve(strategy=strategy, accelerator="cpu", devices=4)
    assert strategy.num_processes == 2


def test_a_strategy_instance_whose_configuration_failed_is_refused_too(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    strategy = _InProcessParallel()
    with pytest.raises(ValueError, match=r"num_nodes=2"):
        stratagem.resolve(strategy=strategy, accelerator="cpu", devices=2, num_nodes=2)
    with pytest.raises(ValueError, match=r"was already configured"):
        stratagem.resolve(strategy=strategy, accelerator="cpu", devices=3)


@pytest.mark.parametrize("strategy", [3, None, SingleDeviceStrategy])
def test_a_strategy_that_is_neither_a_name_nor_an_instance_is_a_type_error(strategy):
    with pytest.raises(TypeError, match=r"strategy=.*expected a registered name .*single_device"):
        stratagem.resolve(strategy=strategy, accelerator="cpu")


def test_single_device_with_two_devices_is_refused():
    with pytest.raises(ValueError, match=r"strategy='single_device' runs on exactly one device"):
        stratagem.resolve(strategy="single_device", accelerator="cpu", devices=2)


# -- accelerator, devices, num_nodes --------------------------------------------------------


@pytest.mark.parametrize(("devices", "count"), [(2, 2), ([0, 1], 2), ("0,1", 2), ("3", 3)])
def test_devices_forms_give_that_many_parallel_devices(devices, count):
    strategy = stratagem.resolve(strategy=_InProcessParallel(), accelerator="cpu", devices=devices)
    assert strategy.parallel_devices == [torch.device("cpu")] * count
    assert strategy.world_size == count


@pytest.mark.parametrize("devices", [-1, "auto", 1, "1"])
def test_devices_that_mean_one_cpu_process_give_single_device(devices):
    assert isinstance(stratagem.resolve(accelerator="cpu", devices=devices), SingleDeviceStrategy)


@pytest.mark.parametrize("devices", [0, -2, "x", "0,a", [], [1, 1], True, 1.5, None])
def test_invalid_devices_are_refused_naming_the_value(devices):
    with pytest.raises((ValueError, TypeError), match=r"devices="):
        stratagem.resolve(accelerator="cpu", devices=devices)


@pytest.mark.parametrize("num_nodes", [0, -1, 1.0, "2", True])
def test_invalid_num_nodes_are_refused(num_nodes):
    with pytest.raises(ValueError, match=r"num_nodes=.*expected a positive int"):
        stratagem.resolve(accelerator="cpu", num_nodes=num_nodes)


def test_an_unknown_accelerator_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"Unknown accelerator 'cpuu'.*Did you mean 'cpu'"):
        stratagem.resolve(accelerator="cpuu")


def test_an_accelerator_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"accelerator=0 \(int\) is not valid; expected a name \(cpu, cuda, (.*, )?mps"):
        stratagem.resolve(accelerator=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_an_unavailable_accelerator_says_why():
    with pytest.raises(ValueError, match=r"accelerator='cuda' is not available here"):
        stratagem.resolve(accelerator="cuda")


# -- precision ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "kind", "name"),
    [
        (32, Precision, "32-true"),
        ("32", Precision, "32-true"),
        (64, TruePrecision, "64-true"),
        (16, MixedPrecision, "16-mixed"),
        ("bf16", MixedPrecision, "bf16-mixed"),
        ("bf16-true", TruePrecision, "bf16-true"),
        ("16-true", TruePrecision, "16-true"),
    ],
)
def test_precision_short_and_full_forms_resolve_to_the_registered_precision(precision, kind, name):
    resolved = stratagem.resolve(accelerator="cpu", precision=precision).precision
    assert isinstance(resolved, kind)
    assert resolved.name == name


def test_an_unknown_precision_lists_full_and_short_forms():
    with pytest.raises(ValueError, match=r"precision='int3' is not valid; expected one of .*'bf16-mixed'.*'16' \(="):
        stratagem.resolve(accelerator="cpu", precision="int3")


@pytest.mark.parametrize("precision", [True, 16.0, b"32"])
def test_a_precision_of_the_wrong_type_is_a_type_error(precision):
    with pytest.raises(TypeError, match=r"precision="):
        stratagem.resolve(accelerator="cpu", precision=precision)


def test_no_precision_means_32_true():
    assert stratagem.resolve(accelerator="cpu", precision=None).precision.name == "32-true"


# -- plugins --------------------------------------------------------------------------------


def test_plugins_are_sorted_into_precision_checkpoint_io_and_environment():
    precision, checkpoint_io, environment = TruePrecision("float64"), TorchCheckpointIO(), LocalEnvironment()
    strategy = stratagem.resolve(
        strategy=_InProcessParallel(), accelerator="cpu", devices=2, plugins=[environment, precision, checkpoint_io]
    )
    assert strategy.precision is precision
    assert strategy.checkpoint_io is checkpoint_io
    assert strategy.cluster_environment is environment


def test_plugins_by_name_create_the_registered_plugin():
    strategy = stratagem.resolve(
        strategy=_InProcessParallel(), accelerator="cpu", devices=2, plugins=["local", "torch"]
    )
    assert isinstance(strategy.cluster_environment, LocalEnvironment)
    assert isinstance(strategy.checkpoint_io, TorchCheckpointIO)


def test_two_plugins_of_one_kind_are_refused():
    with pytest.raises(ValueError, match=r"plugins= contains two Precision plugins"):
        stratagem.resolve(accelerator="cpu", plugins=[Precision(), TruePrecision("float64")])


class _CollectiveCheckpointIO(TorchCheckpointIO):
    writes_collectively = True


class _RankZeroWritesOnly(_InProcessParallel):
    def checkpoint_io_problem(self, checkpoint_io):
        return "it calls its IO from rank 0 alone" if checkpoint_io.writes_collectively else None


def test_a_checkpoint_io_the_strategy_cannot_honour_is_refused_naming_both_and_why():
    with pytest.raises(
        ValueError,
        match=r"_RankZeroWritesOnly\(.*\) cannot save through the checkpoint IO _CollectiveCheckpointIO: it calls its "
        r"IO from rank 0 alone",
    ):
        stratagem.resolve(
            strategy=_RankZeroWritesOnly(), accelerator="cpu", devices=2, plugins=_CollectiveCheckpointIO()
        )
    assert stratagem.resolve(strategy=_RankZeroWritesOnly(), accelerator="cpu", devices=2, plugins="torch")


@pytest.mark.parametrize("checkpoint_io", [TorchCheckpointIO(), _CollectiveCheckpointIO()])
def test_single_device_and_parallel_strategies_accept_either_kind_of_checkpoint_io(checkpoint_io):
    for strategy, devices in ((SingleDeviceStrategy(), 1), (_InProcessParallel(), 2)):
        resolved = stratagem.resolve(strategy=strategy, accelerator="cpu", devices=devices, plugins=checkpoint_io)
        assert resolved.checkpoint_io is checkpoint_io


@pytest.mark.parametrize("plugin", [42, object(), SingleDeviceStrategy()])
def test_a_plugin_of_no_known_kind_is_a_type_error(plugin):
    with pytest.raises(TypeError, match=r"plugins= got .*expected Precision, CheckpointIO or ClusterEnvironment"):
        stratagem.resolve(accelerator="cpu", plugins=[plugin])


@pytest.mark.parametrize("plugins", [42, 1.5, object()])
def test_plugins_that_are_neither_a_plugin_nor_a_list_are_a_type_error_naming_plugins(plugins):
    expected = rf"plugins={re.escape(repr(plugins))} \({type(plugins).__name__}\) is not valid; expected a Precision"
    with pytest.raises(TypeError, match=expected):
        stratagem.resolve(accelerator="cpu", plugins=plugins)


def test_an_unknown_plugin_name_lists_the_accepted_names():
    with pytest.raises(ValueError, match=r"plugins= got the name 'slrum'; expected one of .*slurm"):
        stratagem.resolve(accelerator="cpu", plugins="slrum")


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true", 32])
def test_a_precision_plugin_contradicting_precision_is_refused(precision):
    with pytest.raises(ValueError, match=rf"precision={precision!r} contradicts the precision plugin"):
        stratagem.resolve(accelerator="cpu", precision=precision, plugins=[TruePrecision("float64")])


def test_an_environment_plugin_is_validated_against_devices_before_anything_starts(monkeypatch):
    for name, value in {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"SLURM starts 4 task\(s\) on this node .* devices=2"):
        stratagem.resolve(strategy=_InProcessParallel(), accelerator="cpu", devices=2, plugins=[SLURMEnvironment()])


# -- environment detection ------------------------------------------------------------------


@pytest.fixture
def plugin_environments(tmp_path, monkeypatch):
    """``add(distribution)`` installs a fake plugin registering the environment ``AlwaysHere`` (detected
    everywhere) as ``always_here``; ``registry.environments`` is a fresh registry that discovers them."""
    tag = uuid.uuid4().hex[:8]
    group = f"stratagem_test_{tag}.environments"
    monkeypatch.setattr(sys, "path", list(sys.path))
    modules = []

    def add(distribution):
        module = f"{distribution.replace('-', '_')}_{tag}"
        directory = tmp_path / distribution
        directory.mkdir()
        (directory / f"{module}.py").write_text(
            "from stratagem.environments import LocalEnvironment\n\n"
            "class AlwaysHere(LocalEnvironment):\n"
            "    pass\n\n"
            "def register(registry):\n"
            f"    registry.register('always_here', '{module}:AlwaysHere', description='Detected everywhere.')\n"
        )
        info = directory / f"{distribution.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[{group}]\nalways_here = {module}:register\n")
        sys.path.insert(0, str(directory))
        importlib.invalidate_caches()
        modules.append(module)

    monkeypatch.setattr(registry, "environments", Registry("environment", group, _builtins.register_environments))
    yield add
    for module in modules:
        sys.modules.pop(module, None)


def test_plugin_environments_are_asked_before_the_built_in_ones(plugin_environments, monkeypatch):
    plugin_environments("cluster-plugin")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert type(detect_environment()).__name__ == "AlwaysHere"


def test_two_plugins_claiming_one_environment_name_do_not_break_detection(plugin_environments, monkeypatch):
    plugin_environments("cluster-plugin")
    plugin_environments("other-cluster-plugin")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert isinstance(detect_environment(), SLURMEnvironment)
    [problem] = registry.environments.problems()
    assert problem.distribution == "cluster-plugin and other-cluster-plugin"


# -- strategy="auto" with a layout ------------------------------------------------------------


class _ShardsData(_InProcessParallel, TakesMeshLayout):
    mesh_dimensions = frozenset({"dp_shard"})

    def use_layout(self, layout: MeshLayout) -> None:
        self._mesh_layout = layout


class _ComposesParallelisms(_ShardsData):
    mesh_dimensions = frozenset({"dp_replicate", "dp_shard", "tp"})


@pytest.fixture
def layout_strategies(monkeypatch):
    """single_device and two strategies that take a layout, registered so that the wider one sorts first."""

    def register(strategies: Registry) -> None:
        _builtins.register_strategies(strategies)
        strategies.register("composes", _ComposesParallelisms, description="dp_replicate x dp_shard x tp")
        strategies.register("shards", _ShardsData, description="dp_shard")

    strategies = Registry("strategy", f"stratagem_test_{uuid.uuid4().hex}.strategies", register)
    monkeypatch.setattr(registry, "strategies", strategies)
    return strategies


@pytest.mark.parametrize(
    ("layout", "chosen", "shape"),
    [("dp_shard=2", _ShardsData, (1, 1, 2, 1)), ("dp_shard=1,tp=2", _ComposesParallelisms, (1, 1, 1, 2))],
)
def test_auto_with_a_layout_takes_the_simplest_strategy_that_spreads_its_dimensions(
    layout_strategies, layout, chosen, shape
):
    strategy = stratagem.resolve(strategy="auto", layout=layout, accelerator="cpu", devices=2)
    assert type(strategy) is chosen
    assert strategy.mesh_layout.shape == shape


def test_auto_with_a_layout_no_strategy_spreads_names_the_dimensions_and_what_each_spreads(layout_strategies):
    with pytest.raises(
        ValueError,
        match=r"strategy='auto' with layout=\(pp=2, .*\) found no strategy that spreads pp over several ranks "
        r"\(composes spreads dp_replicate, dp_shard, tp; shards spreads dp_shard\)",
    ):
        stratagem.resolve(strategy="auto", layout="pp=2,dp_shard=1", accelerator="cpu", devices=2)


def test_auto_with_a_layout_that_does_not_fill_the_devices_names_the_sizes(layout_strategies):
    with pytest.raises(ValueError, match=r"they multiply to 3, not to the 2 processes"):
        stratagem.resolve(strategy="auto", layout="dp_shard=3", accelerator="cpu", devices=2)


def test_auto_with_a_layout_and_no_strategy_that_takes_one_says_what_to_install(core_only_strategies):
    with pytest.raises(
        ValueError, match=r"needs a strategy that takes a mesh layout, and none is installed here\. .*stratagem\[fsdp\]"
    ):
        stratagem.resolve(strategy="auto", layout="dp_shard=2", accelerator="cpu", devices=2)
