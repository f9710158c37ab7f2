"""What the conformance kit runs through :class:`stratagem.Runtime`: the strategy in a user's own loop.

:func:`own_loop` is launched on every rank by the Runtime's launcher (so it is module-level, and what it gets and
returns travels between processes). It probes the Runtime's collectives, builds the kit's module in the strategy's
init context with each rank seeded differently, trains with the Runtime's ``backward``, optimizer ``step`` and
``no_backward_sync``, optionally resumes from a Trainer checkpoint and saves its own, and reports how the ranks
agree at the end. The checks in :mod:`stratagem.testing.conformance_checks` compare that with the Trainer's run.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

if TYPE_CHECKING:
    from stratagem.runtime import Runtime


def probe_runtime_collectives(runtime: Runtime) -> None:
    """Raise unless the Runtime's collectives give the documented results on this rank."""
    world, rank = runtime.world_size, runtime.global_rank
    value = torch.tensor([float(rank + 1)], device=runtime.device)
    expected = {"sum": world * (world + 1) / 2, "mean": (world + 1) / 2, "max": float(world), "min": 1.0}
    for op, want in expected.items():
        got = runtime.all_reduce({"value": value}, op=op)["value"].item()  # type: ignore[arg-type]
        if not math.isclose(got, want, rel_tol=1e-6):
            raise AssertionError(f"Runtime.all_reduce(op={op!r}) gave {got} on rank {rank}; expected {want}")
    gathered = runtime.all_gather([value])[0]
    if gathered.shape[0] != world or sorted(gathered.flatten().tolist()) != [float(r + 1) for r in range(world)]:
        raise AssertionError(f"Runtime.all_gather gave {gathered.tolist()} on rank {rank}")
    sent = runtime.broadcast({"from": rank}, src=0)
    if sent != {"from": 0}:
        raise AssertionError(f"Runtime.broadcast of an object gave {sent} on rank {rank}")
    runtime.barrier("conformance (own loop)")


def own_loop(
    runtime: Runtime,
    data: TensorDataset,
    batch_size: int,
    steps: int,
    accumulate: int,
    resume_from: str | None,
    resume_step: int,
    save_to: str | None,
    blocks: int,
) -> dict[str, Any]:
    """Train the kit's module (``blocks`` blocks) to optimizer step ``steps`` (``accumulate`` micro-batches each),
    from the checkpoint ``resume_from`` (saved at ``resume_step``) when given; save to ``save_to``; return how the
    ranks agree."""
    from stratagem.testing.conformance_checks import SEED, ConformanceModule, build_net, observe_ranks

    probe_runtime_collectives(runtime)
    # Before the module: an engine built with the optimizers is sized by the batch.
    loader = runtime.setup_dataloaders(DataLoader(data, batch_size=batch_size, shuffle=False))
    module = ConformanceModule(blocks)
    with runtime.init_module():
        # Different on every rank: only the strategy can make the ranks' weights agree.
        torch.manual_seed(SEED + runtime.global_rank)
        module.net = build_net(blocks)
    model = runtime.setup_module(module)
    optimizer = runtime.setup_optimizers(module.configure_optimizers())
    done = 0
    if resume_from is not None:
        runtime.load(resume_from, {"module": model, "optimizers": [optimizer]})
        done = resume_step
    for index, (features, targets) in enumerate(loader):
        if index < done * accumulate:
            continue
        last_of_window = (index + 1) % accumulate == 0
        with runtime.no_backward_sync(model, enabled=not last_of_window):
            loss = functional.mse_loss(model(features), targets)
            runtime.backward(loss / accumulate if accumulate > 1 else loss)
        if last_of_window:
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done == steps:
                break
    if save_to is not None:
        runtime.save(save_to, {"module": model, "optimizers": [optimizer]})
    return {"ranks": observe_ranks(runtime.strategy), "steps": done}
