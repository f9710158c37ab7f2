from stratagem.testing.conformance import StrategyConformance


class TestFSDPConforms(StrategyConformance):
    strategy = "fsdp"
    devices = 2
    timeout = 300


class TestModelParallelConforms(StrategyConformance):
    """model_parallel with tp=2: the kit's module (Linear, Tanh, Linear) split by a declarative plan. Both ranks
    read the same batches, which the kit's single_device reference takes as the global batch."""

    strategy = "model_parallel"
    strategy_options = {"tp": 2, "tp_plan": {"net.0": "colwise", "net.2": "rowwise"}}
    devices = 2
    timeout = 300


class TestPipelineConforms(StrategyConformance):
    """The pipeline strategy at pp=2 with interleaved_1f1b, 2 stages per rank: the kit's module with a fourth block
    (Linear, Tanh, Linear, Linear), one block per stage; rank 0 holds stages 0 and 2, rank 1 stages 1 and 3. Both
    ranks read the same batches (the global batch). Its engine owns the step, so the own-loop checks are skipped:
    the Runtime refuses it before any process starts. One stage per rank (1f1b) is the 4-process class's layout."""

    strategy = "pipeline"
    strategy_options = {"pp": 2, "pipeline_schedule": "interleaved_1f1b", "stages_per_rank": 2, "micro_batches": 2}
    blocks = 4
    devices = 2
    timeout = 300


class TestPipelineByShardingConforms(StrategyConformance):
    """pp=2 x dp_shard=2 on 4 processes: each stage fully sharded over its 2 data ranks, which read different
    batches (the kit's single_device reference takes twice the per-rank batch)."""

    strategy = "pipeline"
    strategy_options = {"pp": 2, "dp_shard": 2, "pipeline_schedule": "1f1b"}
    devices = 4
    timeout = 300
