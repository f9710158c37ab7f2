from stratagem.testing.conformance import StrategyConformance


class TestFSDPConforms(StrategyConformance):
    strategy = "fsdp"
    devices = 2
    timeout = 300
