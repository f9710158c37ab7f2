"""The pipeline strategy on real gloo ranks: a tiny decoder trained by the Trainer under each schedule, compared
with the hand-written torch.distributed.pipelining loop and with one plain process on the same global batches;
logging, validation, checkpoints that other strategies read, and settings refused before launch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from pipeline_testing import (
    GLOBAL_BATCH,
    STEPS,
    TP_PLAN,
    HuggingFaceGPT2,
    TinyGPT,
    global_batches,
    hand_written_pipeline,
    hand_written_pipeline_with_tp,
    single_process_losses,
)
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

import stratagem
from stratagem import Trainer
from stratagem.callbacks import Callback, ModelCheckpoint
from stratagem.testing import DistributedWorkers
from stratagem_fsdp import PipelineStrategy

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore:devices=[48] starts [48] CPU processes")]

# Measured: the pipeline's losses equal the hand-written loop's exactly, and one process's to 5e-7.
LOSS_TOLERANCE = 1e-5


class _StepLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs))


def _loader(data_parallel: int) -> DataLoader:
    tokens, targets = (torch.cat(parts) for parts in zip(*global_batches()))
    return DataLoader(TensorDataset(tokens, targets), batch_size=GLOBAL_BATCH // data_parallel)


def _fit(
    root: str,
    options: dict[str, Any],
    data_parallel: int = 1,
    save: bool = False,
    accumulate: int = 1,
    clip: float | None = None,
    build: type[stratagem.Module] = TinyGPT,
    precision: str = "32-true",
) -> dict[str, Any]:
    """A Trainer fit of one epoch (STEPS steps) with validation, as a user runs it, of a ``build()`` module."""
    torch.manual_seed(0)
    module = build()
    recorder = _StepLosses()
    callbacks: list[Callback] = [recorder]
    if save:
        callbacks.append(ModelCheckpoint(dirpath=f"{root}/checkpoints", monitor="val_loss", filename="best"))
    trainer = Trainer(
        strategy=PipelineStrategy(**options), accelerator="cpu", devices=dist.get_world_size(), max_epochs=1,
        default_root_dir=root, logger=False, enable_progress_bar=False, enable_checkpointing=save,
        callbacks=callbacks, num_sanity_val_steps=0, accumulate_grad_batches=accumulate, gradient_clip_val=clip,
        precision=precision,
    )  # fmt: skip
    trainer.fit(module, _loader(data_parallel), _loader(data_parallel))
    after: dict[str, Any] = {}
    if save:
        # The same module and strategy again in this process: its stages are set up on a new pipeline.
        chunks: list[int] = []
        hooks = [
            block.register_forward_pre_hook(lambda _, args: chunks.append(args[0].shape[0])) for block in module.layers
        ]
        [validated] = trainer.validate(module, _loader(data_parallel))
        for hook in hooks:
            hook.remove()
        tokens = global_batches(1, seed=7)[0][0]
        [predicted] = trainer.predict(module, DataLoader(tokens, batch_size=GLOBAL_BATCH))
        after = {"validated": validated["val_loss"], "predicted": predicted, "validation_chunks": sorted(set(chunks))}
    return {
        **after,
        "losses": recorder.losses,
        "progress_bar_loss": trainer.progress_bar_metrics["loss"],
        "val_loss": float(trainer.callback_metrics["val_loss"]),
        "train_loss": float(trainer.callback_metrics["train_loss"]),
        "own": sorted(name for name, _ in module.named_parameters()),
        "split": sorted(name for name, parameter in module.named_parameters() if isinstance(parameter, DTensor)),
        "best": str(trainer.checkpoint_callback.best_model_path) if save else None,
    }


def _stop_and_resume(root: str, options: dict[str, Any]) -> list[float]:
    """Half the epoch, saved by ModelCheckpoint; then a new Trainer resumes from that checkpoint to the end."""
    losses = []
    for steps, checkpoint in ((STEPS // 2, None), (-1, f"{root}/half/half.ckpt")):
        torch.manual_seed(0)
        recorder = _StepLosses()
        saver = ModelCheckpoint(dirpath=f"{root}/half", filename="half", every_n_train_steps=STEPS // 2)
        trainer = Trainer(
            strategy=PipelineStrategy(**options), accelerator="cpu", devices=dist.get_world_size(), max_epochs=1,
            max_steps=steps, default_root_dir=root, logger=False, enable_progress_bar=False,
            callbacks=[recorder, saver] if checkpoint is None else [recorder], num_sanity_val_steps=0,
        )  # fmt: skip
        trainer.fit(TinyGPT(), _loader(1), ckpt_path=checkpoint)
        losses += recorder.losses
    return losses


def _validation_loss(weights: dict[str, torch.Tensor]) -> float:
    model = TinyGPT()
    model.load_state_dict(weights)
    with torch.no_grad():
        losses = [model.pipeline_loss(model(tokens), targets).item() for tokens, targets in global_batches()]
    return sum(losses) / len(losses)


@pytest.fixture(scope="module")
def workers():
    with DistributedWorkers(2, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


@pytest.fixture(scope="module")
def four_workers():
    with DistributedWorkers(4, env={"OMP_NUM_THREADS": "1"}) as pool:
        yield pool


@pytest.fixture(scope="module")
def reference():
    return single_process_losses()


@pytest.fixture(scope="module")
def one_f_one_b(workers, tmp_path_factory):
    """pp=2 under 1f1b, saving the best checkpoint by val_loss: several checks read it."""
    root = tmp_path_factory.mktemp("one_f_one_b")
    return workers.run(_fit, str(root), {"pipeline_schedule": "1f1b", "micro_batches": 4}, save=True, timeout=200)


@pytest.mark.timeout(240)
def test_1f1b_trains_like_the_hand_written_loop_and_one_process(workers, one_f_one_b, reference):
    hand = workers.run(hand_written_pipeline, "Schedule1F1B", 4)
    losses, _ = reference
    for result, hand_losses in zip(one_f_one_b, hand, strict=True):
        assert len(result["losses"]) == STEPS
        assert result["losses"] == pytest.approx(hand_losses, abs=LOSS_TOLERANCE)
        assert result["losses"] == pytest.approx(losses, abs=LOSS_TOLERANCE)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("options", "hand"),
    [
        ({"pipeline_schedule": "gpipe", "micro_batches": 2}, ("ScheduleGPipe", 2)),
        (
            {"pipeline_schedule": "interleaved_1f1b", "micro_batches": 2, "stages_per_rank": 2},
            ("ScheduleInterleaved1F1B", 2, 2),
        ),
    ],
    ids=["gpipe", "interleaved_1f1b"],
)
def test_each_schedule_trains_like_the_hand_written_loop_on_the_same_global_batch(
    workers, tmp_path, options, hand, reference
):
    results = workers.run(_fit, str(tmp_path), options, timeout=200)
    hand_losses = workers.run(hand_written_pipeline, *hand)
    for result, expected in zip(results, hand_losses, strict=True):
        assert result["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)
        assert result["losses"] == pytest.approx(reference[0], abs=LOSS_TOLERANCE)


@pytest.mark.timeout(240)
def test_the_zero_bubble_v_schedule_trains_like_one_process(workers, tmp_path, reference):
    results = workers.run(_fit, str(tmp_path), {"pipeline_schedule": "zbv_zero_bubble", "micro_batches": 4})
    for result in results:
        assert result["losses"] == pytest.approx(reference[0], abs=LOSS_TOLERANCE)
    # The V: rank 0 holds the first and the last stage, rank 1 the two middle ones.
    assert "head.weight" in results[0]["own"]
    assert "tokens.weight" in results[0]["own"]
    assert not {"head.weight", "tokens.weight"} & set(results[1]["own"])


@pytest.mark.timeout(240)
def test_a_hugging_face_gpt2_cut_by_pipeline_split_trains_like_one_process(workers, tmp_path):
    # transformers is not among the fsdp tox env's dependencies (its import alone costs each process ~7 s of CPU).
    pytest.importorskip("transformers")
    options = {"pipeline_schedule": "1f1b", "micro_batches": 2, "pipeline_split": ["gpt.transformer.h.1"]}
    results = workers.run(_fit, str(tmp_path), options, build=HuggingFaceGPT2)
    expected, _ = single_process_losses(build=HuggingFaceGPT2)
    for result in results:
        assert result["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)
    first, last = (set(result["own"]) for result in results)
    assert {"gpt.transformer.wte.weight", "gpt.transformer.h.0.attn.c_attn.weight"} <= first
    assert {"gpt.transformer.h.1.mlp.c_fc.weight", "gpt.transformer.ln_f.weight", "gpt.lm_head.weight"} <= last
    assert not first & last


@pytest.mark.timeout(240)
def test_bf16_mixed_trains_through_the_schedule_within_bf16_s_precision_of_fp32(workers, tmp_path, reference):
    options = {"pipeline_schedule": "1f1b", "micro_batches": 2}
    results = workers.run(_fit, str(tmp_path), options, precision="bf16-mixed")
    for result in results:
        assert result["losses"] != pytest.approx(reference[0], abs=LOSS_TOLERANCE)  # autocast ran
        assert result["losses"] == pytest.approx(reference[0], rel=2e-2)
        assert result["val_loss"] == pytest.approx(result["losses"][-1], rel=0.2)


@pytest.mark.timeout(240)
def test_a_run_stopped_halfway_resumes_from_its_checkpoint_exactly(workers, one_f_one_b, tmp_path):
    results = workers.run(_stop_and_resume, str(tmp_path), {"pipeline_schedule": "1f1b", "micro_batches": 4})
    for result, uninterrupted in zip(results, one_f_one_b, strict=True):
        assert result == uninterrupted["losses"]


@pytest.mark.timeout(240)
def test_accumulated_batches_run_as_one_schedule_call_and_train_like_the_trainer_s_accumulation(workers, tmp_path):
    # 8 batches in windows of 3: two full windows and one of 2, whose gradient counts for 2/3 as the Trainer's does.
    results = workers.run(_fit, str(tmp_path), {"pipeline_schedule": "1f1b", "micro_batches": 2}, accumulate=3)
    expected, _ = single_process_losses(accumulate=3)
    assert len(expected) == 3
    for result in results:
        assert result["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)


@pytest.mark.timeout(240)
def test_clipping_takes_the_norm_over_every_stage_s_gradients(workers, tmp_path):
    results = workers.run(_fit, str(tmp_path), {"pipeline_schedule": "1f1b", "micro_batches": 2}, clip=0.05)
    clipped, _ = single_process_losses(clip=0.05)
    unclipped, _ = single_process_losses()
    assert abs(clipped[-1] - unclipped[-1]) > 1e-3  # the clip bites
    for result in results:
        assert result["losses"] == pytest.approx(clipped, abs=LOSS_TOLERANCE)


def test_each_rank_holds_only_its_stage_under_the_whole_model_s_names(one_f_one_b):
    first, last = (set(result["own"]) for result in one_f_one_b)
    whole = {name for name, _ in TinyGPT().named_parameters()}
    assert first | last == whole
    assert not first & last
    assert {"tokens.weight", "positions.weight", "layers.0.qkv.weight", "layers.1.up.weight"} <= first
    assert {"layers.2.qkv.weight", "layers.3.down.bias", "norm.weight", "head.weight"} <= last


def test_the_last_stage_s_loss_reaches_every_rank_s_progress_bar_and_logged_metrics(one_f_one_b):
    for result in one_f_one_b:
        assert result["progress_bar_loss"] == pytest.approx(result["losses"][-1])
        assert result["train_loss"] == pytest.approx(result["losses"][-1])
    assert one_f_one_b[0]["val_loss"] == one_f_one_b[1]["val_loss"]


def test_validation_runs_forward_only_through_the_stages_and_matches_the_trained_weights(one_f_one_b, reference):
    _, weights = reference
    for result in one_f_one_b:
        assert result["val_loss"] == pytest.approx(_validation_loss(weights), abs=LOSS_TOLERANCE)


def test_validation_runs_each_batch_through_the_stages_in_micro_batches(one_f_one_b):
    # micro_batches=4 on batches of 8: every block a rank holds sees micro-batches of 2 samples, never the batch.
    for result in one_f_one_b:
        assert result["validation_chunks"] == [GLOBAL_BATCH // 4]


def test_validate_and_predict_after_fit_run_the_same_stages_again(one_f_one_b, reference):
    _, weights = reference
    model = TinyGPT()
    model.load_state_dict(weights)
    with torch.no_grad():
        expected = model(global_batches(1, seed=7)[0][0])
    for result in one_f_one_b:
        assert result["validated"] == pytest.approx(result["val_loss"], abs=1e-6)
        torch.testing.assert_close(result["predicted"], expected, rtol=0, atol=1e-4)


def test_a_pipeline_checkpoint_loads_into_single_device_with_the_trained_weights_and_optimizer(one_f_one_b, reference):
    _, weights = reference
    best = one_f_one_b[0]["best"]
    assert best == one_f_one_b[1]["best"]
    strategy = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    strategy.setup_environment()
    module = TinyGPT()
    optimizer = module.configure_optimizers()
    remaining = strategy.load_checkpoint(best, {"module": module, "optimizers": [optimizer]})
    assert remaining["loops"]["fit"]["global_step"] == STEPS
    for name, value in weights.items():
        torch.testing.assert_close(module.state_dict()[name], value, rtol=0, atol=2e-5, msg=name)
    # Every parameter's optimizer state came back, in the whole model's order: one more step matches.
    assert len(optimizer.state) == len(list(module.parameters()))
    assert all(int(state["step"]) == STEPS for state in optimizer.state.values())


def _load_and_report(path: str, options: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint (any strategy's) loaded into a pipeline strategy's stages, then the weights gathered."""
    strategy = stratagem.resolve(strategy=PipelineStrategy(**options), accelerator="cpu", devices=dist.get_world_size())
    strategy.setup_environment()
    torch.manual_seed(1)
    with strategy.module_init_context(empty_init=True):
        module = TinyGPT()
    strategy.setup_module(module)
    [optimizer] = strategy.setup_optimizers([module.configure_optimizers()])
    remaining = strategy.load_checkpoint(path, {"module": module, "optimizers": [optimizer]})
    steps = sorted({int(state["step"]) for state in optimizer.state.values()})
    weights = strategy.module_full_state_dict()
    strategy.teardown()
    return {
        "weights": weights,
        "steps": steps,
        "states": len(optimizer.state),
        "global_step": remaining["loops"]["fit"]["global_step"],
    }


