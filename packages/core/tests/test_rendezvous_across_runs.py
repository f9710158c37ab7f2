"""A script that runs several runs re-joins the same port each time: a rank that reached the last run's store just
before rank 0 closed it joins the next one rather than failing."""

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from stratagem.environments.local import find_free_port
from stratagem.strategies._process_group import join


@pytest.mark.timeout(60)
def test_a_rank_that_reached_the_last_runs_store_joins_the_next_one_once_rank_0_hosts_it():
    port = find_free_port()
    last_run = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    joined: dict[str, object] = {}

    def rank_1() -> None:
        try:
            joined["store"] = join(
                "127.0.0.1", port, rank=1, world_size=2, prefix="run-2", timeout=timedelta(seconds=30)
            )
        except Exception as error:
            joined["error"] = error

    thread = threading.Thread(target=rank_1)
    thread.start()
    time.sleep(1.0)  # rank 1 now waits in the last run's store for a rank 0 that is still tearing that run down
    del last_run
    rank_0 = join("127.0.0.1", port, rank=0, world_size=2, prefix="run-2", timeout=timedelta(seconds=30))
    thread.join(timeout=40)
    assert "error" not in joined, joined.get("error")
    assert rank_0.get("joined/1") == rank_0.get("joined/0")
    assert isinstance(joined["store"], dist.PrefixStore)
