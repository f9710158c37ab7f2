"""ZeRO's buffer and window sizes on the CPU, fitted to the model where the config leaves them out.

DeepSpeed's defaults are sized for GPUs training billions of parameters, and on the CPU accelerator every one
of them is host memory of each process: stage 3 allocates its whole reduce bucket up front (2e8 elements, 800 MB
in fp32, with Lightning's default), keeps gathered parameters whose next use is within
``stage3_max_reuse_distance`` (1e9) elements instead of releasing them, and offloading the optimizer to NVMe
page-locks ``buffer_count`` buffers of the largest optimizer sub-group (``sub_group_size``, 1e9 elements: the
whole partition of any model below a billion parameters), and the optimizer's step over a sub-group makes
temporaries of its size. Sized to the largest parameter instead, a bucket
still moves whole parameters per collective (which is what amortises gloo's per-call cost) and the windows
hold a block or two of gathered parameters rather than the model.

Pure Python: nothing here imports deepspeed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from stratagem_deepspeed.config import zero_stage

GPU_BUCKET_ELEMENTS = 200_000_000
"""Lightning's default ``reduce_bucket_size`` and ``allgather_bucket_size``, kept off the CPU."""
MIN_CPU_BUCKET_ELEMENTS = 10_000_000
"""The smallest bucket on the CPU (40 MB in fp32): below it, collectives on small parameters get chatty."""
LIVE_BUCKETS = 2
"""``stage3_max_live_parameters`` in buckets: the block computing and the one being prefetched."""
DEEPSPEED_SUB_GROUP_ELEMENTS = 1_000_000_000
"""DeepSpeed's default ``sub_group_size``: the optimizer steps its partition in groups of this many elements."""


def cpu_bucket_elements(largest_parameter: int) -> int:
    """The bucket, prefetch and reuse sizes on the CPU: the largest parameter, at least
    ``MIN_CPU_BUCKET_ELEMENTS`` and at most the GPU default."""
    return min(GPU_BUCKET_ELEMENTS, max(int(largest_parameter), MIN_CPU_BUCKET_ELEMENTS))


def fitted_sizes(config: Mapping[str, Any], largest_parameter: int) -> dict[str, Any]:
    """``config`` (a copy) with the sizes it leaves out of ``zero_optimization`` fitted to a model whose
    largest parameter has ``largest_parameter`` elements, for a run on the CPU. Sizes the config sets stay."""
    bucket = cpu_bucket_elements(largest_parameter)
    defaults = {
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
        "stage3_prefetch_bucket_size": bucket,
        "stage3_max_reuse_distance": bucket,
        "stage3_max_live_parameters": LIVE_BUCKETS * bucket,
    }
    if zero_stage(config) == 3:
        # The step's temporaries, the gradient buffer and NVMe's page-locked swap buffers are each as large as
        # the largest sub-group.
        defaults["sub_group_size"] = bucket
    return _with_zero_defaults(config, defaults)


def gpu_sizes(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a copy) with Lightning's bucket sizes where it leaves them out: off the CPU they live in
    accelerator memory, where DeepSpeed's sizes are tuned for bandwidth."""
    return _with_zero_defaults(
        config, {"reduce_bucket_size": GPU_BUCKET_ELEMENTS, "allgather_bucket_size": GPU_BUCKET_ELEMENTS}
    )


def _with_zero_defaults(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    fitted = copy.deepcopy(dict(config))
    zero = fitted.setdefault("zero_optimization", {})
    for key, value in defaults.items():
        zero.setdefault(key, value)
    return fitted


def largest_parameter_elements(parameters: Iterable[Any]) -> int:
    """The most elements any one of ``parameters`` has (the full size of a ZeRO-3 partitioned one)."""
    return max((int(getattr(parameter, "ds_numel", 0) or parameter.numel()) for parameter in parameters), default=0)
