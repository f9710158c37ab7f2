import pytest
import torch
from trainer_testing import ClassifierModule, make_loader, quiet_trainer

from stratagem.trainer.optimizers import parse_optimizers, step_schedulers


def _optimizer(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_every_accepted_form_of_configure_optimizers_is_read():
    first, second = _optimizer(), _optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(first, step_size=1)
    assert parse_optimizers(first).optimizers == [first]
    assert parse_optimizers([first, second]).optimizers == [first, second]
    assert parse_optimizers((first,)).optimizers == [first]
    pair = parse_optimizers(([first], [scheduler]))
    assert pair.optimizers == [first]
    assert pair.schedulers[0].scheduler is scheduler
    assert pair.schedulers[0].interval == "epoch"
    single = parse_optimizers(
        {"optimizer": first, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 3}}
    )
    assert (single.schedulers[0].interval, single.schedulers[0].frequency) == ("step", 3)
    several = parse_optimizers([{"optimizer": first}, {"optimizer": second, "lr_scheduler": scheduler}])
    assert several.optimizers == [first, second]
    assert len(several.schedulers) == 1


@pytest.mark.parametrize(
    ("returned", "error", "message"),
    [
        (None, TypeError, r"returned None \(NoneType\); expected an optimizer"),
        ([], TypeError, "returned list; expected an optimizer"),
        ({"optimiser": 1}, ValueError, r"dict with keys \['optimiser'\]; it needs 'optimizer'"),
        ({"optimizer": "adam"}, TypeError, "'adam' .* where an optimizer was expected"),
    ],
)
def test_a_wrong_configure_optimizers_value_says_what_is_accepted(returned, error, message):
    with pytest.raises(error, match=message):
        parse_optimizers(returned)


def test_scheduler_configs_are_checked():
    optimizer = _optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with pytest.raises(ValueError, match="interval='batch' is not valid"):
        parse_optimizers({"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "batch"}})
    with pytest.raises(ValueError, match="frequency=0 is not valid"):
        parse_optimizers({"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "frequency": 0}})
    with pytest.raises(ValueError, match=r"keys \['scheduler', 'when'\]"):
        parse_optimizers({"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "when": 1}})
    with pytest.raises(TypeError, match="is not a learning-rate scheduler"):
        parse_optimizers({"optimizer": optimizer, "lr_scheduler": 0.1})
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    with pytest.raises(ValueError, match="ReduceLROnPlateau needs a metric"):
        parse_optimizers({"optimizer": optimizer, "lr_scheduler": plateau})


def test_schedulers_step_per_optimizer_step_or_per_epoch_at_their_frequency(tmp_path):
    def final_lr(config):
        class Scheduled(ClassifierModule):
            def configure_optimizers(self):
                optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
                scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
                return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **config}}

        trainer = quiet_trainer(tmp_path, max_epochs=2)
        trainer.fit(Scheduled(), make_loader(num_samples=32, batch_size=8))
        return trainer.optimizers[0].param_groups[0]["lr"]

    assert final_lr({"interval": "epoch"}) == 0.5**2
    assert final_lr({"interval": "step"}) == 0.5**8
    assert final_lr({"interval": "step", "frequency": 4}) == 0.5**2


def test_a_monitored_scheduler_gets_the_logged_value_and_a_missing_one_is_an_error():
    optimizer = _optimizer(lr=1.0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
    configs = parse_optimizers({"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "v"}})
    step_schedulers(configs.schedulers, "epoch", 1, {"v": torch.tensor(1.0)})
    step_schedulers(configs.schedulers, "epoch", 2, {"v": torch.tensor(2.0)})
    assert optimizer.param_groups[0]["lr"] == 0.5
    with pytest.raises(RuntimeError, match=r"monitors 'v', which was not logged by this point \(logged: w\)"):
        step_schedulers(configs.schedulers, "epoch", 3, {"w": torch.tensor(1.0)})
    configs.schedulers[0].strict = False
    step_schedulers(configs.schedulers, "epoch", 3, {})


def test_reduce_on_plateau_follows_a_validation_metric_during_fit(tmp_path):
    class Plateau(ClassifierModule):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5, threshold=10.0)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}

    trainer = quiet_trainer(tmp_path, max_epochs=3)
    module = Plateau()
    trainer.fit(module, make_loader(), make_loader())
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.5**3  # no epoch improves by 1000%
    assert module.lr_schedulers() is trainer.lr_scheduler_configs[0].scheduler


def test_a_strategy_limiting_schedulers_refuses_more_with_the_limit_named(tmp_path):
    from stratagem.strategies import SingleDeviceStrategy, TakesLRSchedulers

    class OneScheduler(SingleDeviceStrategy, TakesLRSchedulers):
        max_lr_schedulers = 1

    class TwoSchedulers(ClassifierModule):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            schedulers = [torch.optim.lr_scheduler.StepLR(optimizer, 1), torch.optim.lr_scheduler.StepLR(optimizer, 2)]
            return [optimizer], schedulers

    trainer = quiet_trainer(tmp_path, strategy=OneScheduler(), max_steps=1)
    with pytest.raises(ValueError, match=r"OneScheduler supports at most 1 learning-rate scheduler.*returned 2"):
        trainer.fit(TwoSchedulers(), make_loader())


def test_a_strategy_that_steps_schedulers_itself_gets_none_stepped_by_the_trainer(tmp_path):
    from stratagem.strategies import SingleDeviceStrategy, StepsLRSchedulers

    class StepsItsOwn(SingleDeviceStrategy, StepsLRSchedulers):
        def check_lr_schedulers(self, schedulers):
            self.handed_over = schedulers

    class BothIntervals(ClassifierModule):
        def configure_optimizers(self):
            first, second = torch.optim.SGD(self.parameters(), lr=1.0), torch.optim.SGD(self.parameters(), lr=1.0)
            per_step = torch.optim.lr_scheduler.StepLR(first, 1, gamma=0.5)
            per_epoch = torch.optim.lr_scheduler.StepLR(second, 1, gamma=0.5)
            return [
                {"optimizer": first, "lr_scheduler": {"scheduler": per_step, "interval": "step"}},
                {"optimizer": second, "lr_scheduler": per_epoch},
            ]

    strategy = StepsItsOwn()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_epochs=2)
    trainer.fit(BothIntervals(), make_loader())
    assert [scheduler.last_epoch for scheduler in strategy.handed_over] == [0, 0]
    assert [optimizer.param_groups[0]["lr"] for optimizer in trainer.optimizers] == [1.0, 1.0]
