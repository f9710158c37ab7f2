from stratagem.testing.conformance import StrategyConformance


class TestSingleXLAConforms(StrategyConformance):
    strategy = "single_xla"
    accelerator = "xla"
    devices = 1
    timeout = 400
