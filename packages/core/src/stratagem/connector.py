"""Turning the user's words into one wired Strategy, validated before anything starts."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from stratagem import registry
from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO
from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.precision import Precision
from stratagem.strategies import Strategy

PRECISION_SHORT_FORMS: dict[str, str] = {
    "32": "32-true",
    "64": "64-true",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
}
"""What the short precision names stand for, as users of this kind of library know them."""

Plugin = Precision | CheckpointIO | ClusterEnvironment | str


def resolve(
    accelerator: str | Accelerator = "auto",
    strategy: str | Strategy = "auto",
    devices: int | list[int] | str = "auto",
    num_nodes: int = 1,
    precision: str | int = "32-true",
    plugins: Plugin | Iterable[Plugin] | None = None,
) -> Strategy:
    """Build the Strategy that ``Trainer(...)`` would run, wired with its accelerator,
    precision, checkpoint IO, cluster environment and launcher.

    Every invalid value or combination raises ``ValueError`` / ``TypeError`` here, naming the
    option, the value and what would be accepted, before any process starts.
    """
    precision_plugin, checkpoint_io, environment = _sort_plugins(plugins)
    strategy_instance = _check_strategy_argument(strategy)
    accelerator_instance = _resolve_accelerator(accelerator, strategy_instance)
    device_list = accelerator_instance.parse_devices(devices)
    _check_num_nodes(num_nodes)
    precision_instance = _resolve_precision(precision, precision_plugin)
    precision_instance.check_accelerator(accelerator_instance)
    environment = environment or detect_environment()
    if strategy_instance is None:
        strategy_instance = _create_strategy(str(strategy), total_devices=len(device_list) * num_nodes)
    strategy_instance.configure(
        accelerator=accelerator_instance,
        devices=device_list,
        num_nodes=num_nodes,
        precision=precision_instance,
        checkpoint_io=checkpoint_io,
        cluster_environment=environment,
    )
    _check_checkpoint_io(strategy_instance)
    if is_interactive() and not strategy_instance.launcher.is_interactive_compatible:
        raise ValueError(
            f"strategy={strategy!r} starts processes by re-running your script, which cannot work from a "
            "notebook or REPL. Use 'ddp_notebook' or 'ddp_fork' there, or run a script."
        )
    return strategy_instance


def _check_checkpoint_io(strategy: Strategy) -> None:
    """Refuse a checkpoint IO (from ``plugins=`` or the strategy's constructor) that the strategy would bypass,
    or would call from other ranks than the IO declares."""
    checkpoint_io = strategy.checkpoint_io
    problem = strategy.checkpoint_io_problem(checkpoint_io)
    if problem is not None:
        name = type(checkpoint_io).__name__
        raise ValueError(f"{strategy!r} cannot save through the checkpoint IO {name}: {problem}")


def detect_environment() -> ClusterEnvironment:
    """The cluster environment this process runs in.

    Plugin environments are asked first (they are the more specific), then the built-ins in
    this order: torchelastic, slurm, lsf, mpi, kubeflow; ``local`` when none matches.
    """
    environments = registry.environments
    builtin_order = ["torchelastic", "slurm", "lsf", "mpi", "kubeflow"]
    for name in [*_plugin_names(environments), *builtin_order]:
        if name not in environments or environments.describe(name).reason is not None:
            continue
        environment_class = environments.load_target(name)
        if environment_class.detect():
            return environments.create(name)
    return environments.create("local")


def _plugin_names(kind_registry: registry.Registry) -> list[str]:
    """Names registered by plugins, leaving out names two plugins claim (``stratagem doctor`` reports those)."""
    names = []
    for name in kind_registry.names():
        try:
            distribution = kind_registry.get(name).distribution
        except ValueError:
            continue
        if distribution != registry.registry.BUILTIN_DISTRIBUTION:
            names.append(name)
    return names


def is_interactive() -> bool:
    """Whether this process is a notebook kernel or an interactive interpreter."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def _sort_plugins(
    plugins: Plugin | Iterable[Plugin] | None,
) -> tuple[Precision | None, CheckpointIO | None, ClusterEnvironment | None]:
    if plugins is None:
        items: list[Any] = []
    elif isinstance(plugins, Precision | CheckpointIO | ClusterEnvironment | str):
        items = [plugins]
    else:
        items = list(plugins)
    found: dict[type, Any] = {}
    for item in items:
        plugin = _plugin_from_name(item) if isinstance(item, str) else item
        for kind in (Precision, CheckpointIO, ClusterEnvironment):
            if isinstance(plugin, kind):
                if kind in found:
                    raise ValueError(
                        f"plugins= contains two {kind.__name__} plugins ({found[kind]!r} and {plugin!r}); give one."
                    )
                found[kind] = plugin
                break
        else:
            raise TypeError(
                f"plugins= got {item!r} ({type(item).__name__}); expected Precision, CheckpointIO or "
                "ClusterEnvironment instances, or the name of a registered checkpoint IO or environment."
            )
    return found.get(Precision), found.get(CheckpointIO), found.get(ClusterEnvironment)


