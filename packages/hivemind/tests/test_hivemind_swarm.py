"""Peers on localhost, each a process of its own, training one model together."""

from __future__ import annotations

import pytest
from swarm_peers import Peer, largest_difference, wait_for

pytestmark = pytest.mark.timeout(420)

STEP_DELAY = 2.0
"""Seconds each peer pauses after a step: slower than the swarm's progress reports, so that no peer ends a
collaborative epoch alone before the others' samples are known (hivemind's steps are meant to be long)."""


def _epochs_the_peers_agree_on(first: Peer, second: Peer) -> list[int]:
    """The collaborative epochs from the second on at which both peers held the same weights.

    Peers hold the same weights after every round of averaging that succeeds; a round that finds no group in
    time (a busy machine) leaves each peer with its own step, until a later round averages them again.
    """
    first_epochs, second_epochs = first.epochs(), second.epochs()
    common = sorted(epoch for epoch in set(first_epochs) & set(second_epochs) if epoch >= 2)
    return [epoch for epoch in common if largest_difference(first_epochs[epoch], second_epochs[epoch]) < 1e-6]


def test_two_peers_train_one_model_and_its_checkpoint_loads_into_single_device(tmp_path):
    first = Peer(tmp_path / "first", {"min_peers": 2}, steps=12, data_seed=1, step_delay=STEP_DELAY)
    second = Peer(
        tmp_path / "second",
        {"min_peers": 2, "initial_peers": first.join_address()},
        steps=12,
        data_seed=2,
        step_delay=STEP_DELAY,
    )
    results = [first.finish(), second.finish()]
    assert [result["max_peers"] for result in results] == [2, 2]
    # The joiner started from the first peer's weights, not its own initialisation.
    assert largest_difference(first.epochs()[0], second.epochs()[0]) == 0.0
    agreed = _epochs_the_peers_agree_on(first, second)
    assert len(agreed) >= 2, f"the peers held the same weights only at epochs {agreed}"
    # The scheduler (StepLR, gamma 0.9) steps per collaborative epoch, not per local step: at the last epoch it has
    # stepped that many times (hivemind may step once ahead while it catches up), far from the 12 of local steps.
    epochs = results[0]["epoch_at_end"]
    assert 0 < epochs < 11
    learning_rate = results[0]["learning_rates"][str(epochs)]
    assert 0.1 * 0.9 ** (epochs + 1) * (1 - 1e-6) <= learning_rate <= 0.1 * 0.9**epochs * (1 + 1e-6)

    import torch
    from peer import Regression, make_loader

    from stratagem import Trainer

    module = Regression()
    trainer = Trainer(strategy="single_device", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    [metrics] = trainer.validate(module, make_loader(3, 2), ckpt_path=results[0]["checkpoint"])
    assert torch.isfinite(torch.tensor(metrics["val_loss"]))
    assert largest_difference(module.state_dict(), first.epochs()[epochs]) == 0.0


def test_a_peer_that_joins_late_downloads_the_swarms_state(tmp_path):
    first = Peer(tmp_path / "first", {"min_peers": 2}, steps=16, data_seed=1, step_delay=STEP_DELAY)
    address = first.join_address()
    joining = {"min_peers": 2, "initial_peers": address}
    second = Peer(tmp_path / "second", joining, steps=16, data_seed=2, step_delay=STEP_DELAY)
    wait_for(lambda: first.progress().get("epoch", 0) >= 2, 240, "the first two peers to reach epoch 2")
    late = Peer(tmp_path / "late", joining, steps=4, data_seed=3, step_delay=STEP_DELAY)
    joined = late.finish()
    first.finish()
    second.finish()
    start = joined["epoch_at_start"]
    assert start >= 2, f"the late peer started at epoch {start}, not the swarm's"
    # It holds the swarm's weights of that epoch, not the initial ones: what a peer serves may already include
    # the round of averaging under way, so the match is close rather than bitwise.
    held = late.epochs()[start]
    closest = min(largest_difference(held, peer.epochs()[start]) for peer in (first, second))
    from_start = largest_difference(held, first.epochs()[0])
    assert closest < 1e-2, f"the late peer's weights differ from the swarm's at epoch {start} by {closest}"
    assert from_start > 10 * closest, f"the late peer holds weights {from_start} from the initial ones"


def test_a_peer_that_dies_does_not_stop_the_others(tmp_path):
    first = Peer(tmp_path / "first", {"min_peers": 3}, steps=14, data_seed=1, step_delay=STEP_DELAY)
    address = first.join_address()
    others = [
        Peer(
            tmp_path / name, {"min_peers": 3, "initial_peers": address}, steps=14, data_seed=seed, step_delay=STEP_DELAY
        )
        for name, seed in (("second", 2), ("doomed", 3))
    ]
    doomed = others[1]
    wait_for(lambda: doomed.progress().get("epoch", 0) >= 2, 240, "the three peers to reach epoch 2")
    epoch_at_death = doomed.progress()["epoch"]
    doomed.kill()
    survivors = [first.finish(), others[0].finish()]
    assert all(result["max_peers"] == 3 for result in survivors)
    assert all(result["epoch_at_end"] > epoch_at_death + 1 for result in survivors), survivors
