"""A broken plugin is recorded with its distribution and entry point, and never stops a run that does not use it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from fake_plugins import register_source
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem import registry
from stratagem.cli.main import main
from stratagem.connector import detect_environment
from stratagem.environments import LocalEnvironment
from stratagem.registry import PluginError, Registry, _builtins

STRATEGY = "stratagem.strategies.strategy:Strategy"
ENVIRONMENT = "stratagem.environments.cluster_environment:ClusterEnvironment"
_GOOD = register_source("'good', 'stratagem.strategies.single_device:SingleDeviceStrategy', description='Good.'")
_EXITS_ON_IMPORT = "import sys\nsys.exit('plugin exits on import')\n" + _GOOD


def _builtins_once(registry):
    registry.register("single_device", "collections:OrderedDict", description="Built in.")


def _strategies_with(fake, monkeypatch):
    """``registry.strategies`` replaced by one that reads the built-ins and this test's fake plugins."""
    strategies = Registry("strategy", fake.group, _builtins.register_strategies, interface=STRATEGY)
    monkeypatch.setattr(registry, "strategies", strategies)
    return strategies


def _environments_with(fake, monkeypatch):
    group = fake.group.replace(".strategies", ".environments")
    environments = Registry("environment", group, _builtins.register_environments, interface=ENVIRONMENT)
    monkeypatch.setattr(registry, "environments", environments)
    monkeypatch.setattr(registry, "ALL", (*[r for r in registry.ALL if r.kind != "environment"], environments))
    return environments, group


def _fit_single_device(tmp_path):
    trainer = quiet_trainer(tmp_path, strategy="single_device", max_epochs=1)
    trainer.fit(ClassifierModule(), make_loader(num_samples=16))
    return trainer


# -- discovery ------------------------------------------------------------------------------


def test_a_plugin_calling_sys_exit_on_import_is_recorded_and_the_others_still_register(fake):
    fake.add("exiting-plugin", {"exiting": _EXITS_ON_IMPORT}, {"exiting": "exiting:register"})
    fake.add("good-plugin", {"good": _GOOD}, {"good": "good:register"})
    strategies = fake.registry(_builtins_once)
    assert strategies.names() == ["good", "single_device"]
    [problem] = strategies.problems()
    assert (problem.distribution, problem.stage) == ("exiting-plugin", "load")
    assert problem.entry_point == f"exiting = {fake.module_name('exiting')}:register"
    assert problem.error == "SystemExit: plugin exits on import"


def test_sys_exit_inside_register_rolls_back_what_it_registered(fake):
    source = register_source("'half_done', 'collections:OrderedDict', description='x'") + "    raise SystemExit(3)\n"
    fake.add("exiting-plugin", {"exiting": source}, {"exiting": "exiting:register"})
    strategies = fake.registry(_builtins_once)
    assert strategies.names() == ["single_device"]
    [problem] = strategies.problems()
    assert (problem.error, problem.stage, problem.names) == ("SystemExit: 3", "register", ("half_done",))


def test_discovery_interrupted_by_ctrl_c_starts_again_and_registers_built_ins_once(fake):
    source = "calls = []\n\ndef register(registry):\n    calls.append(1)\n    if len(calls) == 1:\n"
    source += (
        "        raise KeyboardInterrupt\n    registry.register('late', 'collections:OrderedDict', description='x')\n"
    )
    fake.add("interrupted-plugin", {"interrupted": source}, {"late": "interrupted:register"})
    strategies = fake.registry(_builtins_once)
    with pytest.raises(KeyboardInterrupt):
        strategies.names()
    assert strategies.names() == ["late", "single_device"]
    assert strategies.problems() == []


def test_a_register_function_asking_for_names_while_discovery_runs_does_not_register_built_ins_twice(fake):
    source = "def register(registry):\n    registry.names()\n"
    source += "    registry.register('curious', 'collections:OrderedDict', description='x')\n"
    fake.add("curious-plugin", {"curious": source}, {"curious": "curious:register"})
    strategies = fake.registry(_builtins_once)
    assert strategies.names() == ["curious", "single_device"]
    assert strategies.problems() == []


