"""``Module.load_pretrained`` under fsdp: a module built on the meta device takes safetensors weights, each rank
reading only the slices of its own shards."""

import pytest
import torch
from fsdp_testing import Block, Net, make_strategy

from stratagem.checkpoint_io.safetensors_export import write_safetensors_directory
from stratagem.checkpoint_io.safetensors_import import SafetensorsWeights
from stratagem.testing import DistributedWorkers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


class RecordingWeights(SafetensorsWeights):
    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.reads: dict[str, list[int]] = {}

    def read(self, key, index=None):
        tensor = super().read(key, index)
        self.reads[key] = list(tensor.shape)
        return tensor


def _load_into_meta_built_module(directory):
    strategy = make_strategy(auto_wrap_policy={Block})
    with strategy.module_init_context():
        module = Net()
    # Rank 0 builds eagerly (its values are handed out at setup, then the files' overwrite them); the others
    # build on the meta device and only ever hold their shards.
    assert all(parameter.is_meta for parameter in module.parameters()) == (strategy.global_rank != 0)
    strategy.setup_module(module)
    with RecordingWeights(directory) as weights:
        strategy.load_pretrained(module, weights)
    return {"weights": strategy.module_full_state_dict(), "reads": weights.reads}


def test_each_rank_reads_only_its_shards_and_the_module_holds_the_files_weights(workers, tmp_path):
    torch.manual_seed(3)
    source = Net().state_dict()
    write_safetensors_directory(source, tmp_path / "pretrained", max_shard_size=500)
    [rank_0, rank_1] = workers.run(_load_into_meta_built_module, str(tmp_path / "pretrained"))
    assert rank_0["weights"].keys() == source.keys()
    for key, value in source.items():
        assert torch.equal(rank_0["weights"][key], value), key
    # Width 13 on 2 ranks: rows 0-6 on rank 0, 7-12 on rank 1, of every weight and bias.
    assert rank_0["reads"]["blocks.0.linear.weight"] == [7, 13]
    assert rank_1["reads"]["blocks.0.linear.weight"] == [6, 13]
    # out.bias has one element, all on rank 0: rank 1 holds an empty shard and reads nothing of it.
    assert rank_0["reads"]["out.bias"] == [1]
    assert "out.bias" not in rank_1["reads"]
