"""Precision plugins: how dtypes, autocast and gradient scaling wrap a strategy's steps."""

from stratagem.precision.mixed import MixedPrecision
from stratagem.precision.precision import Precision
from stratagem.precision.true_dtype import TruePrecision

__all__ = ["MixedPrecision", "Precision", "TruePrecision"]