def test_an_entry_point_naming_a_class_says_it_needs_a_register_function(fake):
    fake.add("class-plugin", {"classy": "class MyStrategy:\n    pass\n"}, {"mine": "classy:MyStrategy"})
    [problem] = fake.registry().problems()
    path = f"{fake.module_name('classy')}:MyStrategy"
    assert problem.distribution == "class-plugin"
    assert f"names the class {path}, not a register(registry) function" in problem.error
    assert f"registry.register('<name>', {path!r}, description='...')" in problem.error


def test_an_entry_point_naming_a_function_of_the_wrong_shape_is_recorded(fake):
    fake.add("shape-plugin", {"shape": "def register():\n    pass\n"}, {"shape": "shape:register"})
    [problem] = fake.registry().problems()
    assert "cannot be called as register(registry)" in problem.error


# -- targets --------------------------------------------------------------------------------


def _target_plugin(fake, target_source):
    """A plugin registering ``broken`` with the target ``Target`` in a module of ``target_source``
    (no module at all when ``None``), and ``good``."""
    modules = {"register_broken": register_source(f"'broken', '{fake.module_name('target')}:Target', description='x'")}
    if target_source is not None:
        modules["target"] = target_source
    fake.add("target-plugin", modules, {"broken": "register_broken:register"})
    fake.add("good-plugin", {"good": _GOOD}, {"good": "good:register"})
    return fake.registry(interface=STRATEGY)


@pytest.mark.parametrize(
    ("target_source", "defect"),
    [
        (None, "raised ModuleNotFoundError: No module named '{module}'"),
        ("import sys\nsys.exit(7)\n", "raised SystemExit: 7"),
        ("class Target:\n    pass\n", "is not a subclass of stratagem.strategies.strategy.Strategy"),
        (
            "from stratagem.strategies import Strategy\n\nclass Target(Strategy):\n    pass\n",
            "leaves abstract method(s) unimplemented: all_gather, barrier, broadcast, launcher",
        ),
    ],
    ids=["missing-module", "exits-on-import", "not-a-strategy", "abstract"],
)
def test_a_target_that_cannot_be_used_is_a_problem_naming_the_plugin_and_does_not_stop_others(
    fake, target_source, defect
):
    strategies = _target_plugin(fake, target_source)
    defect = defect.format(module=fake.module_name("target"))
    assert strategies.problems() == [], "targets are imported only when used or checked"
    strategies.check_targets()
    [problem] = strategies.problems()
    assert (problem.distribution, problem.stage) == ("target-plugin", "target")
    assert problem.entry_point == f"broken = {fake.module_name('register_broken')}:register"
    assert defect in problem.error
    with pytest.raises(PluginError, match=r"The strategy 'broken' from target-plugin \(broken = .*cannot be used"):
        strategies.create("broken")
    assert not strategies.describe("broken").available
    assert defect in (strategies.describe("broken").reason or "")
    assert type(strategies.create("good")).__name__ == "SingleDeviceStrategy"
    assert len(strategies.problems()) == 1, "the same failure is recorded once"


def test_is_available_raising_makes_the_name_unavailable_and_is_recorded(fake):
    target = textwrap.dedent(
        """
        class Target:
            @staticmethod
            def is_available():
                raise SystemExit("probing the device exited")
        """
    )
    strategies = _target_plugin(fake, target)
    strategies.interface = None
    description = strategies.describe("broken")
    assert not description.available
    assert description.reason == "strategy 'broken': is_available() raised SystemExit: probing the device exited"
    [problem] = strategies.problems()
    assert (problem.distribution, problem.stage) == ("target-plugin", "call")


# -- unknown names explained by problems ------------------------------------------------------


def test_a_name_rolled_back_says_so_instead_of_unknown(fake):
    source = register_source("'rolled', 'collections:OrderedDict', description='x'") + "    raise RuntimeError('no')\n"
    fake.add("rolling-plugin", {"rolling": source}, {"rolling": "rolling:register"})
    with pytest.raises(ValueError, match="'rolled'") as raised:
        fake.registry().get("rolled")
    message = str(raised.value)
    assert not message.startswith("Unknown")
    assert "The strategy 'rolled' would come from rolling-plugin (rolling = " in message
    assert "whose register function failed, so what it registered was rolled back: RuntimeError: no" in message


