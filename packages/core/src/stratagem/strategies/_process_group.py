"""Joining the process group within a bounded time, and naming the ranks a timed-out collective waited for.

``init_process_group(timeout=...)`` bounds collectives; ranks that never meet (a wrong
``MASTER_ADDR``/``MASTER_PORT``, a rank that was never started) are bounded here instead, by a
separate and much shorter join timeout.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta

import torch.distributed as dist

from stratagem.environments._variables import seconds_variable
from stratagem.launchers.rendezvous import port_in_use_message
from stratagem.strategies._heartbeat import BEAT_SECONDS, SILENCE_SECONDS, Beat, Heartbeat, read_beats

JOIN_TIMEOUT_VARIABLE = "STRATAGEM_JOIN_TIMEOUT"
DEFAULT_JOIN_TIMEOUT_SECONDS = 120.0
MAX_JOIN_TIMEOUT_SECONDS = 30 * 24 * 3600.0
"""30 days: far beyond any wait for ranks to start, and far below what a ``timedelta`` or the store's clock holds."""

_ADVICE = (
    f"Check that every rank was started and none failed before joining (its output says), that MASTER_ADDR is the "
    f"address of node 0 as every node sees it and MASTER_PORT is the same on every node, and that no firewall "
    f"blocks the port. {JOIN_TIMEOUT_VARIABLE} (seconds, default {DEFAULT_JOIN_TIMEOUT_SECONDS:.0f}) sets how long "
    "ranks wait for each other to join."
)


def _store_gone(error: RuntimeError) -> str:
    return (
        f"The rendezvous store did not answer either: {error}. It runs in rank 0, or in torchrun's agent on node 0, "
        "at MASTER_ADDR: that process ended, or node 0 left the network."
    )


_STORE_WENT_AWAY = (
    "the store went away while this rank waited for the others: the process hosting it (rank 0, or torchrun's "
    "agent) ended"
)


class RendezvousTimeoutError(RuntimeError):
    """The ranks did not all meet at the rendezvous within the join timeout."""


class RanksDisagreeError(RuntimeError):
    """Ranks that met at the rendezvous were started for different jobs (layouts), or twice as one rank."""


def join_timeout() -> timedelta:
    """How long a rank waits for all ranks to join: ``STRATAGEM_JOIN_TIMEOUT`` seconds, default 120."""
    seconds = seconds_variable(JOIN_TIMEOUT_VARIABLE, DEFAULT_JOIN_TIMEOUT_SECONDS, maximum=MAX_JOIN_TIMEOUT_SECONDS)
    return timedelta(seconds=seconds)


def join(
    address: str,
    port: int,
    rank: int,
    world_size: int,
    prefix: str,
    timeout: timedelta,
    layout: str = "",
    store_outlives_workers: bool = False,
) -> dist.PrefixStore:
    """Meet every rank at ``address:port`` within ``timeout``, and return the store, namespaced by ``prefix``
    (and by the attempt where the store outlives the workers), that the process group is built on.

    Rank 0 hosts the store there, unless ``store_outlives_workers`` (torchrun's agent hosts it and keeps it
    across restarts). ``layout`` describes the job as this rank was started for it (``num_nodes``, ``devices``,
    world size): every rank must bring the same one.

    Raises :class:`RendezvousTimeoutError` naming the address, and the ranks that joined and
    those that did not where the store can tell; :class:`RanksDisagreeError` naming the ranks and hosts
    whose layouts differ.
    """
    deadline = time.monotonic() + timeout.total_seconds()
    hosts_store = rank == 0 and not store_outlives_workers
    while True:
        namespaced, went_away = _connect_and_wait(
            address, port, rank, world_size, prefix, timeout, deadline, hosts_store, layout, store_outlives_workers
        )
        # A script running several runs: this rank may have reached the last run's store, which rank 0 had not
        # closed yet; rank 0 hosts the next one on the same port once it has.
        if not went_away:
            return namespaced


