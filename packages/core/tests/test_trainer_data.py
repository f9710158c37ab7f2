import pytest
import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)
from trainer_testing import ClassifierModule, make_dataset, make_loader, quiet_trainer

from stratagem.strategies import SingleDeviceStrategy, TakesLoopSettings
from stratagem.trainer.data import as_loader_list, count_batches, with_distributed_sampler

SECOND_OF_TWO = {"num_replicas": 2, "rank": 1}


def _collate(batch):
    return torch.utils.data.default_collate(batch)


def _init_worker(worker_id):
    torch.manual_seed(worker_id)


def test_recreated_loader_reads_this_ranks_share_and_keeps_every_other_setting():
    generator = torch.Generator().manual_seed(1)
    loader = DataLoader(
        make_dataset(20),
        batch_size=4,
        shuffle=True,
        collate_fn=_collate,
        drop_last=True,
        generator=generator,
        worker_init_fn=_init_worker,
        timeout=5,
        num_workers=1,
        persistent_workers=True,
        prefetch_factor=3,
    )
    split = with_distributed_sampler(loader, SECOND_OF_TWO, seed=7)
    assert isinstance(split, DataLoader)
    assert split is not loader
    sampler = split.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.seed) == (2, 1, True, 7)
    for name in ("batch_size", "collate_fn", "drop_last", "generator", "worker_init_fn", "timeout", "num_workers"):
        assert getattr(split, name) is getattr(loader, name) or getattr(split, name) == getattr(loader, name), name
    assert (split.persistent_workers, split.prefetch_factor) == (True, 3)
    assert len(split) == 2  # 10 samples on this rank, batches of 4, the last one dropped


def test_a_sequential_loader_stays_in_order_and_evaluation_never_shuffles():
    split = with_distributed_sampler(make_loader(num_samples=8, batch_size=2), SECOND_OF_TWO, seed=0)
    assert not split.sampler.shuffle
    assert list(split.sampler) == [1, 3, 5, 7]
    shuffled = make_loader(num_samples=8, batch_size=2, shuffle=True)
    assert not with_distributed_sampler(shuffled, SECOND_OF_TWO, seed=0, shuffle=False).sampler.shuffle


class _Stream(IterableDataset):
    def __iter__(self):
        yield from range(4)


def test_what_cannot_or_need_not_be_split_is_left_as_given():
    already = DataLoader(make_dataset(8), sampler=DistributedSampler(make_dataset(8), num_replicas=2, rank=0))
    stream = DataLoader(_Stream())
    batches = [torch.ones(2)]
    plain = make_loader()
    for loader in (already, stream, batches):
        assert with_distributed_sampler(loader, SECOND_OF_TWO, seed=0) is loader
    assert with_distributed_sampler(plain, None, seed=0) is plain


def test_a_custom_sampler_cannot_be_split_and_the_error_says_what_to_do():
    weighted = DataLoader(make_dataset(8), sampler=WeightedRandomSampler([1.0] * 8, 8))
    with pytest.raises(ValueError, match=r"custom sampler .*WeightedRandomSampler.* use_distributed_sampler=False"):
        with_distributed_sampler(weighted, SECOND_OF_TWO, seed=0)


class _NamedLoader(DataLoader):
    def __init__(self, name):
        super().__init__(make_dataset(8), batch_size=2)
        self.name = name


def test_a_loader_subclass_that_cannot_be_rebuilt_is_explained():
    with pytest.raises(ValueError, match="Could not re-create _NamedLoader with a DistributedSampler"):
        with_distributed_sampler(_NamedLoader("x"), SECOND_OF_TWO, seed=0)


def test_counting_batches_with_limits():
    loader = make_loader(num_samples=40, batch_size=8)
    assert count_batches(loader, 1.0, "limit") == 5
    assert count_batches(loader, 3, "limit") == 3
    assert count_batches(loader, 0.5, "limit") == 2
    assert count_batches(loader, 0.01, "limit") == 1
    assert count_batches(loader, 0.0, "limit") == 0
    assert count_batches(iter([1, 2]), 1.0, "limit") is None
    assert count_batches(iter([1, 2]), 7, "limit") == 7
    with pytest.raises(ValueError, match=r"limit_val_batches=0\.5 is a fraction of the data, but the dataloader"):
        count_batches(iter([1, 2]), 0.5, "limit_val_batches")


