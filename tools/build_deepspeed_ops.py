"""Compile the DeepSpeed ops the tests use, before the tests start, and say how long each took.

DeepSpeed compiles an op the first time a run needs it (minutes each from an empty cache), which
would otherwise land inside whichever test happens to need it first and count against its timeout.
The results are cached in ``TORCH_EXTENSIONS_DIR``, so a second call returns at once.
"""

from __future__ import annotations

import time

# The CPU accelerator's names: shared-memory collectives (every init_distributed), the CPU Adam of
# optimizer offload, the Adam a config's "optimizer" section builds, and NVMe offload's async I/O.
OPS = ("ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder", "AsyncIOBuilder")


def main() -> None:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    for name in OPS:
        started = time.perf_counter()
        accelerator.create_op_builder(name).load(verbose=False)
        print(f"deepspeed op {name}: ready in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
