"""Turning the user's words into one wired Strategy, validated before anything starts."""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypedDict, TypeVar, cast

import torch

from stratagem import registry
from stratagem.accelerators import Accelerator
from stratagem.checkpoint_io import CheckpointIO
from stratagem.environments.cluster_environment import ClusterEnvironment
from stratagem.mesh import Degree, MeshLayout, parse_layout
from stratagem.precision import Precision
from stratagem.registry import first_party
from stratagem.strategies import Strategy, TakesMeshLayout

PRECISION_SHORT_FORMS: dict[str, str] = {
    "32": "32-true",
    "64": "64-true",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
}
"""What the short precision names stand for, as users of this kind of library know them."""

DEFAULT_PRECISION = "32-true"
"""The precision of a run that names none (neither ``precision=``, a precision plugin, nor a strategy instance)."""

Plugin = Precision | CheckpointIO | ClusterEnvironment | str


class WiringOptions(TypedDict, total=False):
    """What :func:`resolve` wires a strategy with, as it takes them (its signature gives the defaults). The
    Trainer, :class:`~stratagem.Runtime` and the planner take these as ``**options: Unpack[...]`` instead of
    declaring them again."""

    accelerator: str | Accelerator
    devices: int | list[int] | str
    num_nodes: int
    precision: str | int | None
    plugins: Plugin | Iterable[Plugin] | None
    layout: MeshLayout | dict[str, Degree] | str | None


class ResolveOptions(WiringOptions, total=False):
    """Every keyword :func:`resolve` takes: the strategy, and what it is wired with."""

    strategy: str | Strategy


def wiring_options(options: ResolveOptions) -> WiringOptions:
    """``options`` without the strategy: what another strategy would be resolved with in its place."""
    return cast(WiringOptions, {name: value for name, value in options.items() if name != "strategy"})


# A strategy instance holds one run's wiring (devices, environment, world size) once configured; a
# second resolve() would run with the first one's values. Kept here, so that no strategy has to
# remember it.
_configured_strategies: weakref.WeakSet[Strategy] = weakref.WeakSet()


def resolve(
    accelerator: str | Accelerator = "auto",
    strategy: str | Strategy = "auto",
    devices: int | list[int] | str = "auto",
    num_nodes: int = 1,
    precision: str | int | None = None,
    plugins: Plugin | Iterable[Plugin] | None = None,
    layout: MeshLayout | dict[str, Degree] | str | None = None,
) -> Strategy:
    """Build the Strategy that ``Trainer(...)`` would run, wired with its accelerator,
    precision, checkpoint IO, cluster environment and launcher.

    ``layout`` (a :class:`~stratagem.mesh.MeshLayout`, a dict of sizes or ``"dp_shard=2,tp=2"``) is run by
    a strategy that takes one (:class:`~stratagem.strategies.TakesMeshLayout`); its sizes must multiply to
    ``devices x num_nodes``.

    Every invalid value or combination raises ``ValueError`` / ``TypeError`` here, naming the
    option, the value and what would be accepted, before any process starts. A strategy
    instance may carry its own accelerator, precision, checkpoint IO, environment and devices:
    the same setting given here too must agree with it, and an instance is configured once
    (a second ``Trainer`` needs a new one).
    """
    precision_plugin, checkpoint_io, environment = _sort_plugins(plugins)
    strategy_instance = _check_strategy_argument(strategy)
    if strategy_instance is not None:
        _refuse_configured(strategy_instance)
    accelerator_instance = _resolve_accelerator(accelerator, strategy_instance)
    device_list = accelerator_instance.parse_devices(devices)
    _check_num_nodes(num_nodes)
    precision_instance = _resolve_precision(precision, precision_plugin)
    if strategy_instance is not None:
        _check_agreement(
            strategy_instance,
            accelerator=(accelerator, accelerator_instance),
            devices=(devices, device_list),
            precision=(precision, precision_instance),
            checkpoint_io=checkpoint_io,
            environment=environment,
        )
        precision_instance = strategy_instance._precision or precision_instance
        device_list = _given_devices(strategy_instance) or device_list
    precision_instance = precision_instance or _create_precision(DEFAULT_PRECISION)
    precision_instance.check_accelerator(accelerator_instance)
    environment = environment or detect_environment()
    mesh_layout = parse_layout(layout) if layout is not None else None
    if strategy_instance is None:
        strategy_instance = _create_strategy(str(strategy), len(device_list) * num_nodes, mesh_layout)
    if mesh_layout is not None:
        _hand_layout(strategy_instance, strategy, mesh_layout)
    # Marked before configuring: a configure that fails may already have changed the instance.
    _configured_strategies.add(strategy_instance)
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


