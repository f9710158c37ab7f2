"""Delayed updates: hivemind steps its own optimizer on its own copy of the parameters, in the background."""

from __future__ import annotations

import pytest
import torch
from peer import FEATURES, Regression, make_loader

from stratagem import Trainer
from stratagem_hivemind import HivemindStrategy

pytestmark = pytest.mark.timeout(300)

LOCAL = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "matchmaking_time": 2.0, "averaging_timeout": 10.0}


class WithoutScheduler(Regression):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _trainer(tmp_path, max_steps=6):
    strategy = HivemindStrategy(
        delay_state_averaging=True, delay_optimizer_step=True, delay_grad_averaging=True, **LOCAL
    )
    return Trainer(
        strategy=strategy, max_steps=max_steps, default_root_dir=tmp_path, logger=False, enable_progress_bar=False
    )


def test_delayed_updates_train_and_save_the_optimizer_hivemind_steps(tmp_path):
    module = WithoutScheduler()
    before = {key: value.clone() for key, value in module.state_dict().items()}
    trainer = _trainer(tmp_path)
    trainer.fit(module, make_loader(0, 6))
    assert any(not torch.equal(before[key], value) for key, value in module.state_dict().items())
    checkpoint = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)
    [optimizer_state] = checkpoint["optimizers"]
    assert len(optimizer_state["state"]) == len(before), "the momentum of every parameter is saved"
    assert checkpoint["hivemind"]["epoch"] > 0

    reloaded = Regression()
    single = Trainer(strategy="single_device", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    single.validate(reloaded, make_loader(1, 1), ckpt_path=trainer.checkpoint_callback.best_model_path)
    assert all(torch.equal(reloaded.state_dict()[key], value) for key, value in module.state_dict().items())
    assert reloaded.net[0].weight.shape[1] == FEATURES

    resumed = _trainer(tmp_path / "resumed", max_steps=9)
    resumed.fit(WithoutScheduler(), make_loader(0, 9), ckpt_path=trainer.checkpoint_callback.best_model_path)
    continued = torch.load(resumed.checkpoint_callback.best_model_path, weights_only=True)
    assert resumed.global_step == 9
    assert continued["hivemind"]["epoch"] > checkpoint["hivemind"]["epoch"]


def test_delayed_updates_refuse_a_scheduler_from_configure_optimizers(tmp_path):
    with pytest.raises(ValueError, match=r"delay_optimizer_step=True\) steps an optimizer hivemind builds"):
        _trainer(tmp_path).fit(Regression(), make_loader(0, 6))
