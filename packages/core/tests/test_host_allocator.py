"""Freed tensors' memory goes back to the system at once after release_freed_host_memory (glibc only)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from stratagem.strategies import release_freed_host_memory
from stratagem.strategies.host_allocator import glibc

pytestmark = pytest.mark.timeout(120)


# Frees every other 4 MiB tensor of 64 while the rest stay alive, the way a training step frees its
# temporaries between tensors it keeps, and prints how much of the freed 128 MiB the process still holds.
FRAGMENTED_FREE = textwrap.dedent(
    """
    import sys, torch
    from stratagem.strategies import release_freed_host_memory

    def resident():
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    if sys.argv[1] == "release":
        assert release_freed_host_memory()
    # Freeing one large block raises glibc's own threshold above 4 MiB, as a first step does.
    block = torch.ones(8 << 18)
    del block
    tensors = [torch.ones(1 << 20) for _ in range(64)]
    before = resident()
    del tensors[::2]
    print((before - resident()) / (128 << 20))
    """
)


@pytest.mark.skipif(glibc() is None, reason="mallopt(M_MMAP_THRESHOLD) is glibc's")
def test_freed_blocks_go_back_to_the_system_only_after_the_release_is_asked_for():
    def returned_share(mode: str) -> float:
        result = subprocess.run(
            [sys.executable, "-c", FRAGMENTED_FREE, mode], capture_output=True, text=True, timeout=100
        )
        assert result.returncode == 0, result.stderr
        return float(result.stdout.split()[-1])

    assert returned_share("keep") < 0.1
    assert returned_share("release") > 0.9


@pytest.mark.parametrize("threshold", [0, -1, 1.5, True, "1M", 1 << 40])
def test_a_threshold_that_is_not_a_positive_byte_count_is_refused(threshold):
    with pytest.raises(ValueError, match="threshold_bytes"):
        release_freed_host_memory(threshold)