def _connect_and_wait(
    address: str,
    port: int,
    rank: int,
    world_size: int,
    prefix: str,
    timeout: timedelta,
    deadline: float,
    hosts_store: bool,
    layout: str,
    store_outlives_workers: bool,
) -> tuple[dist.PrefixStore, bool]:
    """One attempt at :func:`join`: the store, and whether it went away before every rank joined."""
    where = f"MASTER_ADDR:MASTER_PORT = {address}:{port}"
    if not hosts_store:
        _wait_until_reachable(address, port, rank, deadline, where)
    try:
        store = dist.TCPStore(
            address,
            port,
            world_size,
            is_master=hosts_store,
            timeout=timeout,
            wait_for_workers=False,
            multi_tenant=True,
            use_libuv=os.environ.get("USE_LIBUV", "1") == "1",
        )
    except dist.DistNetworkError as error:
        if "EADDRINUSE" in str(error):
            raise RuntimeError(port_in_use_message(port)) from error
        if hosts_store:
            raise RendezvousTimeoutError(
                f"Rank 0 hosts the process-group rendezvous on port {port}, but could not reach it at {where} "
                f"within the join timeout of {timeout.total_seconds():.0f} s ({error}). MASTER_ADDR must be an "
                f"address of this machine (node 0). {_ADVICE}"
            ) from error
        raise RendezvousTimeoutError(
            f"Rank {rank} could not connect to the rendezvous at {where} ({error}). {_ADVICE}"
        ) from error
    problem: str | RanksDisagreeError | None = None
    if store_outlives_workers:
        attempt, problem = _this_attempt(dist.PrefixStore(prefix, store), rank, world_size, deadline)
        prefix = f"{prefix}/{attempt}"
    namespaced = dist.PrefixStore(prefix, store)
    if problem is None:
        problem = _wait_for_every_rank(namespaced, rank, world_size, deadline, layout)
    if problem is _STORE_WENT_AWAY and not hosts_store and time.monotonic() < deadline:
        return namespaced, True
    if problem is not None:
        # Released before raising: a store kept alive by the error's traceback would hold the port (a retry would
        # find it in use) and abort a process forked later that garbage-collects it.
        del namespaced, store
        if isinstance(problem, RanksDisagreeError):
            raise problem
        raise RendezvousTimeoutError(f"Rank {rank} at the rendezvous at {where}: {problem}. {_ADVICE}")
    return namespaced, False


def _this_attempt(store: dist.Store, rank: int, world_size: int, deadline: float) -> tuple[str, str | None]:
    """A name for this attempt of the job that every rank started for it agrees on, where the store outlives
    the workers (torchrun's agent store, kept across restarts); and what went wrong, or ``None``.

    torchrun restarts every worker of every node after a failure, but counts the restart only on the node
    whose worker failed (``TORCHELASTIC_RESTART_COUNT``): the count cannot name the attempt. Keys the ranks
    of a failed attempt left are told apart by a handshake instead: every rank announces a name of its own,
    rank 0 answers each announcement with its own name, and waits until every rank acknowledged that answer.
    A dead rank never acknowledges, and its replacement's announcement is answered when it comes.
    """
    mine = uuid.uuid4().hex
    try:
        if rank != 0:
            store.set(f"hello/{rank}", mine)
            try:
                store.wait([f"welcome/{mine}"], timedelta(seconds=max(deadline - time.monotonic(), 0.1)))
            except dist.DistStoreError:
                return mine, "rank 0 of this attempt did not answer within the join timeout (not started, or failed)"
            attempt = store.get(f"welcome/{mine}").decode()
            store.set(f"ack/{attempt}/{rank}", mine)
            return attempt, None
        answered: dict[int, str] = {}
        while True:
            for other in range(1, world_size):
                if store.check([f"hello/{other}"]):
                    hello = store.get(f"hello/{other}").decode()
                    if answered.get(other) != hello:
                        store.set(f"welcome/{hello}", mine)
                        answered[other] = hello
            acknowledged = [
                other
                for other, hello in answered.items()
                if store.check([f"ack/{mine}/{other}"]) and store.get(f"ack/{mine}/{other}").decode() == hello
            ]
            if len(acknowledged) == world_size - 1:
                return mine, None
            if time.monotonic() >= deadline:
                missing = sorted(set(range(1, world_size)) - set(acknowledged))
                return mine, f"{_ranks(missing)} of this attempt did not join within the join timeout"
            time.sleep(0.05)
    except dist.DistNetworkError:
        return mine, _STORE_WENT_AWAY


