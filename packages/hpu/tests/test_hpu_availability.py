"""Without Habana's software every hpu name is listed as unavailable with why, and nothing of Habana's is imported
or probed to find that out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import stratagem
from stratagem import registry
from stratagem_hpu import availability

HPU_STRATEGIES = ("hpu_single", "hpu_parallel", "hpu_ddp")


def _without_standin() -> dict[str, str]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        path for path in environment.get("PYTHONPATH", "").split(os.pathsep) if not path.endswith("standin")
    )
    return environment


def _listing(kind: str, *flags: str, standin: bool) -> dict[str, dict[str, object]]:
    completed = subprocess.run(
        [sys.executable, "-c", "import sys; from stratagem.cli.main import main; sys.exit(main())", kind, *flags],
        env=None if standin else _without_standin(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return {row["name"]: row for row in json.loads(completed.stdout)}


@pytest.mark.parametrize("flags", [(), ("--check",)], ids=["plain", "checked"])
def test_without_habanas_software_every_hpu_name_is_unavailable_with_the_reason_and_where_to_get_it(flags):
    strategies = _listing("strategies", "--json", *flags, standin=False)
    accelerators = _listing("accelerators", "--json", *flags, standin=False)
    precisions = _listing("precisions", "--json", *flags, standin=False)
    hpu_names = [name for name, row in strategies.items() if row["distribution"] == "stratagem-hpu"]
    assert set(HPU_STRATEGIES) <= set(hpu_names)
    for row in [*(strategies[name] for name in hpu_names), accelerators["hpu"], precisions["fp8"]]:
        assert row["available"] is False, row
        assert "habana_frameworks" in row["reason"]
        assert availability.HABANA_INSTALL_DOCS in row["reason"]


def test_with_the_standin_on_the_path_a_plain_listing_no_longer_calls_the_hpu_names_unavailable():
    strategies = _listing("strategies", "--json", standin=True)
    accelerators = _listing("accelerators", "--json", standin=True)
    for row in [*(strategies[name] for name in HPU_STRATEGIES), accelerators["hpu"]]:
        # None: not checked, as for every name a plain listing imports nothing of; --check says yes.
        assert (row["available"], row["reason"]) == (None, None), row
    checked = _listing("strategies", "--json", "--check", standin=True)
    assert all(checked[name]["available"] is True for name in HPU_STRATEGIES)


def test_listing_and_describing_the_hpu_names_imports_nothing_of_habanas():
    script = (
        "import sys\n"
        "from stratagem import registry\n"
        "for name in ('hpu_single', 'hpu_parallel', 'hpu_ddp'):\n"
        "    registry.strategies.describe(name)\n"
        "registry.accelerators.describe('hpu')\n"
        "registry.precisions.describe('fp8')\n"
        "print(sorted(m for m in sys.modules if m.startswith('habana_frameworks')))\n"
    )
    # With the stand-in on the path: Habana's modules are there to import, and still none is.
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def test_a_trainer_on_hpu_without_habanas_software_fails_at_construction_naming_what_is_missing(monkeypatch):
    monkeypatch.setattr(availability, "habana_problem", lambda: "habana_frameworks is not installed (patched)")
    with pytest.raises(
        ValueError, match=r"accelerator='hpu' is not available here: habana_frameworks is not installed"
    ):
        stratagem.Trainer(accelerator="hpu", devices=1, logger=False)


def test_without_habanas_software_the_strategies_and_fp8_describe_themselves_as_unavailable(monkeypatch):
    monkeypatch.setattr(availability, "habana_problem", lambda: "no Habana here (patched)")
    for kind, name in [*(("strategies", name) for name in HPU_STRATEGIES), ("precisions", "fp8")]:
        description = getattr(registry, kind).describe(name)
        assert not description.available
        assert description.reason == "no Habana here (patched)"


def test_with_habanas_software_the_accelerator_reports_cards_name_and_memory():
    from stratagem_hpu import HPUAccelerator

    assert registry.accelerators.describe("hpu").available
    accelerator = HPUAccelerator()
    assert accelerator.device_count() == 2
    assert accelerator.device_name() == "GAUDI2"
    assert {"Limit", "InUse", "MaxInUse", "NumAllocs"} <= set(accelerator.memory_stats())
    with pytest.raises(ValueError, match="asks for 3 hpu device"):
        accelerator.parse_devices(3)


def test_the_demo_without_habanas_software_says_what_is_missing_instead_of_a_traceback():
    completed = subprocess.run(
        [sys.executable, "-m", "stratagem.cli.main", "demo", "--strategy", "hpu_parallel", "--devices", "2"],
        env=_without_standin(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.startswith(
        "stratagem demo: The strategy 'hpu_parallel' (from stratagem-hpu) needs the module"
    )
    assert availability.HABANA_INSTALL_DOCS in completed.stderr
    assert "Traceback" not in completed.stderr
