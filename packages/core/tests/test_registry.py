import sys
from importlib import metadata

import pytest
from fake_plugins import register_source

from stratagem.registry.registry import BUILTIN_DISTRIBUTION

CORE_VERSION = metadata.version("stratagem")


_GOOD = register_source("'good', 'collections:OrderedDict', description='A good one.'")


def _builtins(registry):
    registry.register("single_device", "collections:OrderedDict", description="Built in.")


# -- broken plugins -------------------------------------------------------------------------


def test_a_plugin_whose_module_fails_to_import_is_recorded_and_others_still_register(fake):
    fake.add("good-plugin", {"good": _GOOD}, {"good": "good:register"})
    fake.add("broken-plugin", {"broken": "import not_a_module_anywhere\n"}, {"broken": "broken:register"})
    registry = fake.registry()
    assert registry.names() == ["good"]
    [problem] = registry.problems()
    assert problem.distribution == "broken-plugin"
    assert problem.group == fake.group
    assert "ModuleNotFoundError" in problem.error
    assert "not_a_module_anywhere" in problem.details


def test_an_exception_in_register_is_recorded_and_rolls_back_what_it_registered(fake):
    source = register_source("'half_done', 'collections:OrderedDict', description='Registered first.'")
    source += "    raise RuntimeError('register fell over')\n"
    fake.add("raising-plugin", {"raising": source}, {"raising": "raising:register"})
    fake.add("good-plugin", {"good": _GOOD}, {"good": "good:register"})
    registry = fake.registry()
    assert registry.names() == ["good"]
    [problem] = registry.problems()
    assert (problem.distribution, problem.error) == ("raising-plugin", "RuntimeError: register fell over")


def test_an_entry_point_that_is_not_callable_is_recorded(fake):
    fake.add("constant-plugin", {"constant": "register = 42\n"}, {"constant": "constant:register"})
    fake.add("good-plugin", {"good": _GOOD}, {"good": "good:register"})
    registry = fake.registry()
    assert registry.names() == ["good"]
    [problem] = registry.problems()
    assert problem.distribution == "constant-plugin"
    assert "not a register(registry) function" in problem.error


def test_an_entry_point_naming_a_missing_attribute_is_recorded(fake):
    fake.add("typo-plugin", {"typo": _GOOD}, {"typo": "typo:regsiter"})
    registry = fake.registry()
    assert registry.names() == []
    [problem] = registry.problems()
    assert problem.distribution == "typo-plugin"
    assert "AttributeError" in problem.error


@pytest.mark.parametrize(
    ("registration", "message"),
    [
        ("'bad', 'no_colon_here', description='x'", "must be 'module:attribute'"),
        ("'bad', 42, description='x'", "must be a class, a factory or 'module:attr'"),
        ("'bad', 'collections:OrderedDict', description=''", "needs a one-line description"),
        ("'bad', 'collections:OrderedDict', description='x', requires='not a requirement!'", "invalid requirement"),
        ("' spaced ', 'collections:OrderedDict', description='x'", "non-empty string"),
    ],
)
def test_a_plugin_registering_a_bad_target_is_recorded_with_the_reason(fake, registration, message):
    fake.add("bad-target", {"bad": register_source(registration)}, {"bad": "bad:register"})
    fake.add("good-plugin", {"good": _GOOD}, {"good": "good:register"})
    registry = fake.registry()
    assert registry.names() == ["good"]
    [problem] = registry.problems()
    assert problem.distribution == "bad-target"
    assert message in problem.error


# -- duplicates and overrides ---------------------------------------------------------------


def test_one_name_from_two_distributions_is_an_error_naming_both(fake):
    for distribution in ("first-plugin", "second-plugin"):
        stem = distribution.replace("-", "_")
        source = register_source("'shared', 'collections:OrderedDict', description='Mine.'")
        fake.add(distribution, {stem: source}, {"shared": f"{stem}:register"})
    fake.add("good-plugin", {"good": _GOOD}, {"good": "good:register"})
    registry = fake.registry()
    assert "shared" in registry
    assert registry.get("good").distribution == "good-plugin"
    with pytest.raises(ValueError, match=r"'shared' is registered by both first-plugin and second-plugin"):
        registry.get("shared")
    [problem] = registry.problems()
    assert problem.distribution == "first-plugin and second-plugin"


