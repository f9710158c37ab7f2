import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from stratagem import registry
from stratagem.cli.main import SUBCOMMANDS, Subcommand, main
from stratagem.registry import PluginProblem

_SCHEDULER_VARIABLES = ("SLURM_NTASKS", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    for name in [*_SCHEDULER_VARIABLES, "LSB_JOBID", "KUBERNETES_PORT"]:
        monkeypatch.delenv(name, raising=False)


def _json_of(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_strategies_table_lists_single_device_unchecked_and_says_how_to_check(capsys):
    assert main(["strategies"]) == 0
    output = capsys.readouterr().out
    lines = output.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "AVAILABLE", "DESCRIPTION"]
    assert any(line.split()[:3] == ["single_device", "stratagem", "?"] for line in lines)
    assert "Run with --check to import and check each one." in output


def test_strategies_check_says_single_device_is_available(capsys):
    assert main(["strategies", "--check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:3] == ["single_device", "stratagem", "yes"] for line in lines)
    assert not any("--check" in line for line in lines)


@pytest.mark.parametrize("command", ["strategies", "accelerators", "precisions", "environments"])
def test_every_listing_has_json_with_name_distribution_and_availability(capsys, command):
    rows = _json_of(capsys, command, "--json", "--check")
    assert rows
    for row in rows:
        assert {"name", "distribution", "description", "available", "reason"} <= set(row)
        assert row["available"] or row["reason"], f"{row['name']} is unavailable without a reason"


@pytest.mark.parametrize("command", ["strategies", "accelerators", "precisions", "environments"])
def test_a_plain_listing_imports_neither_torch_nor_any_target(command):
    code = textwrap.dedent(
        f"""
        import contextlib, io, json, sys
        from stratagem import registry
        from stratagem.cli.main import main
        with contextlib.redirect_stdout(io.StringIO()):
            main([{command!r}])
        targets = {{
            kind_registry.get(name).target_path.partition(":")[0]
            for kind_registry in registry.ALL
            for name in kind_registry.names()
            if name in kind_registry and kind_registry.get(name).target_path
        }}
        print(json.dumps(sorted(name for name in targets | {{"torch"}} if name in sys.modules)))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout.splitlines()[-1]) == []


def test_listing_json_keeps_the_types_of_option_values(capsys, monkeypatch):
    def register(kinds):
        defaults = {"stage": 2, "offload": True, "ratio": 0.5, "path": None, "name": "x", "kinds": frozenset({1})}
        kinds.register("typed", "collections:OrderedDict", description="Typed defaults.", defaults=defaults)

    monkeypatch.setattr(registry, "strategies", registry.Registry("strategy", "stratagem_test.none", register))
    for check in ([], ["--check"]):
        [row] = _json_of(capsys, "strategies", "--json", *check)
        assert row["defaults"] == {
            "stage": 2,
            "offload": True,
            "ratio": 0.5,
            "path": None,
            "name": "x",
            "kinds": "frozenset({1})",
        }


def test_a_plain_listing_marks_a_name_whose_requirement_is_missing_unavailable(capsys, monkeypatch):
    def register(kinds):
        kinds.register("needy", "collections:OrderedDict", description="x", requires="no-such-dist>=1")

    monkeypatch.setattr(registry, "strategies", registry.Registry("strategy", "stratagem_test.none", register))
    [row] = _json_of(capsys, "strategies", "--json")
    assert row["available"] is False
    assert "pip install 'no-such-dist>=1'" in row["reason"]


def test_accelerators_say_why_one_is_not_usable_here(capsys):
    rows = {row["name"]: row for row in _json_of(capsys, "accelerators", "--json", "--check")}
    assert rows["cpu"]["available"]
    assert rows["mps"]["available"] or rows["mps"]["reason"]
    assert main(["accelerators", "--check"]) == 0
    output = capsys.readouterr().out
    for name, row in rows.items():
        if not row["available"]:
            assert f"{name}: not available here: {row['reason']}" in output


def test_precisions_lists_the_built_in_precisions(capsys):
    names = {row["name"] for row in _json_of(capsys, "precisions", "--json")}
    assert {"32-true", "64-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true"} <= names


def test_environments_marks_local_as_selected_on_a_plain_machine(capsys):
    rows = {row["name"]: row for row in _json_of(capsys, "environments", "--json", "--check")}
    assert [name for name, row in rows.items() if row["selected"]] == ["local"]
    assert not rows["slurm"]["detected"]


def test_environments_marks_slurm_as_detected_and_selected_under_srun(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    rows = {row["name"]: row for row in _json_of(capsys, "environments", "--json", "--check")}
    assert rows["slurm"]["detected"]
    assert rows["slurm"]["selected"]
    assert rows["local"]["detected"]
    assert not rows["local"]["selected"]


def test_doctor_reports_versions_devices_environment_and_plugins(capsys):
    report = _json_of(capsys, "doctor", "--json")
    assert report["stratagem"] == metadata.version("stratagem")
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert report["torch"]["version"]
    assert report["accelerators"]["cpu"]["available"]
    assert report["accelerators"]["cpu"]["devices"] >= 1
    assert report["cluster_environment"]["name"] == "local"
    assert isinstance(report["plugins"], list)


def test_doctor_shows_every_plugin_problem_and_still_exits_zero(capsys, monkeypatch):
    problem = PluginProblem(
        group="stratagem.strategies",
        distribution="stratagem-broken-example",
        entry_point="broken = broken_example:register",
        error="RuntimeError: this plugin is broken on purpose",
        details="Traceback (most recent call last):\n  ...\nRuntimeError: this plugin is broken on purpose\n",
    )
    monkeypatch.setattr(registry.strategies, "problems", lambda: [problem])
    assert main(["doctor", "--tracebacks"]) == 0
    output = capsys.readouterr().out
    assert "problems: 1" in output
    assert "stratagem-broken-example [stratagem.strategies] broken = broken_example:register" in output
    assert "RuntimeError: this plugin is broken on purpose" in output
    assert "Traceback (most recent call last):" in output


def test_a_listing_points_to_doctor_when_plugins_failed(capsys, monkeypatch):
    problem = PluginProblem("stratagem.strategies", "broken-dist", "x = y:z", "ImportError: no")
    monkeypatch.setattr(registry.strategies, "problems", lambda: [problem])
    assert main(["strategies"]) == 0
    assert "1 plugin problem(s) in stratagem.strategies; `stratagem doctor` shows them." in capsys.readouterr().err


def test_doctor_reports_unreadable_scheduler_variables_instead_of_failing(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_PROCID", "not-a-number")
    assert main(["doctor"]) == 0
    assert "cannot be read: The environment variable SLURM_PROCID='not-a-number' is not valid; expected an integer" in (
        capsys.readouterr().out
    )


def test_help_lists_every_subcommand_including_those_of_other_packages(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    output = capsys.readouterr().out
    for name in ("strategies", "accelerators", "precisions", "environments", "doctor", "demo", "consolidate"):
        assert f"\n  {name} " in output


def test_a_listed_subcommand_whose_module_is_missing_fails_with_a_message(capsys, monkeypatch):
    monkeypatch.setitem(SUBCOMMANDS, "later", Subcommand("stratagem.cli.not_written_yet", "comes later"))
    assert main(["later"]) == 2
    error = capsys.readouterr().err
    assert "stratagem later: error: the 'later' command is not available" in error
    assert "Traceback" not in error


def test_a_value_error_from_a_subcommand_is_one_line_and_exit_status_two(capsys, monkeypatch, tmp_path):
    (tmp_path / "cli_refusing_subcommand.py").write_text(
        textwrap.dedent(
            """
            def add_arguments(parser):
                parser.add_argument("--strategy")

            def run(args):
                raise ValueError(f"strategy={args.strategy!r} is not valid")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(SUBCOMMANDS, "refuse", Subcommand("cli_refusing_subcommand", "always refuses"))
    assert main(["refuse", "--strategy", "dpp"]) == 2
    assert capsys.readouterr().err == "stratagem refuse: error: strategy='dpp' is not valid\n"


def test_no_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "usage: stratagem" in capsys.readouterr().err


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"stratagem {metadata.version('stratagem')}"


def test_help_imports_no_subcommand_module_and_not_torch():
    code = textwrap.dedent(
        """
        import contextlib, io, sys
        from stratagem.cli.main import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["--help"])
        print(sorted(name for name in sys.modules if name == "torch" or name.startswith("stratagem.cli.")))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "['stratagem.cli.main']"


def test_the_console_script_runs_as_installed():
    script = shutil.which("stratagem", path=os.path.dirname(sys.executable))
    assert script is not None, f"no 'stratagem' console script beside {sys.executable}; is stratagem installed?"
    result = subprocess.run([script, "strategies", "--json"], capture_output=True, text=True, timeout=120, check=True)
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["single_device"]["distribution"] == "stratagem"