def _through_fsdp(path: str, save_to: str) -> dict[str, torch.Tensor]:
    """A checkpoint loaded into fsdp on the same ranks, then saved again by fsdp (its own sharded layout)."""
    strategy = stratagem.resolve(strategy="fsdp", accelerator="cpu", devices=dist.get_world_size())
    strategy.setup_environment()
    with strategy.module_init_context():
        module = TinyGPT()
    strategy.setup_module(module)
    [optimizer] = strategy.setup_optimizers([module.configure_optimizers()])
    remaining = strategy.load_checkpoint(path, {"module": module, "optimizers": [optimizer]})
    strategy.save_checkpoint(save_to, {"module": module, "optimizers": [optimizer], "loops": remaining["loops"]})
    weights = strategy.module_full_state_dict()
    strategy.teardown()
    return weights


@pytest.mark.timeout(240)
def test_a_pipeline_checkpoint_loads_into_fsdp_and_fsdp_s_back_into_the_pipeline(
    workers, one_f_one_b, reference, tmp_path
):
    _, weights = reference
    [in_fsdp, _] = workers.run(_through_fsdp, one_f_one_b[0]["best"], str(tmp_path / "fsdp"))
    back = workers.run(_load_and_report, str(tmp_path / "fsdp"), {"pipeline_schedule": "gpipe"})
    for loaded in (in_fsdp, back[0]["weights"]):
        assert loaded.keys() == weights.keys()
        for name, value in weights.items():
            torch.testing.assert_close(loaded[name], value, rtol=0, atol=2e-5, msg=name)
    assert sum(result["states"] for result in back) == len(list(TinyGPT().parameters()))
    assert all(result["steps"] == [STEPS] and result["global_step"] == STEPS for result in back)


