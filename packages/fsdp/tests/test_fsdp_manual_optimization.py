"""Under manual optimization fsdp makes every child holding parameters an FSDP unit (the root's gathered
parameters would get no reduce-scatter between the backwards training_step runs), and refuses parameters set
on the module itself."""

import pytest
from torch import nn

from stratagem_fsdp.wrapping import refuse_root_parameters_under_manual_optimization, selected_units


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 4), nn.Linear(4, 1))
        self.activation = nn.Tanh()  # no parameters: nothing to shard


def test_every_child_with_parameters_becomes_a_unit_beside_the_selected_ones():
    module = Pair()
    assert selected_units(module, None) == []
    units = selected_units(module, None, children_are_units=True)
    assert units == [module.generator, module.discriminator]


def test_parameters_on_the_module_itself_are_refused_naming_them():
    module = Pair()
    module.scale = nn.Parameter(module.generator[0].weight.new_ones(1))
    with pytest.raises(ValueError, match=r"holds parameters of its own \(scale\).*Move them into a submodule"):
        refuse_root_parameters_under_manual_optimization(module)
    refuse_root_parameters_under_manual_optimization(Pair())