def test_a_name_of_a_plugin_refused_for_its_version_says_so(fake):
    fake.add("future-plugin", {"future": _GOOD}, {"futuristic": "future:register"}, requires=["stratagem>=99"])
    with pytest.raises(ValueError, match=r"'futuristic' would come from future-plugin .*which was refused: .*>=99"):
        fake.registry().get("futuristic")


def test_an_unknown_name_mentions_plugins_that_failed_to_load(fake):
    fake.add("broken-plugin", {"broken": "import not_a_module_anywhere\n"}, {"broken": "broken:register"})
    with pytest.raises(ValueError, match="'something_else'") as raised:
        fake.registry(_builtins_once).get("something_else")
    message = str(raised.value)
    assert message.startswith("Unknown strategy 'something_else'.")
    assert "Plugins that failed to load may provide it: broken-plugin (broken = " in message
    assert "ModuleNotFoundError" in message


# -- runs with a broken plugin installed -------------------------------------------------------


def test_a_sys_exit_strategy_plugin_leaves_single_device_training_and_other_names_working(fake, monkeypatch, tmp_path):
    fake.add("exiting-plugin", {"exiting": _EXITS_ON_IMPORT}, {"exiting": "exiting:register"})
    fake.add("good-plugin", {"good": _GOOD}, {"good": "good:register"})
    strategies = _strategies_with(fake, monkeypatch)
    trainer = _fit_single_device(tmp_path)
    assert trainer.global_step == 2
    assert type(registry.strategies.create("good")).__name__ == "SingleDeviceStrategy"
    [problem] = strategies.problems()
    assert (problem.distribution, problem.error) == ("exiting-plugin", "SystemExit: plugin exits on import")


_RAISING_DETECT = textwrap.dedent(
    """
    import os
    from stratagem.environments import LocalEnvironment

    class Flaky(LocalEnvironment):
        @staticmethod
        def detect():
            return os.environ["FLAKY_SCHEDULER_RANK"] == "0"
    """
)


def _raising_detect_plugin(fake, monkeypatch):
    environments, group = _environments_with(fake, monkeypatch)
    registration = register_source(f"'flaky', '{fake.module_name('flaky')}:Flaky', description='Raises in detect.'")
    fake.add(
        "flaky-plugin",
        {"flaky": _RAISING_DETECT, "register": registration},
        {"flaky": "register:register"},
        group=group,
    )
    monkeypatch.delenv("FLAKY_SCHEDULER_RANK", raising=False)
    for name in ("SLURM_NTASKS", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "LSB_JOBID"):
        monkeypatch.delenv(name, raising=False)
    return environments


def test_an_environment_whose_detect_raises_is_passed_over_with_a_warning_naming_the_plugin(fake, monkeypatch):
    environments = _raising_detect_plugin(fake, monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"The environment 'flaky' from flaky-plugin .*detect\(\) raised KeyError"):
        assert type(detect_environment()) is LocalEnvironment
    [problem] = environments.problems()
    assert (problem.distribution, problem.stage) == ("flaky-plugin", "call")
    assert problem.entry_point == f"flaky = {fake.module_name('register')}:register"
    assert problem.error == "environment 'flaky': detect() raised KeyError: 'FLAKY_SCHEDULER_RANK'"
    assert "Traceback" in problem.details


def test_single_device_trains_with_an_environment_plugin_whose_detect_raises(fake, monkeypatch, tmp_path):
    _raising_detect_plugin(fake, monkeypatch)
    with pytest.warns(RuntimeWarning, match="flaky-plugin"):
        trainer = _fit_single_device(tmp_path)
    assert trainer.global_step == 2


