from stratagem.testing.conformance import StrategyConformance

_RANK_DEPENDENT_INIT = (
    "fsdp initialises the shards it materialises from the meta device with each rank's own random state "
    "(stratagem_fsdp/materialize.py); with ranks seeded differently, the whole weights are a mix of several "
    "initialisations instead of rank 0's. Broadcasting rank 0's weights, or one seed for the materialisation, "
    "would fix it."
)


class TestFSDPConforms(StrategyConformance):
    strategy = "fsdp"
    devices = 2
    timeout = 300
    known_failures = {
        "ranks_agree_after_setup": _RANK_DEPENDENT_INIT,
        "matches_single_device": _RANK_DEPENDENT_INIT,
        "accumulation_matches_single_device": _RANK_DEPENDENT_INIT,
    }
