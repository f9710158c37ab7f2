"""The Trainer and its loops."""

from stratagem.trainer.trainer import Trainer

__all__ = ["Trainer"]
