from stratagem.testing.conformance import StrategyConformance


class TestFSDPConforms(StrategyConformance):
    strategy = "fsdp"
    devices = 2
    timeout = 300


class TestModelParallelConforms(StrategyConformance):
    """model_parallel with data parallelism on the mesh only: the kit's module has no tensor-parallel plan."""

    strategy = "model_parallel"
    strategy_options = {"dp_shard": 2}
    devices = 2
    timeout = 300
