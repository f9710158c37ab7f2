import pytest
import torch
import torch.distributed as dist

from stratagem.testing import DistributedWorkers, WorkerError

pytestmark = pytest.mark.distributed


def _rank_sum():
    tensor = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(tensor)
    return dist.get_rank(), tensor.item()


def _fail_on_rank_one():
    if dist.get_rank() == 1:
        raise RuntimeError("boom on purpose")
    return "fine"


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2) as pool:
        yield pool


def test_run_returns_each_ranks_result_in_rank_order(workers):
    assert workers.run(_rank_sum) == [(0, 3.0), (1, 3.0)]


def test_failure_names_the_rank_and_the_next_run_gets_fresh_workers(workers):
    with pytest.raises(WorkerError, match=r"rank\(s\) \[1\]") as caught:
        workers.run(_fail_on_rank_one)
    assert "boom on purpose" in str(caught.value)
    assert workers.run(_rank_sum) == [(0, 3.0), (1, 3.0)]
