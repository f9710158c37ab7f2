"""The torch warnings DeepSpeed's own calls raise are ignored once DeepSpeed is imported; nothing else is."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from stratagem_deepspeed.environment import import_deepspeed


def _warnings_of(call) -> list[str]:
    # catch_warnings copies the filters in place; "always" goes last so that only an earlier filter can hide one.
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", append=True)
        call()
    return [f"{warning.category.__name__}: {warning.message}" for warning in caught]


def _deprecated_collectives() -> None:
    tensor = torch.zeros(2)
    for collective in (dist.all_gather_into_tensor, dist.reduce_scatter_tensor):
        with pytest.raises((ValueError, RuntimeError)):  # no process group: torch warns, then refuses
            collective(tensor, tensor)


def test_deepspeeds_deprecated_collective_warnings_are_ignored_once_deepspeed_is_imported():
    with warnings.catch_warnings():
        warnings.resetwarnings()  # as in a process that has not imported DeepSpeed yet
        before = _warnings_of(_deprecated_collectives)
        assert [line.split(":")[0] for line in before] == ["FutureWarning", "FutureWarning"]
        import_deepspeed()
        assert _warnings_of(_deprecated_collectives) == []


def test_the_same_message_from_elsewhere_and_other_warnings_still_reach_the_user():
    def others() -> None:
        message = "`torch.distributed.all_gather_into_tensor` is deprecated. Please use all_gather_single."
        warnings.warn_explicit(message, FutureWarning, "train.py", 3, module="train")
        warnings.warn_explicit(
            "`torch.distributed.broadcast` is deprecated.",
            FutureWarning,
            "c10d_logger.py",
            83,
            module="torch.distributed.c10d_logger",
        )
        warnings.warn("something else", UserWarning, stacklevel=1)

    with warnings.catch_warnings():
        warnings.resetwarnings()
        import_deepspeed()
        assert len(_warnings_of(others)) == 3