@pytest.mark.timeout(240)
def test_a_pipeline_checkpoint_loads_into_other_schedules_and_a_single_device_one_into_the_pipeline(
    workers, one_f_one_b, reference, tmp_path
):
    _, weights = reference
    best = one_f_one_b[0]["best"]
    # Resharded: 2 stages saved, 4 stages (2 per rank, on a V) loaded.
    resharded = workers.run(_load_and_report, best, {"pipeline_schedule": "zbv_zero_bubble", "micro_batches": 4})
    # Back: one process's checkpoint (a torch file) into pp=2.
    single = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    single.setup_environment()
    module = TinyGPT()
    module.load_state_dict(weights)
    optimizer = module.configure_optimizers()
    module.pipeline_loss(module(global_batches(1)[0][0]), global_batches(1)[0][1]).backward()
    optimizer.step()
    single.save_checkpoint(
        tmp_path / "single.ckpt", {"module": module, "optimizers": [optimizer], "loops": {"fit": {"global_step": 1}}}
    )
    back = workers.run(_load_and_report, str(tmp_path / "single.ckpt"), {"pipeline_schedule": "1f1b"})
    for results, expected, steps in ((resharded, weights, STEPS), (back, module.state_dict(), 1)):
        loaded = results[0]["weights"]
        assert loaded.keys() == expected.keys()
        for name, value in expected.items():
            torch.testing.assert_close(loaded[name], value, rtol=0, atol=2e-5, msg=name)
        assert sum(result["states"] for result in results) == len(list(TinyGPT().parameters()))
        assert all(result["steps"] == [steps] for result in results)
        assert all(result["global_step"] == steps for result in results)


