"""Lightning's spellings of the collectives' arguments (``reduce_op=``, torch's ``ReduceOp``), read into ours."""

from __future__ import annotations

from typing import Any, cast, get_args

from stratagem.strategies.strategy import ReduceOp

_SYNONYMS = {"avg": "mean", "average": "mean", "product": "prod"}


def reduce_operation(op: Any, reduce_op: Any) -> ReduceOp:
    """The operation ``reduce`` was asked for: ``op``, or Lightning's ``reduce_op`` (a name or a
    ``torch.distributed.ReduceOp``), which means the same. ``ValueError`` for an unknown one."""
    if reduce_op is not None:
        if op != "mean":
            raise TypeError(
                f"reduce() got op={op!r} and reduce_op={reduce_op!r} (Lightning's name for op); pass only op=."
            )
        op = reduce_op
    name = getattr(op, "name", op)
    name = name.lower() if isinstance(name, str) else name
    name = _SYNONYMS.get(name, name)
    if name not in get_args(ReduceOp):
        raise ValueError(f"reduce(op={op!r}) is not supported; use 'sum', 'mean', 'max' or 'min'.")
    return cast(ReduceOp, name)