def test_doctor_and_environments_report_an_environment_whose_detect_raises(fake, monkeypatch, capsys):
    _raising_detect_plugin(fake, monkeypatch)
    assert main(["environments", "--check"]) == 0
    captured = capsys.readouterr()
    rows = {line.split()[0]: line.split() for line in captured.out.splitlines()[1:] if line.strip()}
    assert rows["local"][:5] == ["local", "stratagem", "yes", "yes", "yes"]
    assert rows["flaky"][:3] == ["flaky", "flaky-plugin", "no"]
    assert "flaky: not available here: environment 'flaky': detect() raised KeyError" in captured.out
    assert "flaky-plugin (flaky = " in captured.err

    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cluster_environment"]["name"] == "local"
    [problem] = [p for p in report["problems"] if p["distribution"] == "flaky-plugin"]
    assert problem["error"] == "environment 'flaky': detect() raised KeyError: 'FLAKY_SCHEDULER_RANK'"


def test_doctor_reports_a_missing_target_module_naming_the_plugin(fake, monkeypatch, capsys):
    missing = fake.module_name("never_written")
    source = register_source(f"'ghost', '{missing}:GhostStrategy', description='Its module does not exist.'")
    fake.add("ghost-plugin", {"ghost": source}, {"ghost": "ghost:register"})
    strategies = _strategies_with(fake, monkeypatch)
    monkeypatch.setattr(registry, "ALL", (strategies, *[r for r in registry.ALL if r.kind != "strategy"]))
    assert main(["doctor"]) == 0
    output = capsys.readouterr().out
    assert f"ghost-plugin [{fake.group}] ghost = {fake.module_name('ghost')}:register" in output
    assert f"strategy 'ghost': importing its target {missing}:GhostStrategy raised ModuleNotFoundError" in output


def test_doctor_reports_an_entry_point_group_stratagem_does_not_read(fake, capsys):
    fake.add("typo-plugin", {"typo": _GOOD}, {"typo": "typo:register"}, group="stratagem.strategy")
    assert main(["doctor", "--json"]) == 0
    [problem] = [p for p in json.loads(capsys.readouterr().out)["problems"] if p["distribution"] == "typo-plugin"]
    assert problem["group"] == "stratagem.strategy"
    assert problem["stage"] == "group"
    assert (
        "is not one stratagem reads, so this entry point is ignored; did you mean 'stratagem.strategies'?"
        in (problem["error"])
    )


def test_an_installed_plugin_exiting_on_import_stops_neither_the_listing_nor_a_trainer(fake, tmp_path):
    directory = fake.add(
        "exiting-plugin", {"exiting": _EXITS_ON_IMPORT}, {"exiting": "exiting:register"}, group="stratagem.strategies"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")])}
    listing = subprocess.run(
        [sys.executable, "-m", "stratagem.cli.main", "strategies"], capture_output=True, text=True, env=env, timeout=120
    )
    assert listing.returncode == 0, listing.stderr
    assert "single_device" in listing.stdout
    assert "exiting-plugin (exiting = " in listing.stderr
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from trainer_testing import ClassifierModule, make_loader, quiet_trainer
        trainer = quiet_trainer({str(tmp_path)!r}, strategy="single_device", max_epochs=1)
        trainer.fit(ClassifierModule(), make_loader(num_samples=16))
        from stratagem import registry
        print(trainer.global_step, [problem.error for problem in registry.strategies.problems()])
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "2 ['SystemExit: plugin exits on import']"


def test_choosing_a_strategy_whose_target_is_missing_is_one_error_line_naming_the_plugin(fake, monkeypatch, capsys):
    missing = fake.module_name("never_written")
    source = register_source(f"'ghost', '{missing}:GhostStrategy', description='Its module does not exist.'")
    fake.add("ghost-plugin", {"ghost": source}, {"ghost": "ghost:register"})
    _strategies_with(fake, monkeypatch)
    assert main(["demo", "--strategy", "ghost", "--max-steps", "1"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("stratagem demo: error: The strategy 'ghost' from ghost-plugin (ghost = ")
    assert f"importing its target {missing}:GhostStrategy raised ModuleNotFoundError" in error
    assert "Traceback" not in error