def _wait_for_every_rank(
    store: dist.Store, rank: int, world_size: int, deadline: float, layout: str
) -> str | RanksDisagreeError | None:
    """Record this rank in ``store`` and wait until every rank did; what went wrong, or ``None``.

    Once any rank finds that another one was started with a different layout or as the same rank, every
    waiting rank returns that as a :class:`RanksDisagreeError`.
    """
    host = socket.gethostname()
    try:
        process = f"{host} (pid {os.getpid()})"
        me = f"{process}\n{uuid.uuid4().hex}"
        first = store.compare_set(f"process/{rank}", "", me).decode()
        if first != me:
            return _disagree(store, f"rank {rank} was started twice: on {first.partition(chr(10))[0]} and on {process}")
        pinned = store.compare_set("layout", "", f"{rank}\n{host}\n{layout}").decode()
        first_rank, first_host, first_layout = pinned.split("\n", 2)
        if first_layout != layout:
            return _disagree(
                store,
                f"rank {first_rank} on host {first_host} was started with {first_layout}, but rank {rank} on host "
                f"{host} with {layout}",
            )
        store.set(f"joined/{rank}", host)
        if store.add("joined", 1) == world_size:
            store.set("all_joined", "1")
        # Polled rather than waited for: each store.wait that times out makes c10d print two warning lines, a
        # screenful while the other ranks start.
        while not store.check(["all_joined"]):
            if store.check(["disagreement"]):
                return RanksDisagreeError(_disagreement_message(store.get("disagreement").decode()))
            if time.monotonic() >= deadline:
                return _who_did_not_join(store, world_size)
            time.sleep(0.05)
    except dist.DistNetworkError:
        return _STORE_WENT_AWAY
    except dist.DistStoreError:
        return _who_did_not_join(store, world_size)
    return None


def _who_did_not_join(store: dist.Store, world_size: int) -> str:
    try:
        joined = [other for other in range(world_size) if store.check([f"joined/{other}"])]
    except RuntimeError:
        return "not every rank joined within the join timeout"
    missing = sorted(set(range(world_size)) - set(joined))
    return (
        f"only {len(joined)} of {world_size} ranks joined within the join timeout: {_ranks(missing)} did not "
        f"({_ranks(joined)} did)"
    )


def _disagree(store: dist.Store, what: str) -> RanksDisagreeError:
    """Tell the ranks waiting in ``store`` what is wrong; the error to raise here."""
    store.set("disagreement", what)
    return RanksDisagreeError(_disagreement_message(what))


def _disagreement_message(what: str) -> str:
    return (
        f"The ranks that met at the rendezvous do not belong to one job: {what}. Start every node with the same "
        "num_nodes and devices (devices = processes per node; world size = num_nodes x devices), each node with "
        "its own node rank, and MASTER_PORT different for different jobs."
    )


def _wait_until_reachable(address: str, port: int, rank: int, deadline: float, where: str) -> None:
    """Poll ``address:port`` until something accepts connections there: rank 0 may start after this rank.

    torch's own client retries too, but for up to about twice its timeout and without saying why.
    """
    delay = 0.05
    while True:
        try:
            with socket.create_connection((address, port), timeout=max(min(deadline - time.monotonic(), 5.0), 0.1)):
                return
        except OSError as error:
            reason = error.strerror or str(error) or type(error).__name__
        if time.monotonic() + delay >= deadline:
            raise RendezvousTimeoutError(
                f"Rank {rank} could not reach the rendezvous at {where} within the join timeout "
                f"(last attempt: {reason}). Rank 0 hosts it there. {_ADVICE}"
            )
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


