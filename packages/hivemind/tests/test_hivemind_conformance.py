"""The conformance kit on one swarm peer.

A swarm has no world size to ask for: every peer is a process of its own that joins with
``initial_peers`` (what several peers do together is tested in ``test_hivemind_swarm.py``). The kit
therefore runs one peer (``devices=1``), alone in its swarm: every check applies to it, the comparisons
with ``single_device`` and exact resuming included.
"""

from __future__ import annotations

from stratagem.testing.conformance import StrategyConformance


class TestHivemindPeer(StrategyConformance):
    strategy = "hivemind"
    devices = 1
    strategy_options = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "matchmaking_time": 2.0, "averaging_timeout": 10.0}
