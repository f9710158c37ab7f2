"""Whether Habana's software is here: the one question every hpu name's availability comes down to.

It looks for the ``habana_frameworks`` module and nothing more: no import of Habana's bridge, no ``hl-smi``,
no card is probed, so listing names stays fast and works on any machine. Tests patch :func:`habana_problem`.
"""

from __future__ import annotations

import importlib.util

HABANA_INSTALL_DOCS = "https://docs.habana.ai/en/latest/Installation_Guide/index.html"


def habana_problem() -> str | None:
    """Why Habana's PyTorch bridge cannot be used here (with where to get it), or ``None`` when it is installed."""
    if importlib.util.find_spec("habana_frameworks") is None:
        return (
            "Habana's PyTorch bridge (the habana_frameworks module) is not installed; it is not on PyPI: install "
            f"Intel Gaudi's software stack ({HABANA_INSTALL_DOCS})"
        )
    return None