@pytest.mark.timeout(240)
def test_pp_2_by_dp_shard_2_trains_like_one_process_on_4_processes(four_workers, tmp_path, reference):
    results = four_workers.run(_fit, str(tmp_path), {"pp": 2, "dp_shard": 2, "micro_batches": 2}, data_parallel=2)
    # Ranks 0, 1 are the first stage's data-parallel pair, 2, 3 the last's; each pair's mean is the global batch's.
    for step in range(STEPS):
        mean = (results[0]["losses"][step] + results[1]["losses"][step]) / 2
        assert mean == pytest.approx(reference[0][step], abs=LOSS_TOLERANCE)
    assert results[0]["own"] == results[1]["own"]
    assert "head.weight" in results[2]["own"]


@pytest.mark.timeout(240)
def test_pp_2_by_tp_2_trains_like_the_hand_written_loop_and_one_process_and_saves_the_whole_model(
    four_workers, tmp_path, reference
):
    results = four_workers.run(
        _fit, str(tmp_path), {"pp": 2, "tp": 2, "tp_plan": TP_PLAN, "micro_batches": 2}, save=True
    )
    hand = four_workers.run(hand_written_pipeline_with_tp, "Schedule1F1B", 2)
    _, weights = reference
    for result, expected in zip(results, hand, strict=True):
        assert result["losses"] == pytest.approx(expected, abs=LOSS_TOLERANCE)
        assert result["losses"] == pytest.approx(reference[0], abs=LOSS_TOLERANCE)
        assert result["val_loss"] == pytest.approx(_validation_loss(weights), abs=LOSS_TOLERANCE)
    # Ranks 0, 1 are the first stage's tp pair, 2, 3 the last's: each splits its own blocks' MLPs.
    assert results[0]["split"] == results[1]["split"] == [f"layers.{i}.{n}" for i in (0, 1) for n in _MLP]
    assert results[2]["split"] == [f"layers.{i}.{n}" for i in (2, 3) for n in _MLP]
    # Its checkpoint (split tensors saved as shards) is the whole model's for one process.
    assert len({result["best"] for result in results}) == 1
    single = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    single.setup_environment()
    module = TinyGPT()
    single.load_checkpoint(results[0]["best"], {"module": module})
    for name, value in weights.items():
        torch.testing.assert_close(module.state_dict()[name], value, rtol=0, atol=2e-5, msg=name)


