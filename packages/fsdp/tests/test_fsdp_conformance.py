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
