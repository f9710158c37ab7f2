import copy
import pickle

import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

import stratagem


def test_a_module_outside_a_run_has_no_trainer_but_a_device_and_rank():
    module = ClassifierModule()
    with pytest.raises(RuntimeError, match="is not attached to a Trainer"):
        _ = module.trainer
    assert module.device == torch.device("cpu")
    assert module.global_rank == 0
    assert stratagem.Module().device == torch.device("cpu")


def test_pickling_or_copying_a_module_leaves_its_trainer_behind(tmp_path):
    module = ClassifierModule()
    quiet_trainer(tmp_path, max_steps=1).fit(module, make_loader())
    assert module.trainer is not None
    for clone in (pickle.loads(pickle.dumps(module)), copy.deepcopy(module)):
        assert clone._trainer is None
        assert torch.equal(clone.layers[0].weight, module.layers[0].weight)


def test_default_hooks_do_nothing_and_default_steps_explain_what_is_missing():
    module = stratagem.Module()
    module.on_fit_start()
    module.on_save_checkpoint({})
    with pytest.raises(NotImplementedError, match="training_step"):
        module.training_step(None, 0)
    with pytest.raises(NotImplementedError, match="test_step"):
        module.test_step(None, 0)
    assert module.val_dataloader() is None


def test_predict_step_calls_forward_by_default(tmp_path):
    class Doubler(stratagem.Module):
        def forward(self, batch):
            return batch * 2

    predictions = quiet_trainer(tmp_path).predict(Doubler(), [torch.ones(2), torch.zeros(3)])
    assert [p.tolist() for p in predictions] == [[2.0, 2.0], [0.0, 0.0, 0.0]]


def test_log_dict_logs_every_item(tmp_path):
    class Many(ClassifierModule):
        def validation_step(self, batch, batch_idx, *args):
            self.log_dict({"a": 1.0, "b": torch.tensor(2.0)}, prog_bar=True)

    trainer = quiet_trainer(tmp_path)
    assert trainer.validate(Many(), make_loader()) == [{"a": 1.0, "b": 2.0}]
    assert set(trainer.progress_bar_metrics) == {"a", "b"}