class ArrivalLog:
    """Where each rank last entered a collective, kept in the rendezvous store with each rank's heartbeat, so
    that a rank whose collective timed out can name the ranks that never arrived, and say which of them were
    lost and which are alive elsewhere.

    Every rank counts the collectives it enters through :meth:`enter`; correct programs enter the
    same collectives in the same order, so a rank whose count is behind did not arrive.
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
        self.store = store
        self.timeout = timeout
        """The store's timeout (the collectives'), which this log shortens while it reads or writes."""
        self.rank = rank
        self.world_size = world_size
        self.count = 0
        self.description = ""
        self.batches = 0
        """Training batches this rank checked with every other rank (:meth:`batch_checked`)."""
        self._heartbeat = Heartbeat(store, rank, lambda: self.batches)
        self._lost_ranks: set[int] = set()

    def enter(self, description: str) -> None:
        """Record that this rank enters its next collective."""
        self.count += 1
        self.description = description
        try:
            self.store.set(f"collective/{self.rank}", f"{self.count}\n{description}")
        except RuntimeError:
            # The log only explains a failure; the collective itself reports a store that went away.
            pass

    def batch_checked(self) -> None:
        """Record that every rank exchanged the outcome of one more training batch with this one (no I/O: the
        heartbeat carries it)."""
        self.batches += 1

    def close(self) -> None:
        """Stop this rank's heartbeat (the run is over).

        Rank 0 waits a moment for the others to stop theirs: the store it hosts closes with its run, and a beat
        written to a closed store fills the writer's output with torch's warnings.
        """
        self._heartbeat.stop()
        try:
            with self._store_bounded_by(timedelta(seconds=2 * BEAT_SECONDS)):
                if self.rank != 0:
                    self.store.set(f"stopped/{self.rank}", "")
                elif keys := [f"stopped/{o}" for o in range(1, self.world_size) if o not in self._lost_ranks]:
                    self.store.wait(keys)
        except RuntimeError:
            pass  # a rank that failed, or a store already gone: nothing left to wait for

    def absent(self) -> str:
        """Which ranks had not entered this rank's current collective, lost or alive, in sentences."""
        try:
            after, lost, entries = self._whereabouts(with_entries=True)
        except RuntimeError as error:
            return _store_gone(error)
        parts = [self._lost(lost)] if lost else []
        behind = {other: entry for other, entry in entries.items() if entry[0] < self.count and other not in lost}
        ahead = [other for other, (number, _) in entries.items() if number > self.count and other not in lost]
        different = {
            other: text
            for other, (number, text) in entries.items()
            if number == self.count and text != self.description and other not in lost
        }
        if behind:
            details = "; ".join(
                f"rank {other}{_on(after[other])} "
                + (f"last entered #{number} {text}" if number else "had not entered any yet")
                + _after_batches(after[other])
                for other, (number, text) in sorted(behind.items())
            )
            alive = ""
            if all(after[other] for other in behind):
                alive = " (alive: its heartbeat goes on)" if len(behind) == 1 else " (alive: their heartbeats go on)"
            parts.append(
                f"{_ranks(sorted(behind)).capitalize()}{alive} never arrived at this collective (#{self.count} on "
                f"this rank): {details}. (Only stratagem's own collectives are counted, not the gradient all-reduces "
                "inside DDP, FSDP or DeepSpeed: a rank may have trained for many steps since.)"
            )
        if different:
            details = "; ".join(f"rank {other}: {text}" for other, text in sorted(different.items()))
            parts.append(
                f"{_ranks(sorted(different)).capitalize()} entered a different collective instead ({details})."
            )
        if ahead:
            parts.append(f"{_ranks(sorted(ahead)).capitalize()} had gone past it, to a later collective.")
        return " ".join(parts) or "Every rank had entered this collective."

    def lost(self) -> str:
        """Which ranks were lost (their heartbeat stopped), in sentences ("" if none): why a collective failed."""
        try:
            _, lost, _ = self._whereabouts(with_entries=False)
        except RuntimeError as error:
            return _store_gone(error)
        return self._lost(lost) if lost else ""

    def _whereabouts(
        self, with_entries: bool
    ) -> tuple[dict[int, Beat | None], dict[int, Beat], dict[int, tuple[int, str]]]:
        """The other ranks' beats, those lost among them, and (``with_entries``) their last collectives."""
        others = [other for other in range(self.world_size) if other != self.rank]
        with self._store_bounded_by(timedelta(seconds=SILENCE_SECONDS)):
            after, silent = _watch_beats(self.store, read_beats(self.store, others))
            entries = {other: self._entry(other) for other in others} if with_entries else {}
        lost = {other: beat for other, beat in after.items() if other in silent and beat is not None}
        self._lost_ranks.update(lost)
        return after, lost, entries

    @contextlib.contextmanager
    def _store_bounded_by(self, timeout: timedelta) -> Iterator[None]:
        """The store's requests bounded by ``timeout`` instead of the collectives' timeout: where the store's
        own host is gone, one would wait for all of that. Raises ``RuntimeError`` when the store's address does
        not accept a connection within ``timeout``: a read (``check``) sent to a host that vanished waits for
        TCP to give up, whatever the timeout, about a quarter of an hour."""
        layers = [self.store, *([self.store.underlying_store] if isinstance(self.store, dist.PrefixStore) else [])]
        if isinstance(layers[-1], dist.TCPStore):
            address = (layers[-1].host, layers[-1].port)
            try:
                socket.create_connection(address, timeout=timeout.total_seconds()).close()
            except OSError as error:
                raise RuntimeError(f"the store at {address[0]}:{address[1]} did not answer ({error})") from error
        try:
            for layer in layers:
                layer.set_timeout(timeout)
            yield
        finally:
            for layer in layers:
                layer.set_timeout(self.timeout)

    def _lost(self, lost: dict[int, Beat]) -> str:
        one = len(lost) == 1
        where = "; ".join(
            f"{'' if one else f'rank {other} on '}host {beat.host}" for other, beat in sorted(lost.items())
        )
        text = (
            f"{_ranks(sorted(lost)).capitalize()} ({where}) {'was' if one else 'were'} lost: "
            f"{'its heartbeat' if one else 'their heartbeats'} stopped (none in the last {SILENCE_SECONDS:g} s), so "
            f"{'its process' if one else 'their processes'} ended or {'its host' if one else 'their hosts'} left "
            "the network."
        )
        if self.batches:
            text += (
                " That was during training: the last training batch every rank checked together was "
                f"#{self.batches} of this run."
            )
        return text + f" {'Its' if one else 'Their'} own output, or the host's logs, say why."

    def _entry(self, other: int) -> tuple[int, str]:
        key = f"collective/{other}"
        if not self.store.check([key]):
            return 0, ""
        number, _, text = self.store.get(key).decode().partition("\n")
        return int(number), text