def test_a_list_of_dataloaders_is_several_and_a_list_of_batches_is_one():
    loaders = [make_loader(), make_loader()]
    assert as_loader_list(loaders, "x") == loaders
    batches = [torch.ones(2), torch.zeros(2)]
    assert as_loader_list(batches, "x") == [batches]
    with pytest.raises(TypeError, match="dataloaders got int"):
        as_loader_list(3, "dataloaders")


class _IndexDataset(TensorDataset):
    def __init__(self, size):
        super().__init__(torch.arange(size))


class _SplittingStrategy(SingleDeviceStrategy):
    """One process pretending to be rank 1 of 2, to see how data is split."""

    @property
    def distributed_sampler_kwargs(self):
        return dict(SECOND_OF_TWO)


class _IndexRecorder(ClassifierModule):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_train_epoch_start(self):
        self.epochs.append([])

    def training_step(self, batch, batch_idx):
        (indices,) = batch
        self.epochs[-1].extend(indices.tolist())
        features = torch.randn(len(indices), 8)
        return self(features).sum() * 0


def test_the_trainer_splits_shuffled_data_across_ranks_with_a_new_order_every_epoch(tmp_path):
    module = _IndexRecorder()
    loader = DataLoader(_IndexDataset(16), batch_size=4, shuffle=True)
    trainer = quiet_trainer(tmp_path, strategy=_SplittingStrategy(), max_epochs=2, seed=3)
    trainer.fit(module, loader)
    first, second = module.epochs
    assert trainer.global_step == 4
    assert len(first) == len(second) == 8
    assert first != second
    expected = DistributedSampler(_IndexDataset(16), num_replicas=2, rank=1, shuffle=True, seed=3)
    expected.set_epoch(1)
    assert second == list(expected)


def test_use_distributed_sampler_false_leaves_the_data_whole(tmp_path):
    module = _IndexRecorder()
    trainer = quiet_trainer(tmp_path, strategy=_SplittingStrategy(), max_epochs=1, use_distributed_sampler=False)
    trainer.fit(module, DataLoader(_IndexDataset(16), batch_size=4))
    assert module.epochs == [list(range(16))]


def test_an_unsplittable_loader_is_refused_before_the_run_starts(tmp_path):
    started = []

    class Watch(_SplittingStrategy):
        def setup_environment(self):
            started.append(True)

    weighted = DataLoader(make_dataset(8), sampler=WeightedRandomSampler([1.0] * 8, 8))
    trainer = quiet_trainer(tmp_path, strategy=Watch(), max_steps=1)
    with pytest.raises(ValueError, match="train_dataloaders: the DataLoader uses a custom sampler"):
        trainer.fit(ClassifierModule(), weighted)
    assert started == []


def test_samplers_of_the_original_loader_are_untouched(tmp_path):
    loader = make_loader(shuffle=True)
    quiet_trainer(tmp_path, strategy=_SplittingStrategy(), max_steps=1).fit(ClassifierModule(), loader)
    assert isinstance(loader.sampler, RandomSampler)
    assert isinstance(make_loader().sampler, SequentialSampler)


class _BatchSizeRecorder(SingleDeviceStrategy, TakesLoopSettings):
    def __init__(self) -> None:
        super().__init__()
        self.at_environment_setup: list[int | None] = []

    def setup_environment(self) -> None:
        self.at_environment_setup.append(self.loop_settings.train_batch_size)
        super().setup_environment()


def test_the_strategy_learns_the_training_batch_size_before_the_run_starts(tmp_path):
    strategy = _BatchSizeRecorder()
    trainer = quiet_trainer(tmp_path, strategy=strategy, max_steps=1)
    assert strategy.loop_settings.train_batch_size is None
    trainer.fit(ClassifierModule(), make_loader(batch_size=4))
    assert strategy.at_environment_setup == [4]
    trainer.fit(ClassifierModule(), make_loader(batch_size=2), ckpt_path=None)
    assert strategy.at_environment_setup == [4, 2]


def test_a_batch_size_from_the_modules_own_dataloader_reaches_the_strategy_before_its_optimizers(tmp_path):
    strategy = _BatchSizeRecorder()
    seen_at_optimizers = []

    class OwnData(ClassifierModule):
        def train_dataloader(self):
            return make_loader(batch_size=16)

        def configure_optimizers(self):
            seen_at_optimizers.append(strategy.loop_settings.train_batch_size)
            return super().configure_optimizers()

    quiet_trainer(tmp_path, strategy=strategy, max_steps=1).fit(OwnData())
    assert strategy.at_environment_setup == [None]
    assert seen_at_optimizers == [16]
