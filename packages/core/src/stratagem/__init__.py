"""stratagem: choose how PyTorch training is distributed, by name.

Importing this package is cheap: the public names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratagem.exports import lazy_exports

if TYPE_CHECKING:
    from stratagem.connector import resolve
    from stratagem.module import Module
    from stratagem.runtime import Runtime
    from stratagem.trainer import Trainer
    from stratagem.trainer.rng import seed_everything

__all__ = ["Module", "Runtime", "Trainer", "__version__", "resolve", "seed_everything"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "resolve": "stratagem.connector",
        "Module": "stratagem.module",
        "Runtime": "stratagem.runtime.runtime",
        "Trainer": "stratagem.trainer",
        "seed_everything": "stratagem.trainer.rng",
    },
    "stratagem",
)
