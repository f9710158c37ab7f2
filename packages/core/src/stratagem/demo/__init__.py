"""The built-in demo: a small classifier trained on synthetic data (``stratagem demo``)."""

from stratagem.demo.data import demo_dataloaders, make_classification
from stratagem.demo.model import DemoModule

__all__ = ["DemoModule", "demo_dataloaders", "make_classification"]
