"""`import stratagem` stays light; its cost against torch is measured by tools/bench, not here."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[3]
BACKENDS = ("stratagem_ddp", "stratagem_fsdp", "stratagem_deepspeed", "stratagem_xla", "stratagem_hpu", "stratagem_ipu")
HEAVY = ("deepspeed", "torch_xla", "habana_frameworks", "poptorch")


def _modules_after(code):
    """The top-level modules imported by a fresh interpreter running ``code``."""
    script = code + "\nimport json, sys\nprint(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_import_stratagem_imports_neither_torch_nor_any_backend():
    imported = _modules_after("import stratagem")
    assert "stratagem" in imported
    assert not imported & {"torch", *BACKENDS, *HEAVY}


def test_discovering_every_plugin_imports_no_heavy_backend():
    code = textwrap.dedent(
        """
        from stratagem import registry
        for kind_registry in registry.ALL:
            for name in kind_registry.names():
                kind_registry.get(name)
            kind_registry.problems()
        """
    )
    assert not _modules_after(code) & set(HEAVY)


def test_the_benchmark_harness_lists_the_import_benchmark():
    result = subprocess.run(
        [sys.executable, str(REPOSITORY / "tools" / "bench" / "run.py"), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "import" in [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
