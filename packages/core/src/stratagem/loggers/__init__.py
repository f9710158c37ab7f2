"""Loggers: where the Trainer sends metrics."""

from stratagem.loggers.csv_logger import CSVLogger
from stratagem.loggers.logger import Logger
from stratagem.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]
