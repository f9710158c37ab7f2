"""Options are checked when the strategy is created, before hivemind is imported or any daemon starts."""

from __future__ import annotations

import pytest

from stratagem import registry
from stratagem_hivemind.options import INITIAL_PEERS_VARIABLE, MIN_PEERS_VARIABLE, swarm_options

ADDRESS = "/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWKDergkT171Pd6V8U95eaxzL4hvYFpdknSZUcSxpUQjvu"
DEFAULTS = {
    "target_batch_size": None,
    "batch_size_per_step": None,
    "run_id": "stratagem",
    "initial_peers": None,
    "host_maddrs": ("/ip4/0.0.0.0/tcp/0",),
    "min_peers": None,
    "join_timeout": 300.0,
    "use_local_updates": False,
    "matchmaking_time": 5.0,
    "averaging_timeout": 30.0,
    "delay_state_averaging": False,
    "delay_optimizer_step": False,
    "delay_grad_averaging": False,
    "verbose": False,
}


def _options(environ=None, **changed):
    return swarm_options(**{**DEFAULTS, **changed}, environ=environ or {})


def test_initial_peers_come_from_the_option_or_else_the_environment():
    assert _options().initial_peers == ()
    assert _options({INITIAL_PEERS_VARIABLE: f"{ADDRESS}, {ADDRESS}"}).initial_peers == (ADDRESS, ADDRESS)
    assert _options({INITIAL_PEERS_VARIABLE: "/ip4/10.0.0.1/tcp/1"}, initial_peers=[ADDRESS]).initial_peers == (
        ADDRESS,
    )


def test_min_peers_comes_from_the_option_or_else_the_environment():
    assert _options().min_peers == 1
    assert _options({MIN_PEERS_VARIABLE: "3"}).min_peers == 3
    assert _options({MIN_PEERS_VARIABLE: "3"}, min_peers=2).min_peers == 2
    with pytest.raises(ValueError, match=rf"{MIN_PEERS_VARIABLE}='two' is not valid; expected a positive int"):
        _options({MIN_PEERS_VARIABLE: "two"})


def test_the_target_batch_size_defaults_to_one_step_of_every_expected_peer():
    assert _options(min_peers=3).target_for(16) == 48
    assert _options(min_peers=3, target_batch_size=100).target_for(16) == 100


@pytest.mark.parametrize(
    ("changed", "error", "message"),
    [
        ({"target_batch_size": 0}, ValueError, r"target_batch_size=0\) is not valid; expected a positive int"),
        ({"batch_size_per_step": 2.5}, ValueError, r"batch_size_per_step=2.5\) is not valid"),
        ({"min_peers": True}, ValueError, r"min_peers=True\) is not valid; expected a positive int"),
        ({"run_id": "my run"}, ValueError, r"run_id='my run'\) is not valid; expected a non-empty string"),
        ({"matchmaking_time": -1}, ValueError, r"matchmaking_time=-1\) is not valid; expected a positive number"),
        ({"averaging_timeout": float("inf")}, ValueError, r"averaging_timeout=inf\) is not valid"),
        ({"join_timeout": "soon"}, ValueError, r"join_timeout='soon'\) is not valid"),
        ({"use_local_updates": 1}, TypeError, r"use_local_updates=1\) is not valid; expected True or False"),
        ({"initial_peers": "127.0.0.1:31337"}, ValueError, r"'127.0.0.1:31337' is not a multiaddr"),
        ({"host_maddrs": [1]}, TypeError, r"host_maddrs=\[1\]\) is not valid; expected a multiaddr string"),
        ({"delay_grad_averaging": True}, ValueError, r"delay_grad_averaging=True\) needs delay_optimizer_step=True"),
        (
            {"delay_optimizer_step": True},
            ValueError,
            r"delay_optimizer_step=True\) needs delay_state_averaging=True",
        ),
        (
            {
                "use_local_updates": True,
                "delay_state_averaging": True,
                "delay_optimizer_step": True,
                "delay_grad_averaging": True,
            },
            ValueError,
            r"use_local_updates=True\) averages parameters, not gradients",
        ),
    ],
)
def test_a_bad_option_names_itself_its_value_and_what_is_accepted(changed, error, message):
    with pytest.raises(error, match=message):
        _options(**changed)


def test_the_registered_name_creates_the_strategy_and_refuses_an_unknown_option():
    from stratagem_hivemind import HivemindStrategy

    strategy = registry.strategies.create("hivemind", run_id="demo", initial_peers=ADDRESS)
    assert isinstance(strategy, HivemindStrategy)
    assert strategy.options.initial_peers == (ADDRESS,)
    assert f"initial_peers={ADDRESS}" in repr(strategy)
    with pytest.raises(TypeError, match="does not accept option"):
        registry.strategies.create("hivemind", peers=ADDRESS)


def test_a_swarm_peer_is_one_process_and_says_how_to_start_more():
    import stratagem

    with pytest.raises(ValueError, match=r"one peer per process.*initial_peers"):
        stratagem.resolve(strategy="hivemind", accelerator="cpu", devices=2)


def test_importing_the_package_imports_neither_hivemind_nor_the_strategy():
    import subprocess
    import sys

    code = (
        "import sys, stratagem_hivemind, stratagem_hivemind.registration; "
        "print(sorted(m for m in ('hivemind', 'torch', 'stratagem_hivemind.strategy') if m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_a_precision_with_torchs_gradient_scaler_is_refused_when_the_trainer_is_built():
    import stratagem

    with pytest.raises(ValueError, match=r"precision='16-mixed' scales gradients with torch's GradScaler"):
        stratagem.resolve(strategy="hivemind", accelerator="cpu", devices=1, precision="16-mixed")