@pytest.mark.parametrize("override_first", [True, False], ids=["override-first", "override-second"])
def test_override_true_wins_whichever_registers_first(fake, override_first):
    plain = register_source("'shared', 'collections:OrderedDict', description='Plain.'")
    overriding = register_source("'shared', 'collections:Counter', description='Override.', override=True")
    names = ("a-plugin", "b-plugin")
    sources = (overriding, plain) if override_first else (plain, overriding)
    for distribution, source in zip(names, sources):
        stem = distribution.replace("-", "_")
        fake.add(distribution, {stem: source}, {"shared": f"{stem}:register"})
    registry = fake.registry()
    assert registry.get("shared").description == "Override."
    assert registry.problems() == []


def test_a_plugin_can_override_a_built_in_name(fake):
    source = register_source("'single_device', 'collections:Counter', description='Mine.', override=True")
    fake.add("override-plugin", {"override": source}, {"single_device": "override:register"})
    registry = fake.registry(_builtins)
    assert registry.get("single_device").distribution == "override-plugin"


def test_a_plugin_reusing_a_built_in_name_without_override_is_a_conflict(fake):
    source = register_source("'single_device', 'collections:Counter', description='Mine.'")
    fake.add("clash-plugin", {"clash": source}, {"single_device": "clash:register"})
    registry = fake.registry(_builtins)
    with pytest.raises(ValueError, match=f"both clash-plugin and {BUILTIN_DISTRIBUTION}"):
        registry.get("single_device")


def test_one_distribution_registering_a_name_twice_is_recorded(fake):
    line = "'twice', 'collections:OrderedDict', description='x'"
    fake.add("twice-plugin", {"twice": register_source(line, line)}, {"twice": "twice:register"})
    registry = fake.registry()
    assert registry.names() == []
    assert "registers the strategy 'twice' twice" in registry.problems()[0].error


# -- core version ---------------------------------------------------------------------------


def test_a_plugin_requiring_another_stratagem_version_is_refused_naming_both_versions(fake):
    marker = register_source("'too_new', 'collections:OrderedDict', description='x'")
    fake.add("future-plugin", {"future": marker}, {"too_new": "future:register"}, requires=["stratagem>=99"])
    registry = fake.registry()
    assert registry.names() == []
    [problem] = registry.problems()
    assert problem.distribution == "future-plugin"
    assert "stratagem>=99" in problem.error
    assert f"stratagem {CORE_VERSION} is installed" in problem.error
    assert fake.module_name("future") not in sys.modules, "a refused plugin's module must not be imported"


def test_a_plugin_whose_stratagem_range_fits_is_loaded(fake):
    fake.add(
        "fitting-plugin",
        {"fitting": _GOOD},
        {"good": "fitting:register"},
        requires=[f"stratagem>={CORE_VERSION},<99", "requests>=2; extra == 'web'"],
    )
    assert fake.registry().names() == ["good"]


# -- unknown names and requirements ---------------------------------------------------------


def test_an_unknown_name_lists_close_matches_and_the_registered_names(fake):
    source = register_source(
        "'ddp', 'collections:OrderedDict', description='x'", "'ddp_spawn', 'collections:OrderedDict', description='x'"
    )
    fake.add("ddp-like", {"ddp": source}, {"ddp": "ddp:register"})
    registry = fake.registry()
    expected = r"Unknown strategy 'dpp'\. Did you mean [^?]*'ddp'.*Registered strategy names: ddp, ddp_spawn\."
    with pytest.raises(ValueError, match=expected):
        registry.get("dpp")


