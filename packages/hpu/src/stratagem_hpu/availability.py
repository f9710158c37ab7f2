"""Whether Habana's software is here: the one question every hpu name's availability comes down to.

It looks for the ``habana_frameworks`` module and nothing more (as the registry does for the names, which
declare it as their ``requires_module``): no import of Habana's bridge, no ``hl-smi``,
no card is probed, so listing names stays fast and works on any machine. Tests patch :func:`habana_problem`.
"""

from __future__ import annotations

import importlib.util

HABANA_MODULE = "habana_frameworks"
"""The top-level module of Habana's PyTorch bridge, which every hpu name declares it needs (``requires_module``)."""
HABANA_INSTALL_DOCS = "https://docs.habana.ai/en/latest/Installation_Guide/index.html"
HABANA_INSTALL = f"Habana's PyTorch bridge is not on PyPI: install Intel Gaudi's software stack ({HABANA_INSTALL_DOCS})"


def habana_problem() -> str | None:
    """Why Habana's PyTorch bridge cannot be used here (with where to get it), or ``None`` when it is installed."""
    if importlib.util.find_spec(HABANA_MODULE) is None:
        return f"needs the module {HABANA_MODULE}, which is not installed: {HABANA_INSTALL}"
    return None
