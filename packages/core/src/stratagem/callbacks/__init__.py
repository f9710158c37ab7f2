"""Callbacks: code that runs at points of the Trainer's loops."""

from stratagem.callbacks.callback import Callback
from stratagem.callbacks.early_stopping import EarlyStopping
from stratagem.callbacks.lr_monitor import LearningRateMonitor
from stratagem.callbacks.model_checkpoint import ModelCheckpoint
from stratagem.callbacks.model_summary import ModelSummary
from stratagem.callbacks.preemption import Preemption
from stratagem.callbacks.progress_bar import ProgressBar
from stratagem.callbacks.throughput_monitor import ThroughputMonitor, measure_flops

__all__ = [
    "Callback",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "Preemption",
    "ProgressBar",
    "ThroughputMonitor",
    "measure_flops",
]