def test_an_unknown_first_party_name_gives_the_pip_install_command(fake, monkeypatch):
    real_version = metadata.version

    def version_without_deepspeed(name):
        if name == "stratagem-deepspeed":
            raise metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(metadata, "version", version_without_deepspeed)
    with pytest.raises(ValueError, match=r'provided by stratagem-deepspeed.*pip install "stratagem\[deepspeed\]"'):
        fake.registry(_builtins).get("deepspeed_stage_3")


def test_a_name_whose_requirement_is_missing_says_what_to_install(fake):
    source = register_source("'needs_it', 'collections:OrderedDict', description='x', requires='no-such-dist>=1.2'")
    fake.add("needy-plugin", {"needy": source}, {"needs_it": "needy:register"})
    registry = fake.registry()
    description = registry.describe("needs_it")
    assert not description.available
    assert "pip install 'no-such-dist>=1.2'" in (description.reason or "")
    with pytest.raises(ImportError, match=r"'needs_it' \(from needy-plugin\) needs no-such-dist>=1.2"):
        registry.create("needs_it")


def test_a_requirement_not_on_pypi_is_explained_by_the_registrations_install_hint_not_a_pip_command(fake):
    source = register_source(
        "'vendor', 'collections:OrderedDict', description='x', requires='vendor-sdk>=3', "
        "install='install the wheel that comes with the vendor SDK'"
    )
    fake.add("vendor-plugin", {"vendor": source}, {"vendor": "vendor:register"})
    registry = fake.registry()
    reason = registry.describe("vendor").reason or ""
    assert reason == "needs vendor-sdk>=3, which is not installed: install the wheel that comes with the vendor SDK"
    with pytest.raises(ImportError, match="install the wheel that comes with the vendor SDK") as refused:
        registry.create("vendor")
    assert "pip install" not in str(refused.value)


def test_an_empty_install_hint_is_refused_at_registration(fake):
    source = register_source("'vendor', 'collections:OrderedDict', description='x', requires='vendor-sdk', install=' '")
    fake.add("blank-plugin", {"blank": source}, {"vendor": "blank:register"})
    registry = fake.registry()
    assert "vendor" not in registry.names()
    assert any("install hint" in problem.error for problem in registry.problems())


def test_a_requirement_installed_at_a_too_old_version_names_the_installed_version(fake):
    source = register_source("'old', 'collections:OrderedDict', description='x', requires='pytest>=999'")
    fake.add("old-plugin", {"old": source}, {"old": "old:register"})
    reason = fake.registry().describe("old").reason or ""
    assert f"but pytest {metadata.version('pytest')} is installed" in reason


def test_a_required_module_not_on_the_import_path_makes_the_name_unavailable_even_in_a_plain_listing(fake):
    from stratagem.cli._listing import rows_of

    source = register_source(
        "'bridged', 'collections:OrderedDict', description='x', requires_module='no_such_vendor_bridge', "
        "install='it comes with the vendor software stack (https://vendor.example/install)'"
    )
    fake.add("bridge-plugin", {"bridge": source}, {"bridged": "bridge:register"})
    registry = fake.registry()
    expected = (
        "needs the module no_such_vendor_bridge, which is not installed: it comes with the vendor software stack "
        "(https://vendor.example/install)"
    )
    assert registry.describe("bridged").reason == expected
    (row,) = [row for row in rows_of(registry, check=False) if row["name"] == "bridged"]
    assert (row["available"], row["reason"]) == (False, expected)
    with pytest.raises(ImportError, match=r"'bridged' \(from bridge-plugin\) needs the module no_such_vendor_bridge"):
        registry.create("bridged")


def test_a_required_module_on_the_import_path_is_found_without_running_it(fake, tmp_path, monkeypatch):
    (tmp_path / "vendor_bridge_probe.py").write_text("raise SystemExit('the vendor bridge must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = register_source(
        "'bridged', 'collections:OrderedDict', description='x', requires_module='vendor_bridge_probe'"
    )
    fake.add("bridge-plugin", {"bridge": source}, {"bridged": "bridge:register"})
    registry = fake.registry()
    assert registry.get("bridged").missing_requirement() is None
    assert registry.describe("bridged").available
    assert "vendor_bridge_probe" not in sys.modules


