"""registry/first_party.py is hand-kept; these tests hold it to what installed packages register, to the
extras core declares, and its hints to what can be installed."""

import re
import sys
from pathlib import Path

import pytest

from stratagem import registry
from stratagem.registry import Registry, _builtins, first_party
from stratagem.registry.first_party import PACKAGES, owning_package
from stratagem.registry.registry import BUILTIN_DISTRIBUTION

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library (core depends on it there)
    import tomli as tomllib

FIRST_PARTY = {package.distribution: package for package in PACKAGES}


def _registered_names_by_distribution():
    """``{distribution: {(kind, name), ...}}`` for everything the real registries hold."""
    owners = {}
    for kind_registry in registry.ALL:
        for name in kind_registry.names():
            distribution = kind_registry.get(name).distribution
            owners.setdefault(distribution, set()).add((kind_registry.kind, name))
    return owners


def test_installed_first_party_packages_register_only_names_the_catalogue_lists():
    for distribution, names in _registered_names_by_distribution().items():
        package = FIRST_PARTY.get(distribution)
        if package is None:
            continue
        unlisted = sorted(f"{kind} {name!r}" for kind, name in names if name not in package.names.get(kind, ()))
        assert not unlisted, f"{distribution} registers {', '.join(unlisted)}, missing from registry/first_party.py"


def test_names_core_registers_are_never_attributed_to_another_package():
    core_names = _registered_names_by_distribution()[BUILTIN_DISTRIBUTION]
    assert ("strategy", "single_device") in core_names
    misattributed = sorted(
        f"{kind} {name!r} -> {package.distribution}"
        for kind, name in core_names
        if (package := owning_package(kind, name)) is not None
    )
    assert not misattributed


def test_every_catalogued_name_is_attributed_to_its_own_package():
    for package in PACKAGES:
        for kind, names in package.names.items():
            owners = {name: owning_package(kind, name) for name in names}
            assert all(owner is package for owner in owners.values()), (package.distribution, owners)


# -- hints are true for what can be installed -------------------------------------------------

CORE_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
REGISTRIES = {kind_registry.kind: kind_registry for kind_registry in registry.ALL}


def _extras_core_declares():
    return set(tomllib.loads(CORE_PYPROJECT.read_text())["project"]["optional-dependencies"])


def _core_only_strategies(monkeypatch, installed=()):
    """``registry.strategies`` with core's names only, as if only ``installed`` first-party packages were."""
    monkeypatch.setattr(first_party, "is_installed", lambda distribution: distribution in installed)
    strategies = Registry("strategy", "stratagem_test_none.strategies", _builtins.register_strategies)
    monkeypatch.setattr(registry, "strategies", strategies)
    return strategies


def _unknown_name_message(kind_registry, name):
    with pytest.raises(ValueError, match=re.escape(repr(name))) as raised:
        kind_registry.get(name)
    return str(raised.value)


def test_the_installed_core_declares_the_extras_its_pyproject_declares():
    assert first_party.declared_extras() == _extras_core_declares()


def test_a_pip_command_is_given_only_for_extras_core_declares(monkeypatch):
    monkeypatch.setattr(first_party, "is_installed", lambda distribution: False)
    declared = _extras_core_declares()
    for package in PACKAGES:
        for kind, names in package.names.items():
            for name in names:
                hint = first_party.install_hint_for(kind, name) or ""
                assert package.distribution in hint
                if package.extra in declared:
                    assert f'pip install "stratagem[{package.extra}]"' in hint
                else:
                    assert "pip install" not in hint
                    assert f"{package.distribution}, which is not released yet" in hint


def test_every_extra_naming_a_first_party_package_is_catalogued():
    pyproject = tomllib.loads(CORE_PYPROJECT.read_text())["project"]["optional-dependencies"]
    for extra, requirements in pyproject.items():
        if extra == "all":
            continue
        for requirement in requirements:
            if requirement.startswith("stratagem-"):
                assert requirement.split("==")[0] == FIRST_PARTY_BY_EXTRA[extra].distribution


FIRST_PARTY_BY_EXTRA = {package.extra: package for package in PACKAGES}


_UNRELEASED = first_party.FirstPartyPackage(
    extra="unreleased", distribution="stratagem-unreleased", names={"strategy": ("unreleased_single",)}
)
"""A catalogued package core declares no extra for (every real one may be released by now)."""


def test_an_unreleased_first_party_name_says_so_and_suggests_nothing_else(monkeypatch):
    monkeypatch.setattr(first_party, "PACKAGES", (*first_party.PACKAGES, _UNRELEASED))
    message = _unknown_name_message(registry.strategies, "unreleased_single")
    assert message.startswith(
        "The strategy 'unreleased_single' is provided by stratagem-unreleased, which is not released yet"
    )
    assert "pip install" not in message
    assert "Did you mean" not in message


def test_ddp_without_its_package_gives_the_pip_command_and_does_not_suggest_dp(monkeypatch):
    strategies = _core_only_strategies(monkeypatch)
    message = _unknown_name_message(strategies, "ddp")
    assert message.startswith(
        "The strategy 'ddp' is provided by stratagem-ddp, which is not installed: pip install \"stratagem[ddp]\"."
    )
    assert "'dp'" not in message


def test_close_matches_are_registered_names_or_installable_ones_with_their_command(monkeypatch):
    strategies = _core_only_strategies(monkeypatch)
    message = _unknown_name_message(strategies, "dpp")
    assert re.search(r"Did you mean [^?]*'ddp'[^?]*\?", message)
    assert 'They come from stratagem-ddp, which is not installed: pip install "stratagem[ddp]".' in message
    monkeypatch.setattr(first_party, "PACKAGES", (*first_party.PACKAGES, _UNRELEASED))
    assert "unreleased_single" not in _unknown_name_message(strategies, "unreleased_singel")
    assert "Did you mean 'single_device'" in _unknown_name_message(strategies, "single_devise")


@pytest.mark.parametrize("entry", first_party.LIGHTNING_NAMES, ids=lambda entry: f"{entry.kind}:{entry.name}")
def test_a_lightning_name_gets_what_it_means_here_and_what_to_use(entry):
    kind_registry = REGISTRIES[entry.kind]
    assert entry.name not in kind_registry, f"{entry.name!r} is registered; its Lightning answer would never show"
    assert owning_package(entry.kind, entry.name) is None
    message = _unknown_name_message(kind_registry, entry.name)
    assert message.startswith(f"The {entry.kind} {entry.name!r} is a PyTorch Lightning name stratagem does not use: ")
    assert entry.answer in message
    for instead in entry.instead:
        assert instead in kind_registry or owning_package(entry.kind, instead) is not None, instead
        assert repr(instead) in message


def test_a_lightning_name_pointing_at_an_uninstalled_package_says_how_to_install_it(monkeypatch):
    strategies = _core_only_strategies(monkeypatch)
    message = _unknown_name_message(strategies, "ddp_sharded")
    assert "'fsdp' (from stratagem-fsdp, which is not installed: pip install \"stratagem[fsdp]\")" in message
    message = _unknown_name_message(strategies, "tpu_spawn")
    assert "'xla' (from stratagem-xla, " in message
    assert "not released yet" not in message
