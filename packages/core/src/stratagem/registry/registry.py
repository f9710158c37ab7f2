"""One registry type; one instance per kind of plugin (strategies, accelerators, ...)."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from stratagem.registry.first_party import install_hint_for

BUILTIN_DISTRIBUTION = "stratagem"


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
            "defaults": {key: repr(value) for key, value in self.defaults.items()},
            "target": self.target,
        }


@dataclass(frozen=True)
class PluginProblem:
    """A plugin that could not be registered, and why."""

    group: str
    distribution: str
    entry_point: str
    error: str
    details: str = field(default="", repr=False)


class Registry:
    """Names of one kind of plugin, mapped to what creates them.

    Filled on first use from the built-ins and from the entry points of ``group``. Each
    entry point names a light function ``register(registry)`` that calls :meth:`register`.
    Discovery imports only those functions; a target given as ``"module:attr"`` is imported
    when its name is used.
    """

    def __init__(self, kind: str, group: str, builtins: Callable[[Registry], None] | None = None) -> None:
        self.kind = kind
        self.group = group
        self._builtins = builtins
        self._entries: dict[str, Registration] = {}
        self._conflicts: dict[str, list[Registration]] = {}
        self._problems: list[PluginProblem] = []
        self._distribution = BUILTIN_DISTRIBUTION
        self._loaded = False
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
    ) -> None:
        """Record ``name``. ``target`` is a class, a factory, or a lazy ``"module:attr"`` string.

        ``requires`` is a PEP 508 requirement the target needs (checked when used, not now);
        ``defaults`` are options this name passes to the target (what makes an alias).
        Registering a name another distribution registered is an error naming both, unless
        one of the two passes ``override=True``.
        """
        _check_registration(self.kind, name, target, description, requires, defaults)
        registration = Registration(
            name=name,
            target=target,
            description=description,
            requires=requires,
            defaults=dict(defaults or {}),
            distribution=self._distribution,
            override=override,
        )
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
        """Description, owning distribution, requirement, and whether it is usable here (or why not)."""
        registration = self.get(name)
        reason = requirement_problem(registration.requires)
        if reason is None:
            reason = self._target_unavailable_reason(registration)
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
        """The class or factory behind ``name``, imported now; fails clearly if its requirement is missing."""
        registration = self.get(name)
        problem = requirement_problem(registration.requires)
        if problem is not None:
            raise ImportError(f"The {self.kind} {name!r} (from {registration.distribution}) {problem}.")
        return _import_target(registration)

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

    def problems(self) -> list[PluginProblem]:
        """Plugins that failed to register (and name conflicts), with their distributions."""
        self._ensure_loaded()
        conflicts = [
            PluginProblem(
                group=self.group,
                distribution=" and ".join(sorted({r.distribution for r in registrations})),
                entry_point=name,
                error=f"{self.kind} name {name!r} registered by several distributions without override=True",
            )
            for name, registrations in self._conflicts.items()
        ]
        return [*self._problems, *conflicts]

    def unknown_name_error(self, name: str) -> ValueError:
        """The one error for a name nobody registered: close matches, what exists, what to install."""
        known = sorted([*self._entries, *self._conflicts])
        hint = install_hint_for(self.kind, name)
        from stratagem.registry.first_party import first_party_names

        candidates = sorted(set(known) | set(first_party_names(self.kind)))
        close = [match for match in difflib.get_close_matches(name, candidates, n=4, cutoff=0.6) if match != name][:3]
        parts = [f"Unknown {self.kind} {name!r}."]
        if hint:
            parts.append(hint)
        if close:
            parts.append("Did you mean " + " or ".join(repr(match) for match in close) + "?")
        parts.append(f"Registered {self.kind} names: {', '.join(known) or '(none)'}.")
        return ValueError(" ".join(parts))

    # -- discovery -----------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            if self._builtins is not None:
                self._builtins(self)
            for entry_point in metadata.entry_points(group=self.group):
                self._load_entry_point(entry_point)
            self._loaded = True

    def _load_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        distribution = entry_point.dist.name if entry_point.dist is not None else "<unknown distribution>"
        label = f"{entry_point.name} = {entry_point.value}"
        incompatibility = _core_incompatibility(entry_point.dist)
        if incompatibility is not None:
            self._problems.append(PluginProblem(self.group, distribution, label, incompatibility))
            return
        snapshot = (dict(self._entries), {k: list(v) for k, v in self._conflicts.items()})
        try:
            register = entry_point.load()
            if not callable(register):
                raise TypeError(
                    f"entry point {label!r} names {type(register).__name__}, not a register(registry) function"
                )
            with self._registering_as(distribution):
                register(self)
        except Exception as error:  # a broken plugin must not break the others
            self._entries, self._conflicts = snapshot
            self._problems.append(
                PluginProblem(
                    self.group,
                    distribution,
                    label,
                    f"{type(error).__name__}: {error}",
                    "".join(traceback.format_exception(error)),
                )
            )

    @contextlib.contextmanager
    def _registering_as(self, distribution: str) -> Iterator[None]:
        previous = self._distribution
        self._distribution = distribution
        try:
            yield
        finally:
            self._distribution = previous

    def _target_unavailable_reason(self, registration: Registration) -> str | None:
        try:
            target = _import_target(registration)
        except Exception as error:
            return f"cannot import {registration.target_path}: {type(error).__name__}: {error}"
        is_available = getattr(target, "is_available", None)
        if isinstance(target, type) and callable(is_available):
            try:
                if not is_available():
                    reason = getattr(target, "unavailable_reason", None)
                    return reason() if callable(reason) else "not available on this machine"
            except TypeError:
                return None
        return None

    def __repr__(self) -> str:
        return f"Registry(kind={self.kind!r}, group={self.group!r})"


def requirement_problem(requires: str | None) -> str | None:
    """Why ``requires`` is not met in this environment (with the install command), or ``None``."""
    if not requires:
        return None
    from packaging.requirements import Requirement

    requirement = Requirement(requires)
    if requirement.marker is not None and not requirement.marker.evaluate():
        return None
    try:
        installed = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return f"needs {requires}, which is not installed: pip install '{requires}'"
    if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
        return f"needs {requires}, but {requirement.name} {installed} is installed: pip install '{requires}'"
    return None


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
    module_name, _, attribute = registration.target.partition(":")
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