@pytest.mark.parametrize(
    ("requires", "reason"),
    [
        ("no-such-dist>=1", "needs no-such-dist>=1, which is not installed: pip install 'no-such-dist>=1'"),
        ("pytest", "needs the module no_such_vendor_bridge, which is not installed: from the vendor"),
    ],
    ids=["distribution missing", "module missing"],
)
def test_with_a_required_module_the_install_hint_is_for_the_module_and_a_missing_distribution_gets_pip(
    fake, requires, reason
):
    source = register_source(
        f"'bridged', 'collections:OrderedDict', description='x', requires={requires!r}, "
        "requires_module='no_such_vendor_bridge', install='from the vendor'"
    )
    fake.add("bridge-plugin", {"bridge": source}, {"bridged": "bridge:register"})
    assert fake.registry().describe("bridged").reason == reason


@pytest.mark.parametrize("module", ["vendor.torch", "", "not a name", 3])
def test_a_required_module_that_is_not_a_top_level_name_is_refused_at_registration(fake, module):
    source = register_source(f"'bridged', 'collections:OrderedDict', description='x', requires_module={module!r}")
    fake.add("dotted-plugin", {"dotted": source}, {"bridged": "dotted:register"})
    registry = fake.registry()
    assert "bridged" not in registry.names()
    assert any("must be a top-level module name" in problem.error for problem in registry.problems())


# -- create ---------------------------------------------------------------------------------


_TARGET = """
class Widget:
    def __init__(self, size=1, *, colour="red"):
        self.size = size
        self.colour = colour
"""


def test_create_applies_registered_defaults_then_options(fake):
    source = register_source(
        f"'widget', '{fake.module_name('widgets')}:Widget', description='x'",
        f"'big_widget', '{fake.module_name('widgets')}:Widget', description='x', defaults={{'size': 10}}",
    )
    fake.add("widget-plugin", {"widgets": _TARGET, "register_widgets": source}, {"w": "register_widgets:register"})
    registry = fake.registry()
    assert registry.create("widget").size == 1
    assert registry.create("big_widget").size == 10
    created = registry.create("big_widget", size=3, colour="blue")
    assert (created.size, created.colour) == (3, "blue")


def test_create_rejects_unknown_options_listing_the_accepted_ones(fake):
    source = register_source(f"'widget', '{fake.module_name('widgets')}:Widget', description='x'")
    fake.add("widget-plugin", {"widgets": _TARGET, "register_widgets": source}, {"w": "register_widgets:register"})
    with pytest.raises(TypeError, match=r"'widget' does not accept option\(s\) 'shape'. Accepted: colour, size\."):
        fake.registry().create("widget", shape="round")


# -- laziness -------------------------------------------------------------------------------


def test_discovery_does_not_import_lazy_targets_until_used(fake):
    target_module = fake.module_name("heavy_backend")
    source = register_source(f"'heavy', '{target_module}:Widget', description='x'")
    fake.add("lazy-plugin", {"heavy_backend": _TARGET, "light": source}, {"heavy": "light:register"})
    registry = fake.registry()
    assert "heavy" in registry
    assert registry.names() == ["heavy"]
    assert registry.get("heavy").target == f"{target_module}:Widget"
    assert registry.problems() == []
    assert target_module not in sys.modules
    registry.create("heavy")
    assert target_module in sys.modules


def test_discovery_runs_on_first_use_and_only_once(fake):
    counting = "calls = []\n\ndef register(registry):\n    calls.append(1)\n"
    counting += "    registry.register('counted', 'collections:OrderedDict', description='x')\n"
    fake.add("counting-plugin", {"counting": counting}, {"counted": "counting:register"})
    registry = fake.registry()
    assert fake.module_name("counting") not in sys.modules
    registry.names()
    registry.names()
    assert "counted" in registry
    assert sys.modules[fake.module_name("counting")].calls == [1]
