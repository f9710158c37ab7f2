"""One registry type; one instance per kind of plugin (strategies, accelerators, ...)."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import json
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from stratagem.registry import first_party

BUILTIN_DISTRIBUTION = first_party.CORE_DISTRIBUTION
BUILTIN_ENTRY_POINT = "built in"
GROUP_PREFIX = "stratagem."


@dataclass(frozen=True)
class Registration:
    """One name as a plugin registered it."""

    name: str
    target: Any
    description: str
    requires: str | None
    defaults: Mapping[str, Any]
    distribution: str
    override: bool
    entry_point: str = BUILTIN_ENTRY_POINT
    install: str | None = None
    """How to get what pip cannot install: the ``requires_module`` where one is declared (``requires`` then gets
    the pip command), else ``requires`` (not on PyPI, or only together with a particular torch)."""
    requires_module: str | None = None

    def missing_requirement(self) -> str | None:
        """Why what this name declares it needs (``requires``, ``requires_module``) is missing here, with how to
        get it, or ``None``. Cheap: reads package metadata and the import path, imports nothing."""
        if self.requires_module is None:
            return requirement_problem(self.requires, self.install)
        return requirement_problem(self.requires) or module_problem(self.requires_module, self.install)

    @property
    def target_path(self) -> str:
        if isinstance(self.target, str):
            return self.target
        return f"{getattr(self.target, '__module__', '?')}:{getattr(self.target, '__qualname__', repr(self.target))}"


@dataclass(frozen=True)
class Description:
    """What ``Registry.describe`` tells about a name."""

    name: str
    description: str
    distribution: str
    requires: str | None
    available: bool
    reason: str | None
    defaults: Mapping[str, Any]
    target: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "distribution": self.distribution,
            "requires": self.requires,
            "available": self.available,
            "reason": self.reason,
            "defaults": json_defaults(self.defaults),
            "target": self.target,
        }


@dataclass(frozen=True)
class PluginProblem:
    """Plugin code that failed, or a plugin declared so that stratagem cannot use it, and why.

    ``stage`` says when: ``"refused"`` (made for another stratagem), ``"load"`` (its entry
    point could not be imported or is not a register function), ``"register"`` (its register
    function raised; what it registered was rolled back), ``"target"`` (a registered target
    cannot be imported or is not usable), ``"call"`` (a method such as ``detect()`` raised),
    ``"conflict"`` or ``"group"`` (an entry point in a group stratagem does not read).
    ``names`` are the names this problem may have kept from being registered.
    """

    group: str
    distribution: str
    entry_point: str
    error: str
    details: str = field(default="", repr=False)
    stage: str = "register"
    names: tuple[str, ...] = ()


class PluginError(Exception):
    """A plugin's code failed where stratagem ran it; the failure is also kept as ``problem``."""

    def __init__(self, message: str, problem: PluginProblem) -> None:
        super().__init__(message)
        self.problem = problem


_STAGE_PHRASES = {
    "refused": "which was refused",
    "load": "which could not be loaded",
    "register": "whose register function failed, so what it registered was rolled back",
}