def _watch_beats(store: dist.Store, before: dict[int, Beat | None]) -> tuple[dict[int, Beat | None], set[int]]:
    """The ranks' beats after watching them for up to :data:`SILENCE_SECONDS`, and the ranks whose beat did not
    change meanwhile. Watching ends as soon as every rank that beat before beat again: only a lost rank costs
    the whole wait. Each look is one read of the store, twice a beat: every surviving rank of a large job
    watches at once."""
    beating = [other for other, beat in before.items() if beat is not None]
    deadline = time.monotonic() + SILENCE_SECONDS
    while True:
        after = {**before, **read_beats(store, beating, all_written=True)}
        silent = {
            other
            for other in beating
            if (beat := after[other]) is not None
            and (earlier := before[other]) is not None
            and beat.sequence == earlier.sequence
        }
        if not silent or time.monotonic() >= deadline:
            return after, silent
        time.sleep(BEAT_SECONDS / 2)


def _on(beat: Beat | None) -> str:
    return "" if beat is None else f" (host {beat.host})"


def _after_batches(beat: Beat | None) -> str:
    if beat is None or not beat.batches:
        return ""
    return f" (its latest heartbeat counted {beat.batches} training batch{'' if beat.batches == 1 else 'es'} run)"


def _ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``; ``[3]`` -> ``"rank 3"``; ``[]`` -> ``"no rank"``."""
    if not ranks:
        return "no rank"
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"
