"""Ranks that meet at the rendezvous check that they belong to one job, and the ranks of a restarted attempt
meet among themselves in a store that outlived the failed attempt (torchrun's agent store)."""

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from stratagem.environments.local import find_free_port
from stratagem.strategies._process_group import RanksDisagreeError, RendezvousTimeoutError, join


def _join_in_threads(port: int, ranks: list[tuple[int, int, str]], **options) -> dict[int, object]:
    """Join as each ``(rank, world_size, layout)`` in its own thread; each one's store or error."""
    results: dict[int, object] = {}

    def run(index: int, rank: int, world_size: int, layout: str) -> None:
        try:
            results[index] = join(
                "127.0.0.1", port, rank, world_size, prefix="p", timeout=timedelta(seconds=20), layout=layout, **options
            )
        except Exception as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(index, *entry)) for index, entry in enumerate(ranks)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)
    for thread in threads:
        thread.join(timeout=30)
    return results


@pytest.mark.timeout(60)
def test_ranks_started_with_different_layouts_fail_at_once_naming_both_layouts_and_hosts():
    port = find_free_port()
    started = time.monotonic()
    results = _join_in_threads(
        port,
        [
            (0, 2, "num_nodes=2, devices=1 (world size 2)"),
            (1, 4, "num_nodes=2, devices=2 (world size 4)"),
        ],
    )
    assert time.monotonic() - started < 10  # well inside the 20 s join timeout
    for error in results.values():
        assert isinstance(error, RanksDisagreeError), error
        message = str(error)
        assert "rank 0 on host" in message
        assert "was started with num_nodes=2, devices=1 (world size 2)" in message
        assert "but rank 1 on host" in message
        assert "with num_nodes=2, devices=2 (world size 4)" in message
        assert "Start every node with the same num_nodes and devices" in message


@pytest.mark.timeout(60)
def test_a_rank_started_twice_fails_every_rank_naming_both_processes():
    port = find_free_port()
    layout = "num_nodes=2, devices=1 (world size 2)"
    results = _join_in_threads(port, [(0, 2, layout), (1, 2, layout), (1, 2, layout)])
    # The first rank 1 and rank 0 may have met before the second rank 1 came: those joined; the second did not.
    assert isinstance(results[2], RanksDisagreeError)
    assert "rank 1 was started twice: on " in str(results[2])


def _agent_store(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)


@pytest.mark.timeout(90)
def test_the_ranks_of_a_restarted_attempt_meet_among_themselves_in_a_store_the_failed_attempt_left():
    port = find_free_port()
    agent = _agent_store(port)
    layout = "num_nodes=2, devices=1 (world size 2)"
    first = _join_in_threads(port, [(0, 2, layout), (1, 2, layout)], store_outlives_workers=True)
    assert all(isinstance(store, dist.PrefixStore) for store in first.values()), first
    # The next attempt: new processes, the same prefix, the failed attempt's keys still there. Rank 1 comes first
    # and must not take the failed attempt's rank 0 for the new one.
    second = _join_in_threads(port, [(1, 2, layout), (0, 2, layout)], store_outlives_workers=True)
    assert all(isinstance(store, dist.PrefixStore) for store in second.values()), second
    assert second[0].add("joined", 0) == 2  # a fresh count: the first attempt's two joins are not in it
    second[0].set("probe", "second")
    assert second[1].get("probe") == b"second"
    assert not first[0].check(["probe"])
    del agent


@pytest.mark.timeout(60)
def test_a_rank_whose_rank_0_never_comes_in_an_outliving_store_fails_within_the_join_timeout():
    port = find_free_port()
    agent = _agent_store(port)
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError, match="rank 0 of this attempt did not answer within the join timeout"):
        join("127.0.0.1", port, 1, 2, prefix="p", timeout=timedelta(seconds=2), store_outlives_workers=True)
    assert time.monotonic() - started < 6
    del agent
