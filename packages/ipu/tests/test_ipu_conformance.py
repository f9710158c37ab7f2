"""The conformance kit on ipu_strategy, through the PopTorch stand-in (conftest puts it on PYTHONPATH)."""

from stratagem.testing.conformance import StrategyConformance


class TestIPUStrategy(StrategyConformance):
    strategy = "ipu_strategy"
    accelerator = "ipu"
    devices = 2


class TestIPUStrategyTwoStepsPerCall(StrategyConformance):
    """Two optimizer steps per host call: checkpoints and resumes fall on call boundaries (even steps)."""

    strategy = "ipu_strategy"
    accelerator = "ipu"
    devices = 2
    strategy_options = {"device_iterations": 2}
    resume_steps = (2, 4)