_MLP = ("down.bias", "down.weight", "up.bias", "up.weight")


# -- refused in the calling process, before any process starts ------------------------------------


def _trainer(devices: int = 2, **options: Any) -> Trainer:
    return Trainer(
        strategy=PipelineStrategy(**options), accelerator="cpu", devices=devices, max_steps=1, logger=False,
        enable_progress_bar=False, enable_checkpointing=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "batch_size", "message"),
    [
        ({"pipeline_split": ["layers.9"]}, 8, r"'layers.9', which does not exist: 'layers' holds blocks layers.0 to"),
        ({"pipeline_schedule": "interleaved_1f1b", "stages_per_rank": 4}, 8, r"8 stages but 'layers' holds 4"),
        ({"micro_batches": 3}, 8, r"batch size 8 \(per data-parallel rank\) is not divisible into micro_batches=3"),
        ({"micro_batch_size": 3}, 8, r"not divisible into micro-batches of micro_batch_size=3"),
    ],
)
def test_settings_the_module_or_batch_cannot_honour_are_refused_before_launch(options, batch_size, message):
    loader = DataLoader(TensorDataset(*global_batches(1)[0]), batch_size=batch_size)
    with pytest.raises(ValueError, match=message):
        _trainer(**options).fit(TinyGPT(), loader)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pipeline_schedule": "1f1b_interleaved"}, r"'1f1b_interleaved' is not a schedule\. Did you mean"),
        ({"pipeline_schedule": "1f1b", "micro_batches": 1}, r"at least as many micro-batches as stages"),
        ({"pp": 3}, r"pp=3, dp_replicate=1, dp_shard=1, tp=1.*not to the 2 processes"),
        ({"state_dict_type": "full"}, r"state_dict_type='full' cannot work with the pipeline strategy"),
        ({"pp": 1, "tp": 2}, r"tp=2 with the pipeline strategy needs tp_plan="),
        (
            {"devices": 8, "pp": 2, "tp": 2, "dp_shard": 2, "tp_plan": {"layers.*.up": "colwise"}},
            r"composes tp or data parallelism with pp, not both yet",
        ),
    ],
)
def test_a_schedule_or_layout_that_cannot_run_is_refused_when_the_trainer_is_made(options, message):
    with pytest.raises(ValueError, match=message):
        _trainer(**options)


