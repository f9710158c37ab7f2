"""FSDPStrategy as Lightning's FSDP pages use it: a single class as a policy, Lightning's older option and
enum spellings, and torch's ``wrap()`` inside ``configure_model``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fsdp_testing import Block, Net, build, global_batches, make_strategy, reference_run, train
from torch import nn
from torch.distributed._composable.contract import _get_registry
from torch.distributed.fsdp import FSDPModule, StateDictType
from torch.distributed.fsdp.wrap import wrap

from stratagem import Module, Trainer
from stratagem.testing import DistributedWorkers
from stratagem_fsdp import FSDPStrategy
from stratagem_fsdp.options import ModuleSelector
from stratagem_fsdp.wrapping import selected_units

STEPS = 3


@pytest.mark.parametrize("option", ["auto_wrap_policy", "activation_checkpointing_policy"])
def test_a_single_class_as_a_policy_means_the_set_of_that_class(option):
    net = Net(width=16, depth=2)
    single = ModuleSelector.from_option(option, Block)
    assert single == ModuleSelector.from_option(option, {Block})
    assert single is not None
    assert selected_units(net, single) == list(net.blocks)


@pytest.mark.parametrize("container", [nn.Sequential, nn.ModuleList, nn.ModuleDict])
@pytest.mark.parametrize("option", ["auto_wrap_policy", "activation_checkpointing_policy"])
def test_a_container_class_as_a_policy_is_refused_naming_the_layer_classes_instead(option, container):
    with pytest.raises(ValueError, match=rf"{option} names nn.{container.__name__}, a container class.*layer classes"):
        FSDPStrategy(**{option: container})
    with pytest.raises(ValueError, match="a container class"):
        FSDPStrategy(**{option: {Block, container}})


def test_lightnings_activation_checkpointing_option_means_activation_checkpointing_policy():
    strategy = FSDPStrategy(activation_checkpointing=[Block])
    assert strategy._activation_checkpointing == ModuleSelector.from_option("activation_checkpointing_policy", {Block})
    with pytest.raises(ValueError, match="pass only activation_checkpointing_policy"):
        FSDPStrategy(activation_checkpointing=Block, activation_checkpointing_policy={Block})


@pytest.mark.parametrize(
    ("member", "name"), [(StateDictType.FULL_STATE_DICT, "full"), (StateDictType.SHARDED_STATE_DICT, "sharded")]
)
def test_torchs_state_dict_type_members_mean_stratagems_names(member, name):
    assert FSDPStrategy(state_dict_type=member).state_dict_type == name


def test_precision_plugin_is_refused_naming_precision():
    with pytest.raises(TypeError, match=r"precision_plugin=\.\.\.\) is Lightning's name; stratagem's is precision="):
        FSDPStrategy(precision_plugin=object())


def test_the_local_state_dict_type_is_refused_naming_sharded():
    with pytest.raises(ValueError, match=r"LOCAL_STATE_DICT.*Use 'sharded'"):
        FSDPStrategy(state_dict_type=StateDictType.LOCAL_STATE_DICT)


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


def _train_with_single_class_policies() -> dict[str, Any]:
    strategy = make_strategy(auto_wrap_policy=Block, activation_checkpointing_policy=Block)
    module, optimizer = build(strategy)
    losses = train(strategy, optimizer, global_batches(STEPS))
    return {
        "losses": losses,
        "units": sorted(name for name, sub in module.named_modules() if isinstance(sub, FSDPModule)),
        "checkpointed": sorted(
            name for name, sub in module.named_modules() if "checkpoint" in (_get_registry(sub) or {})
        ),
    }


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_single_class_policies_shard_and_checkpoint_each_block_and_train_like_one_process(workers):
    results = workers.run(_train_with_single_class_policies)
    reference_losses, _ = reference_run(global_batches(STEPS))
    for result in results:
        assert result["losses"] == pytest.approx(reference_losses, rel=1e-5, abs=1e-6)
        assert result["units"] == ["blocks.0", "blocks.1", "blocks.2"]
        assert result["checkpointed"] == ["blocks.0", "blocks.1", "blocks.2"]


class ManuallyWrapped(Module):
    """The FSDP page's manual-wrapping example: ``wrap()`` on the layers to shard one by one."""

    def configure_model(self) -> None:
        if hasattr(self, "model"):
            return
        self.linear_layer = nn.Linear(32, 32)
        self.block = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
        linear_layer = wrap(self.linear_layer)
        for i, layer in enumerate(self.block):
            self.block[i] = wrap(layer)
        self.model = nn.Sequential(linear_layer, nn.ReLU(), self.block)

    def on_fit_start(self) -> None:
        self.units = sorted(name for name, sub in self.named_modules() if isinstance(sub, FSDPModule))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.model(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit_manually_wrapped(root: str) -> list[str]:
    module = ManuallyWrapped()
    trainer = Trainer(
        strategy="fsdp", accelerator="cpu", devices=2, max_steps=2, default_root_dir=root, logger=False,
        enable_progress_bar=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(module, [torch.randn(4, 32) for _ in range(2)])
    return module.units


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_wrap_inside_configure_model_makes_each_wrapped_layer_its_own_unit(workers, tmp_path):
    expected = ["block.0", "block.1", "linear_layer"]
    assert workers.run(_fit_manually_wrapped, str(tmp_path)) == [expected, expected]
