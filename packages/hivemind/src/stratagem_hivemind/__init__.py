"""stratagem-hivemind: collaborative training over a hivemind swarm, as a stratagem strategy.

Importing this package is cheap and never imports hivemind: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem_hivemind.options import SwarmOptions
    from stratagem_hivemind.strategy import HivemindStrategy

__all__ = ["HivemindStrategy", "SwarmOptions", "__version__"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "HivemindStrategy": "stratagem_hivemind.strategy",
        "SwarmOptions": "stratagem_hivemind.options",
    },
    "stratagem-hivemind",
)