class Registry:
    """Names of one kind of plugin, mapped to what creates them.

    Filled on first use from the built-ins and from the entry points of ``group``. Each
    entry point names a light function ``register(registry)`` that calls :meth:`register`.
    Discovery imports only those functions; a target given as ``"module:attr"`` is imported
    when its name is used, and a target that is a class must subclass ``interface``
    (``"module:Class"``) and leave no abstract method unimplemented.

    Plugin code (a register function, a target's import, ``detect()``, ``is_available()``)
    runs fenced: anything it raises other than ``KeyboardInterrupt`` -- ``SystemExit``
    included -- is recorded as a :class:`PluginProblem` naming the distribution and entry
    point, and every name that does not need that code keeps working.
    """

    def __init__(
        self,
        kind: str,
        group: str,
        builtins: Callable[[Registry], None] | None = None,
        interface: str | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self.interface = interface
        self._builtins = builtins
        self._entries: dict[str, Registration] = {}
        self._conflicts: dict[str, list[Registration]] = {}
        self._problems: list[PluginProblem] = []
        self._distribution = BUILTIN_DISTRIBUTION
        self._entry_point = BUILTIN_ENTRY_POINT
        self._registered_now: list[str] = []
        self._loaded = False
        self._loading = False
        self._lock = threading.RLock()

    # -- what plugins call --------------------------------------------------------------

    def register(
        self,
        name: str,
        target: Any,
        *,
        description: str,
        requires: str | None = None,
        defaults: Mapping[str, Any] | None = None,
        override: bool = False,
        install: str | None = None,
        requires_module: str | None = None,
    ) -> None:
        """Record ``name``. ``target`` is a class, a factory, or a lazy ``"module:attr"`` string.

        ``requires`` is a PEP 508 requirement the target needs (checked when used, not now);
        ``requires_module`` a top-level module it needs that no pip distribution provides (a vendor's
        bridge such as Habana's ``habana_frameworks``), looked up on the import path with
        ``importlib.util.find_spec``, which does not run it, so that even a plain listing can say it is
        missing; ``install`` how to get the module, or without one the requirement, where that is not
        ``pip install '<requires>'`` (a command, or where its vendor's instructions are): users are told it
        instead of a pip command that cannot work;
        ``defaults`` are options this name passes to the target (what makes an alias).
        Registering a name another distribution registered is an error naming both, unless
        one of the two passes ``override=True``.
        """
        _check_registration(self.kind, name, target, description, requires, defaults)
        if install is not None and (not isinstance(install, str) or not install.strip()):
            raise ValueError(f"The install hint of {self.kind} {name!r} must be a non-empty string, got {install!r}.")
        if requires_module is not None and (not isinstance(requires_module, str) or not requires_module.isidentifier()):
            # A dotted name would be found by importing its parent package, which may be heavy or probe hardware.
            raise ValueError(
                f"The required module of {self.kind} {name!r} must be a top-level module name (no dots), "
                f"got {requires_module!r}."
            )
        registration = Registration(
            name=name,
            target=target,
            description=description,
            requires=requires,
            defaults=dict(defaults or {}),
            distribution=self._distribution,
            override=override,
            entry_point=self._entry_point,
            install=install,
            requires_module=requires_module,
        )
        self._registered_now.append(name)
        existing = self._entries.get(name)
        if name in self._conflicts:
            self._conflicts[name].append(registration)
            return
        if existing is None:
            self._entries[name] = registration
            return
        if existing.distribution == registration.distribution:
            raise ValueError(f"{registration.distribution} registers the {self.kind} {name!r} twice.")
        if override and not existing.override:
            self._entries[name] = registration
        elif existing.override and not override:
            return
        else:
            del self._entries[name]
            self._conflicts[name] = [existing, registration]

    # -- what users and the connector call -----------------------------------------------

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return isinstance(name, str) and (name in self._entries or name in self._conflicts)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._ensure_loaded()
        return sorted([*self._entries, *self._conflicts])

    def get(self, name: str) -> Registration:
        """The registration of ``name``; ``ValueError`` for an unknown or conflicting name."""
        self._ensure_loaded()
        if name in self._conflicts:
            owners = " and ".join(sorted({r.distribution for r in self._conflicts[name]}))
            raise ValueError(
                f"The {self.kind} name {name!r} is registered by both {owners}. Uninstall one, or have one "
                "register it with override=True."
            )
        try:
            return self._entries[name]
        except KeyError:
            raise self.unknown_name_error(name) from None

    def describe(self, name: str) -> Description:
        """Description, owning distribution, requirement, and whether it is usable here (or why not).

        Imports the target (unless its requirement is missing) and asks its ``is_available()``.
        """
        registration = self.get(name)
        reason = registration.missing_requirement()
        if reason is None:
            reason = self._unavailable_reason(registration)
        return Description(
            name=name,
            description=registration.description,
            distribution=registration.distribution,
            requires=registration.requires,
            available=reason is None,
            reason=reason,
            defaults=registration.defaults,
            target=registration.target_path,
        )

    def load_target(self, name: str) -> Any:
        """The class or factory behind ``name``, imported now.

        ``ImportError`` if its requirement is missing; :class:`PluginError` naming the plugin if
        the import fails or the class is not a usable ``interface`` (wrong base, abstract methods).
        """
        registration = self.get(name)
        problem = registration.missing_requirement()
        if problem is not None:
            raise ImportError(f"The {self.kind} {name!r} (from {registration.distribution}) {problem}.")
        return self._checked_target(registration)

    def create(self, name: str, **options: Any) -> Any:
        """Create ``name`` with its registered defaults updated by ``options``.

        An option the target does not accept is a ``TypeError`` listing the accepted ones.
        """
        registration = self.get(name)
        target = self.load_target(name)
        merged = {**registration.defaults, **options}
        accepted = _accepted_options(target)
        if accepted is not None:
            unknown = sorted(set(merged) - accepted)
            if unknown:
                raise TypeError(
                    f"The {self.kind} {name!r} does not accept option(s) {', '.join(map(repr, unknown))}. "
                    f"Accepted: {', '.join(sorted(accepted)) or '(none)'}."
                )
        return target(**merged)

    def call_plugin(self, name: str, what: str, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)``, run as code of the plugin that registered ``name``.

        Anything it raises but ``KeyboardInterrupt`` is recorded as a problem of that plugin
        and raised as :class:`PluginError`, which callers catch to go on without it. ``what``
        names the call in the problem (``"detect()"``).
        """
        registration = self.get(name)
        try:
            return function(*args)
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            raise self._failure(registration, f"{what} raised {_error_text(error)}", "call", error) from error

    def check_targets(self) -> None:
        """Import every target whose requirement is met and record those that cannot be used."""
        for name in self.names():
            if name in self._conflicts:
                continue
            registration = self._entries[name]
            if registration.missing_requirement() is None:
                with contextlib.suppress(PluginError):
                    self._checked_target(registration)

    def problems(self) -> list[PluginProblem]:
        """Plugins that failed (to register, import, or answer) and name conflicts, with their distributions."""
        self._ensure_loaded()
        conflicts = [
            PluginProblem(
                group=self.group,
                distribution=" and ".join(sorted({r.distribution for r in registrations})),
                entry_point=name,
                error=f"{self.kind} name {name!r} registered by several distributions without override=True",
                stage="conflict",
                names=(name,),
            )
            for name, registrations in self._conflicts.items()
        ]
        return [*self._problems, *conflicts]

    def unknown_name_error(self, name: str) -> ValueError:
        """The one error for a name nobody registered: the plugin problem that explains it, what a
        Lightning name means here, where a first-party name comes from, close matches, what exists."""
        known = sorted([*self._entries, *self._conflicts])
        explained = [problem for problem in self._problems if name in problem.names]
        if explained:
            problem = explained[0]
            phrase = _STAGE_PHRASES.get(problem.stage, "which failed")
            return ValueError(
                f"The {self.kind} {name!r} would come from {problem.distribution} ({problem.entry_point}), "
                f"{phrase}: {problem.error}. `stratagem doctor --tracebacks` shows the details."
            )
        lightning = first_party.lightning_answer(self.kind, name, known)
        if lightning is not None:
            parts = [f"The {self.kind} {name!r} is a PyTorch Lightning name stratagem does not use: {lightning}"]
        elif (hint := first_party.install_hint_for(self.kind, name)) is not None:
            parts = [hint]
        else:
            parts = [f"Unknown {self.kind} {name!r}."]
            close = self._close_matches(name, known)
            if close:
                parts.append(close)
        unexplained = [p for p in self._problems if p.stage in _STAGE_PHRASES]
        if unexplained:
            failed = "; ".join(f"{p.distribution} ({p.entry_point}): {p.error}" for p in unexplained)
            parts.append(f"Plugins that failed to load may provide it: {failed}. `stratagem doctor` shows them.")
        parts.append(f"Registered {self.kind} names: {', '.join(known) or '(none)'}.")
        return ValueError(" ".join(parts))

    def _close_matches(self, name: str, known: list[str]) -> str | None:
        """A "did you mean" over registered names and installable first-party ones, saying how to install those."""
        installable = first_party.uninstalled_installable_names(self.kind)
        candidates = sorted(set(known) | set(installable))
        matches = [match for match in difflib.get_close_matches(name, candidates, n=4, cutoff=0.6) if match != name]
        if not matches:
            return None
        sentence = "Did you mean " + " or ".join(repr(match) for match in matches[:3]) + "?"
        by_distribution: dict[str, list[str]] = {}
        for match in matches[:3]:
            if match in installable:
                by_distribution.setdefault(installable[match].distribution, []).append(repr(match))
        for distribution, names in by_distribution.items():
            package = next(p for p in first_party.PACKAGES if p.distribution == distribution)
            if len(names) == len(matches[:3]):
                subject = "It comes" if len(names) == 1 else "They come"
            else:
                subject = f"{' and '.join(names)} {'comes' if len(names) == 1 else 'come'}"
            sentence += f" {subject} from {first_party.how_to_get(package)}."
        return sentence

    # -- discovery -----------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            # A register function that asks this registry for its names sees what is registered so far.
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                if self._builtins is not None:
                    self._builtins(self)
                for entry_point in self._entry_points():
                    self._load_entry_point(entry_point)
            except BaseException:
                # Interrupted: start again from nothing next time, so built-ins are never registered twice.
                self._entries, self._conflicts, self._problems = {}, {}, []
                raise
            finally:
                self._loading = False
            self._loaded = True

    def _entry_points(self) -> list[metadata.EntryPoint]:
        try:
            return list(metadata.entry_points(group=self.group))
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            self._problems.append(
                PluginProblem(self.group, "<unreadable metadata>", "", _error_text(error), _traceback(error), "load")
            )
            return []

    def _load_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        distribution = entry_point.dist.name if entry_point.dist is not None else "<unknown distribution>"
        label = f"{entry_point.name} = {entry_point.value}"
        snapshot = (dict(self._entries), {k: list(v) for k, v in self._conflicts.items()})
        self._registered_now = []
        stage = "load"
        try:
            incompatibility = _core_incompatibility(entry_point.dist)
            if incompatibility is not None:
                names = self._names_it_may_provide(distribution, entry_point.name, [])
                self._problems.append(
                    PluginProblem(self.group, distribution, label, incompatibility, stage="refused", names=names)
                )
                return
            register = entry_point.load()
            _check_register_function(register, label)
            stage = "register"
            with self._registering_as(distribution, label):
                register(self)
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # a broken plugin must not break the others, nor exit the program
            self._entries, self._conflicts = snapshot
            names = self._names_it_may_provide(distribution, entry_point.name, self._registered_now)
            self._problems.append(
                PluginProblem(self.group, distribution, label, _error_text(error), _traceback(error), stage, names)
            )

    def _names_it_may_provide(self, distribution: str, entry_point_name: str, registered: list[str]) -> tuple[str, ...]:
        package = next((p for p in first_party.PACKAGES if p.distribution == distribution), None)
        catalogued = package.names.get(self.kind, ()) if package is not None else ()
        names = [*registered, *catalogued] or [entry_point_name]
        return tuple(dict.fromkeys(name for name in names if name not in self._entries))

    @contextlib.contextmanager
    def _registering_as(self, distribution: str, entry_point: str) -> Iterator[None]:
        previous = self._distribution, self._entry_point
        self._distribution, self._entry_point = distribution, entry_point
        try:
            yield
        finally:
            self._distribution, self._entry_point = previous

    # -- targets -------------------------------------------------------------------------

    def _checked_target(self, registration: Registration) -> Any:
        what = f"importing its target {registration.target_path}"
        try:
            target = _import_target(registration)
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            raise self._failure(registration, f"{what} raised {_error_text(error)}", "target", error) from error
        defect = self._defect_of(target)
        if defect is not None:
            raise self._failure(registration, f"its target {registration.target_path} {defect}", "target")
        return target

    def _defect_of(self, target: Any) -> str | None:
        """Why ``target`` cannot create a usable instance of this kind, or ``None``."""
        if not isinstance(target, type):
            return None if callable(target) else f"is a {type(target).__name__}, not a class or a factory"
        if self.interface is not None:
            interface = _import_path(self.interface)
            if not issubclass(target, interface):
                return f"is not a subclass of {interface.__module__}.{interface.__qualname__}"
        if inspect.isabstract(target):
            missing = ", ".join(sorted(getattr(target, "__abstractmethods__", ())))
            return f"leaves abstract method(s) unimplemented: {missing}"
        return None

    def _unavailable_reason(self, registration: Registration) -> str | None:
        try:
            target = self._checked_target(registration)
            # Only a static or class method can be asked before an instance exists.
            probe = inspect.getattr_static(target, "is_available", None) if isinstance(target, type) else None
            if not isinstance(probe, staticmethod | classmethod):
                return None
            if self.call_plugin(registration.name, "is_available()", probe.__get__(None, target)):
                return None
            reason = getattr(target, "unavailable_reason", None)
            if callable(reason):
                return str(self.call_plugin(registration.name, "unavailable_reason()", reason))
            return "not available on this machine"
        except PluginError as error:
            return error.problem.error

    def _failure(
        self, registration: Registration, what: str, stage: str, error: BaseException | None = None
    ) -> PluginError:
        """Record that the plugin behind ``registration`` failed (``what``); the error to raise."""
        problem = PluginProblem(
            group=self.group,
            distribution=registration.distribution,
            entry_point=registration.entry_point,
            error=f"{self.kind} {registration.name!r}: {what}",
            details=_traceback(error) if error is not None else "",
            stage=stage,
        )
        with self._lock:
            if not any(
                (known.distribution, known.error) == (problem.distribution, problem.error) for known in self._problems
            ):
                self._problems.append(problem)
        return PluginError(
            f"The {self.kind} {registration.name!r} from {registration.distribution} "
            f"({registration.entry_point}) cannot be used: {what}.",
            problem,
        )

    def __repr__(self) -> str:
        return f"Registry(kind={self.kind!r}, group={self.group!r})"


def unknown_group_problems(known_groups: Iterable[str]) -> list[PluginProblem]:
    """Entry points in a ``stratagem.*`` group no registry reads (``stratagem.strategy``): ignored otherwise."""
    known = set(known_groups)
    problems = []
    every = metadata.entry_points()
    unread = sorted(group for group in every.groups if group.startswith(GROUP_PREFIX) and group not in known)
    for entry_point in (point for group in unread for point in every.select(group=group)):
        group = entry_point.group
        close = difflib.get_close_matches(group, sorted(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"stratagem reads {', '.join(sorted(known))}"
        problems.append(
            PluginProblem(
                group=group,
                distribution=entry_point.dist.name if entry_point.dist is not None else "<unknown distribution>",
                entry_point=f"{entry_point.name} = {entry_point.value}",
                error=f"entry-point group {group!r} is not one stratagem reads, so this entry point is ignored; {hint}",
                stage="group",
            )
        )
    return problems


def json_defaults(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` with JSON values kept as they are (ints stay ints) and anything else as its repr."""
    return {key: value if _is_json(value) else repr(value) for key, value in defaults.items()}


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _error_text(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _traceback(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


def _check_register_function(register: Any, label: str) -> None:
    if isinstance(register, type):
        path = f"{register.__module__}:{register.__qualname__}"
        raise TypeError(
            f"entry point {label!r} names the class {path}, not a register(registry) function; point it at a "
            f"function that calls registry.register('<name>', {path!r}, description='...')"
        )
    if not callable(register):
        raise TypeError(f"entry point {label!r} names {type(register).__name__}, not a register(registry) function")
    try:
        inspect.signature(register).bind(None)
    except TypeError:
        raise TypeError(
            f"entry point {label!r} names {getattr(register, '__qualname__', register)!r}, which cannot be called "
            "as register(registry)"
        ) from None
    except ValueError:  # no signature to inspect (a builtin): let the call tell
        return


def requirement_problem(requires: str | None, install: str | None = None) -> str | None:
    """Why ``requires`` is not met in this environment, with how to install it (``install`` where the
    registration gave one, else the pip command), or ``None``."""
    if not requires:
        return None
    from packaging.requirements import Requirement

    requirement = Requirement(requires)
    if requirement.marker is not None and not requirement.marker.evaluate():
        return None
    how = install or f"pip install '{requires}'"
    try:
        installed = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return f"needs {requires}, which is not installed: {how}"
    if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
        return f"needs {requires}, but {requirement.name} {installed} is installed: {how}"
    return None


def module_problem(module: str | None, install: str | None = None) -> str | None:
    """Why the top-level ``module`` cannot be imported here, with how to get it (``install``), or ``None``.
    Finds it on the import path without importing it."""
    if not module or module in sys.modules:
        return None
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return f"needs the module {module}, which is not installed" + (f": {install}" if install else "")


def _check_registration(kind: str, name: Any, target: Any, description: Any, requires: Any, defaults: Any) -> None:
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ValueError(f"A {kind} name must be a non-empty string without surrounding spaces, got {name!r}.")
    if isinstance(target, str):
        module, _, attribute = target.partition(":")
        if not module or not attribute:
            raise ValueError(f"The target of {kind} {name!r} must be 'module:attribute', got {target!r}.")
    elif not callable(target):
        raise TypeError(f"The target of {kind} {name!r} must be a class, a factory or 'module:attr', got {target!r}.")
    if not isinstance(description, str) or not description:
        raise ValueError(f"The {kind} {name!r} needs a one-line description.")
    if requires is not None:
        from packaging.requirements import InvalidRequirement, Requirement

        try:
            Requirement(requires)
        except InvalidRequirement as error:
            raise ValueError(f"The {kind} {name!r} declares an invalid requirement {requires!r}: {error}") from None
    if defaults is not None and not isinstance(defaults, Mapping):
        raise TypeError(f"The defaults of {kind} {name!r} must be a mapping, got {type(defaults).__name__}.")


def _import_target(registration: Registration) -> Any:
    if not isinstance(registration.target, str):
        return registration.target
    return _import_path(registration.target)


def _import_path(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def _accepted_options(target: Any) -> set[str] | None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    accepted = set()
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            accepted.add(parameter.name)
    return accepted


def _core_incompatibility(distribution: metadata.Distribution | None) -> str | None:
    """Why a plugin's declared ``stratagem`` requirement rejects the installed core, or ``None``."""
    if distribution is None:
        return None
    from packaging.requirements import InvalidRequirement, Requirement

    core_version = metadata.version(BUILTIN_DISTRIBUTION)
    for line in distribution.requires or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name.lower() != BUILTIN_DISTRIBUTION or requirement.marker is not None:
            continue
        if requirement.specifier and not requirement.specifier.contains(core_version, prereleases=True):
            return (
                f"{distribution.name} {distribution.version} requires {requirement}, but stratagem "
                f"{core_version} is installed; install a {distribution.name} release made for stratagem "
                f"{core_version}, or stratagem{requirement.specifier}."
            )
    return None