def test_a_module_without_a_pipeline_loss_is_refused_before_launch():
    class NoLoss(TinyGPT):
        pipeline_loss = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"NoLoss has no pipeline_loss\(output, target\)"):
        _trainer().fit(NoLoss(), DataLoader(TensorDataset(*global_batches(1)[0]), batch_size=8))


def test_the_pipeline_is_registered_by_name_with_pp_outermost_on_the_mesh():
    strategy = stratagem.resolve(strategy="pipeline", accelerator="cpu", devices=2)
    assert isinstance(strategy, PipelineStrategy)
    assert strategy.mesh_layout.dim_names[0] == "pp"
    assert strategy.mesh_layout.shape == (2, 1, 1, 1)
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 1, "rank": 0}


def test_the_planner_s_estimate_counts_one_stage_of_the_decoder():
    from stratagem.planning import model_footprint

    module = TinyGPT()
    module.example_input_array = global_batches(1)[0][0]
    footprint, _ = model_footprint(module)
    pipeline = stratagem.resolve(strategy=PipelineStrategy(micro_batches=4), accelerator="cpu", devices=2)
    single = stratagem.resolve(strategy="single_device", accelerator="cpu", devices=1)
    whole, stage = single.estimate_memory(footprint), pipeline.estimate_memory(footprint)
    assert stage.device_bytes < 0.75 * whole.device_bytes
    assert stage.relative_step_time > 1


def test_the_planner_leaves_out_the_pipeline_for_a_module_it_cannot_cut():
    from stratagem.demo import DemoModule
    from stratagem.planning import plan

    planned = plan(DemoModule(), ["pipeline", "fsdp"], accelerator="cpu", devices=2)
    pipeline, fsdp = planned.candidates
    assert pipeline.problem is not None
    assert "not usable for DemoModule" in pipeline.problem
    assert fsdp.problem is None
