"""``stratagem plan --world-size 2`` beside two real gloo ranks of model_parallel: what each rank holds of the
parameters, the gradients and the optimizer's state after a real step is what the plan says, to 1%.
(``tools/bench/cluster_plan.py`` measures a 58M decoder on 2 and 4 processes, peak RSS included.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

import stratagem
from stratagem import registry
from stratagem.demo.llama import Block, Llama, LlamaModule, tensor_parallel_plan
from stratagem.planning.cluster import ClusterTarget, plan_cluster
from stratagem.planning.devices import device_spec
from stratagem.testing import DistributedWorkers
from stratagem_fsdp import ModelParallelStrategy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

CONFIG = {"dim": 64, "layers": 2, "heads": 8, "kv_heads": 4, "ffn_dim": 192, "vocab": 512, "context": 16}
BATCH = 2


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def _held_after_one_step(layout: dict[str, int]) -> dict[str, int]:
    strategy = stratagem.resolve(
        strategy=ModelParallelStrategy(**layout, auto_wrap_policy={Block}), accelerator="cpu", devices=2
    )
    assert isinstance(strategy, ModelParallelStrategy)
    strategy.setup_environment()
    module = LlamaModule("tiny", **CONFIG)
    torch.manual_seed(0)
    with strategy.module_init_context():
        model = Llama(module.config)
    if layout.get("tp", 1) > 1:
        tensor_parallel_plan(model, strategy.device_mesh["tp"])
    model = strategy.setup_module(model)
    [optimizer] = strategy.setup_optimizers([torch.optim.AdamW(model.parameters(), lr=1e-3)])
    tokens = torch.randint(
        0, CONFIG["vocab"], (BATCH, CONFIG["context"] + 1), generator=torch.Generator().manual_seed(1)
    )
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    strategy.backward(loss, optimizer)
    gradients = sum(_local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    strategy.optimizer_step(optimizer)
    state = [value for entry in optimizer.state.values() for value in entry.values() if isinstance(value, torch.Tensor)]
    return {
        "parameters": sum(_local_bytes(parameter) for parameter in model.parameters()),
        "gradients": gradients,
        # AdamW's step counters are 0-d tensors, not state per element.
        "optimizer_state": sum(_local_bytes(value) for value in state if value.dim() > 0),
    }


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


@pytest.mark.parametrize("layout", [{"tp": 2}, {"dp_shard": 2, "tp": 1}], ids=["tp=2", "dp_shard=2"])
def test_two_real_model_parallel_ranks_hold_the_model_state_the_plan_says(workers, layout):
    strategies = {"model_parallel": registry.strategies.create("model_parallel", auto_wrap_policy={Block})}
    target = ClusterTarget(2, 2, device_spec("h100-80gb"))
    plan = plan_cluster(LlamaModule("tiny", **CONFIG), strategies, target, batch_size=BATCH, seq_len=CONFIG["context"])
    full = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, **layout}
    [planned] = [candidate for candidate in plan.candidates if candidate.layout == full]
    for rank, held in enumerate(workers.run(_held_after_one_step, layout)):
        for part, planned_bytes in (
            ("parameters", planned.memory.parameters),
            ("gradients", planned.memory.gradients),
            ("optimizer_state", planned.memory.optimizer_state),
        ):
            assert held[part] == pytest.approx(planned_bytes, rel=0.01), (layout, rank, part)