Function = TypeVar("Function", bound=Callable[..., Any])


def takes_resolve_options(function: Function) -> Function:
    """``function``, which takes :func:`resolve`'s options through ``**options: Unpack[ResolveOptions]``, with
    resolve's parameters (keyword-only, with their defaults) shown in its signature in place of that catch-all, as
    ``help()`` and ``inspect`` read it, and a keyword that neither takes refused by its own name, with the closest
    one."""
    own = inspect.signature(function).parameters.values()
    positional = [parameter for parameter in own if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keywords = [parameter for parameter in own if parameter.kind is inspect.Parameter.KEYWORD_ONLY]
    resolved = [
        parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for parameter in inspect.signature(resolve).parameters.values()
    ]
    accepted = [parameter.name for parameter in [*resolved, *keywords]]
    caller = function.__qualname__.removesuffix(".__init__")

    @functools.wraps(function)
    def checked(*args: Any, **options: Any) -> Any:
        for name in options:
            if name not in accepted:
                close = difflib.get_close_matches(name, accepted, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(accepted)}."
                raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{hint}")
        return function(*args, **options)

    signature = inspect.signature(function).replace(parameters=[*positional, *resolved, *keywords])
    setattr(checked, "__signature__", signature)  # noqa: B010 - not a declared attribute of a function
    return cast(Function, checked)


def _hand_layout(strategy: Strategy, given: str | Strategy, layout: MeshLayout) -> None:
    """Give ``layout`` to a strategy that can run it; refuse one that cannot, naming the sizes it cannot take."""
    name = given if isinstance(given, str) else type(given).__name__
    spread = _spread(layout)
    if not isinstance(strategy, TakesMeshLayout):
        raise ValueError(
            f"layout=({layout}) cannot run under strategy={name!r}: {type(strategy).__name__} runs no device mesh "
            "(it does not take a mesh layout). Leave layout out, or choose a strategy that takes one, such as "
            "'model_parallel' (dp_replicate x dp_shard x tp)."
        )
    unusable = [dimension for dimension in spread if dimension not in strategy.mesh_dimensions]
    if unusable:
        sizes = ", ".join(f"{dimension}={getattr(layout, dimension)}" for dimension in unusable)
        raise ValueError(
            f"layout=({layout}) cannot run under strategy={name!r}: it spreads only "
            f"{', '.join(sorted(strategy.mesh_dimensions))} over several ranks, not {sizes}. Set "
            f"{' and '.join(unusable)} to 1, or choose a strategy that spreads them."
        )
    strategy.use_layout(layout)


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
    this order: torchelastic, slurm, lsf, mpi, kubeflow; ``local`` when none matches. A plugin
    environment whose code fails (its import, ``detect()``, its constructor) is recorded as a
    plugin problem, warned about and passed over: one broken plugin must not stop every run.
    """
    environments = registry.environments
    builtin_order = ["torchelastic", "slurm", "lsf", "mpi", "kubeflow"]
    plugin_names = _plugin_names(environments)
    for name in plugin_names:
        registration = environments.get(name)
        if registration.missing_requirement() is not None:
            continue
        try:
            environment_class = environments.load_target(name)
            if environments.call_plugin(name, "detect()", environment_class.detect):
                return environments.call_plugin(name, "creating it", environments.create, name)
        except registry.PluginError as error:
            warnings.warn(f"{error} Going on without it; `stratagem doctor` lists it.", RuntimeWarning, stacklevel=2)
    for name in builtin_order:
        if name in plugin_names or name not in environments or environments.describe(name).reason is not None:
            continue
        if environments.load_target(name).detect():
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


_PLUGINS_ACCEPTED = (
    "a Precision, CheckpointIO or ClusterEnvironment instance, the name of a registered checkpoint IO or "
    "environment, or a list of these"
)


def _sort_plugins(
    plugins: Plugin | Iterable[Plugin] | None,
) -> tuple[Precision | None, CheckpointIO | None, ClusterEnvironment | None]:
    if plugins is None:
        items: list[Any] = []
    elif isinstance(plugins, Precision | CheckpointIO | ClusterEnvironment | str):
        items = [plugins]
    elif isinstance(plugins, Iterable):
        items = list(plugins)
    else:
        raise TypeError(f"plugins={plugins!r} ({type(plugins).__name__}) is not valid; expected {_PLUGINS_ACCEPTED}.")
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


def _refuse_configured(strategy: Strategy) -> None:
    if strategy in _configured_strategies:
        raise ValueError(
            f"strategy={strategy!r} was already configured by an earlier Trainer or resolve() call (also when that "
            "call failed, it may have set the instance's devices, environment and world size). A strategy instance "
            f"serves one Trainer: create a new {type(strategy).__name__}(...) for this one."
        )


def _given_devices(strategy: Strategy) -> list[torch.device] | None:
    # Parallel strategies keep the devices given to their constructor here (None when not given).
    devices = getattr(strategy, "parallel_devices", None)
    return list(devices) if devices else None


def _check_agreement(
    strategy: Strategy,
    *,
    accelerator: tuple[Any, Accelerator],
    devices: tuple[Any, list[torch.device]],
    precision: tuple[Any, Precision | None],
    checkpoint_io: CheckpointIO | None,
    environment: ClusterEnvironment | None,
) -> None:
    """A setting given both to the strategy instance and to resolve()/the Trainer must agree; a setting given in
    only one place is taken from there."""
    name = type(strategy).__name__
    given_accelerator, resolved_accelerator = accelerator
    if (
        strategy._accelerator is not None
        and given_accelerator != "auto"
        and strategy._accelerator.device_type != resolved_accelerator.device_type
    ):
        raise ValueError(
            f"strategy={name}(accelerator={strategy._accelerator.device_type!r}) contradicts "
            f"accelerator={given_accelerator!r}. Give the accelerator in one place, or make them agree."
        )
    given_devices, device_list = devices
    strategy_devices = _given_devices(strategy)
    if strategy_devices is not None and given_devices != "auto" and strategy_devices != device_list:
        raise ValueError(
            f"strategy={name}(parallel_devices={[str(device) for device in strategy_devices]}) contradicts "
            f"devices={given_devices!r} ({len(device_list)} device(s)). Give the devices in one place, or make "
            "them agree."
        )
    given_precision, resolved_precision = precision
    if (
        strategy._precision is not None
        and resolved_precision is not None
        and strategy._precision.name != resolved_precision.name
    ):
        where = f"precision={given_precision!r}" if given_precision is not None else f"plugins=[{resolved_precision!r}]"
        raise ValueError(
            f"strategy={name}(precision={strategy._precision.name!r}) contradicts {where}. Give the precision in "
            "one place, or make them agree."
        )
    for option, plugin, own in (
        ("checkpoint_io", checkpoint_io, strategy._checkpoint_io),
        ("cluster_environment", environment, getattr(strategy, "cluster_environment", None)),
    ):
        if plugin is not None and own is not None and plugin is not own:
            raise ValueError(
                f"strategy={name}({option}={own!r}) contradicts plugins=[{plugin!r}]: both give the {option}. "
                "Give it in one place."
            )


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


def _resolve_precision(precision: Any, plugin: Precision | None) -> Precision | None:
    """The precision given by ``precision=`` or a precision plugin; ``None`` when neither gives one."""
    if precision is None:
        return plugin
    if isinstance(precision, bool) or not isinstance(precision, str | int):
        raise TypeError(
            f"precision={precision!r} ({type(precision).__name__}) is not valid; expected one of "
            f"{_precision_choices()}, or None for {DEFAULT_PRECISION!r}."
        )
    name = PRECISION_SHORT_FORMS.get(str(precision), str(precision))
    if name not in registry.precisions:
        raise ValueError(f"precision={precision!r} is not valid; expected one of {_precision_choices()}.")
    if plugin is not None:
        if name != plugin.name:
            raise ValueError(
                f"precision={precision!r} contradicts the precision plugin {plugin!r} in plugins=; give one of them."
            )
        return plugin
    return _create_precision(name)


def _create_precision(name: str) -> Precision:
    precision_instance = registry.precisions.create(name)
    if not isinstance(precision_instance, Precision):
        raise TypeError(f"The precision {name!r} created {precision_instance!r}, which is not a Precision.")
    return precision_instance


def _precision_choices() -> str:
    names = registry.precisions.names()
    short = [f"{short!r} (= {full!r})" for short, full in PRECISION_SHORT_FORMS.items() if full in names]
    return ", ".join([*(repr(n) for n in names), *short])


def _create_strategy(name: str, total_devices: int, layout: MeshLayout | None) -> Strategy:
    if name == "auto":
        name = auto_strategy_name(total_devices, layout)
    created = registry.strategies.create(name)
    if not isinstance(created, Strategy):
        raise TypeError(
            f"The strategy {name!r} (from {registry.strategies.get(name).distribution}) created "
            f"{type(created).__name__}, which is not a stratagem Strategy."
        )
    return created


def auto_strategy_name(total_devices: int, layout: MeshLayout | dict[str, Degree] | str | None = None) -> str:
    """What ``strategy="auto"`` means before a model is known: one device, ``single_device``; more, ``ddp``
    (``ddp_notebook`` in a notebook). With a ``layout``, the strategy that takes it (see
    :func:`strategy_for_layout`). The Trainer's first fit may plan another from the model."""
    if layout is not None:
        return strategy_for_layout(parse_layout(layout), total_devices)
    if total_devices == 1:
        return "single_device"
    name = "ddp_notebook" if is_interactive() else "ddp"
    if name not in registry.strategies:
        raise ValueError(
            f"devices x num_nodes = {total_devices} needs a parallel strategy, and strategy='auto' picks "
            f'{name!r}, which is provided by stratagem-ddp: pip install "stratagem[ddp]". Or pass devices=1.'
        )
    return name


def strategy_for_layout(layout: MeshLayout, total_devices: int) -> str:
    """The registered strategy ``strategy="auto"`` runs ``layout`` with: of the available ones that take a mesh
    layout (:class:`~stratagem.strategies.TakesMeshLayout`) and spread every dimension the layout makes larger
    than 1, the one that spreads the fewest dimensions (the simplest), ``auto``'s default first among equals, then
    by name. ``ValueError`` naming the sizes when the layout does not fill ``total_devices``, or when no strategy
    here takes it (with what each one that takes a layout spreads)."""
    spread = set(_spread(layout.resolved(total_devices)))
    strategies = registry.strategies
    default = "ddp_notebook" if is_interactive() else "ddp"
    takers: dict[str, frozenset[str]] = {}
    for name in sorted(strategies.names(), key=lambda name: name != default):
        try:
            if strategies.describe(name).reason is not None:
                continue
            target = strategies.load_target(name)
        except ValueError:  # a name two plugins claim: `stratagem doctor` reports it, and it is no candidate
            continue
        if isinstance(target, type) and issubclass(target, TakesMeshLayout):
            takers[name] = target.mesh_dimensions
    fitting = [name for name, dimensions in takers.items() if spread <= dimensions]
    if fitting:
        return min(fitting, key=lambda name: len(takers[name]))
    asked = f"strategy='auto' with layout=({layout})"
    if not takers:
        hint = first_party.install_hint_for("strategy", "model_parallel") or ""
        raise ValueError(
            f"{asked} needs a strategy that takes a mesh layout, and none is installed here. {hint} Or leave "
            "layout out."
        )
    offered = "; ".join(f"{name} spreads {', '.join(sorted(dimensions))}" for name, dimensions in takers.items())
    raise ValueError(
        f"{asked} found no strategy that spreads {' and '.join(sorted(spread))} over several ranks ({offered}). "
        "Give a layout one of them takes, or choose the strategy with strategy=."
    )


def _spread(layout: MeshLayout) -> list[str]:
    """The dimensions ``layout`` makes larger than 1 (a ``-1`` one too, until resolved), outermost first."""
    return [dimension for dimension in layout.dim_names if getattr(layout, dimension) != 1]