def _plugin_from_name(name: str) -> Any:
    owners = [kinds for kinds in (registry.checkpoint_io, registry.environments) if name in kinds]
    if len(owners) != 1:
        known = registry.checkpoint_io.names() + registry.environments.names()
        raise ValueError(f"plugins= got the name {name!r}; expected one of {', '.join(sorted(known))}.")
    return owners[0].create(name)


def _check_strategy_argument(strategy: Any) -> Strategy | None:
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str):
        return None
    raise TypeError(
        f"strategy={strategy!r} ({type(strategy).__name__}) is not valid; expected a registered name "
        f"({', '.join(registry.strategies.names())}, or 'auto') or a Strategy instance."
    )


def _resolve_accelerator(accelerator: Any, strategy: Strategy | None) -> Accelerator:
    if isinstance(accelerator, Accelerator):
        return accelerator
    if not isinstance(accelerator, str):
        raise TypeError(
            f"accelerator={accelerator!r} ({type(accelerator).__name__}) is not valid; expected a name "
            f"({', '.join(registry.accelerators.names())}, 'gpu' or 'auto') or an Accelerator instance."
        )
    if accelerator == "auto" and strategy is not None and strategy._accelerator is not None:
        return strategy._accelerator
    if accelerator == "auto":
        return registry.accelerators.create(_auto_accelerator_name())
    if accelerator == "gpu":
        return registry.accelerators.create(_gpu_accelerator_name())
    description = registry.accelerators.describe(accelerator)
    if not description.available:
        raise ValueError(f"accelerator={accelerator!r} is not available here: {description.reason}.")
    return registry.accelerators.create(accelerator)


def _auto_accelerator_name() -> str:
    accelerators = registry.accelerators
    for name in [*_plugin_names(accelerators), "cuda", "mps"]:
        if name in accelerators and accelerators.describe(name).available:
            return name
    return "cpu"


def _gpu_accelerator_name() -> str:
    reasons = []
    for name in ("cuda", "mps"):
        description = registry.accelerators.describe(name)
        if description.available:
            return name
        reasons.append(f"{name}: {description.reason}")
    raise ValueError(f"accelerator='gpu' found no GPU ({'; '.join(reasons)}). Use accelerator='cpu'.")


def _check_num_nodes(num_nodes: Any) -> None:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes!r} is not valid; expected a positive int.")


def _resolve_precision(precision: Any, plugin: Precision | None) -> Precision:
    if isinstance(precision, bool) or not isinstance(precision, str | int):
        raise TypeError(
            f"precision={precision!r} ({type(precision).__name__}) is not valid; expected one of "
            f"{_precision_choices()}."
        )
    name = PRECISION_SHORT_FORMS.get(str(precision), str(precision))
    if plugin is not None:
        if name != "32-true" and name != plugin.name:
            raise ValueError(
                f"precision={precision!r} contradicts the precision plugin {plugin!r} in plugins=; give one of them."
            )
        return plugin
    if name not in registry.precisions:
        raise ValueError(f"precision={precision!r} is not valid; expected one of {_precision_choices()}.")
    precision_instance = registry.precisions.create(name)
    if not isinstance(precision_instance, Precision):
        raise TypeError(f"The precision {name!r} created {precision_instance!r}, which is not a Precision.")
    return precision_instance


def _precision_choices() -> str:
    names = registry.precisions.names()
    short = [f"{short!r} (= {full!r})" for short, full in PRECISION_SHORT_FORMS.items() if full in names]
    return ", ".join([*(repr(n) for n in names), *short])


def _create_strategy(name: str, total_devices: int) -> Strategy:
    if name == "auto":
        name = _auto_strategy_name(total_devices)
    created = registry.strategies.create(name)
    if not isinstance(created, Strategy):
        raise TypeError(
            f"The strategy {name!r} (from {registry.strategies.get(name).distribution}) created "
            f"{type(created).__name__}, which is not a stratagem Strategy."
        )
    return created


def _auto_strategy_name(total_devices: int) -> str:
    if total_devices == 1:
        return "single_device"
    name = "ddp_notebook" if is_interactive() else "ddp"
    if name not in registry.strategies:
        raise ValueError(
            f"devices x num_nodes = {total_devices} needs a parallel strategy, and strategy='auto' picks "
            f'{name!r}, which is provided by stratagem-ddp: pip install "stratagem[ddp]". Or pass devices=1.'
        )
    return name
