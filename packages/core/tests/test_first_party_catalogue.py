"""registry/first_party.py is hand-kept; these tests hold it to what installed packages register."""

from stratagem import registry
from stratagem.registry.first_party import PACKAGES, owning_package
from stratagem.registry.registry import BUILTIN_DISTRIBUTION

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
