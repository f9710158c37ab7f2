from __future__ import annotations

import os
import re

from stratagem.environments._variables import (
    check_main_address,
    check_rank,
    first_set,
    optional_int_variable,
    port_variable,
    rank_variable,
    size_variable,
)
from stratagem.environments.cluster_environment import ClusterEnvironment

_HINT = "srun sets it for every task it starts."

INTERACTIVE_JOB_NAMES = ("bash", "interactive")
"""Job names of an interactive allocation (``salloc``, ``srun --pty bash``): processes there are
started by the user, not by srun, so the SLURM environment is not used (see :func:`is_interactive_allocation`)."""

_PORT_BASE = 15000
_PORT_SPAN = 10000


class SLURMEnvironment(ClusterEnvironment):
    """Tasks started by ``srun``, one per device.

    Ranks come from ``SLURM_PROCID`` (global), ``SLURM_LOCALID`` (on the node),
    ``SLURM_NODEID`` and ``SLURM_NTASKS``. The rendezvous host is ``MASTER_ADDR`` if set,
    else the first host of ``SLURM_JOB_NODELIST`` (compressed lists such as
    ``node[001-004,7]`` are expanded). The port is ``MASTER_PORT`` if set, else derived from
    ``SLURM_JOB_ID`` so that every task of the job picks the same one and two jobs sharing a
    node are unlikely to collide.
    """

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        if os.environ.get("MASTER_ADDR"):
            return os.environ["MASTER_ADDR"]
        variable = first_set("SLURM_JOB_NODELIST", "SLURM_NODELIST")
        if variable is None:
            raise ValueError(
                "Neither MASTER_ADDR nor SLURM_JOB_NODELIST / SLURM_NODELIST is set, so the address of the first "
                "node is unknown; export MASTER_ADDR."
            )
        hosts = expand_nodelist(os.environ[variable])
        if not hosts:
            raise ValueError(f"{variable}={os.environ[variable]!r} names no host; export MASTER_ADDR.")
        return hosts[0]

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return port_variable("MASTER_PORT")
        job_id = optional_int_variable("SLURM_JOB_ID", minimum=0, hint="SLURM sets it in every job.")
        if job_id is None:
            raise ValueError("Neither MASTER_PORT nor SLURM_JOB_ID is set; export MASTER_PORT.")
        return _PORT_BASE + job_id % _PORT_SPAN

    @staticmethod
    def detect() -> bool:
        return "SLURM_NTASKS" in os.environ and not is_interactive_allocation()

    @staticmethod
    def job_name() -> str | None:
        return os.environ.get("SLURM_JOB_NAME")

    def world_size(self) -> int:
        return size_variable("SLURM_NTASKS", hint=_HINT)

    def global_rank(self) -> int:
        return rank_variable("SLURM_PROCID", "SLURM_NTASKS", hint=_HINT)

    def local_rank(self) -> int:
        return rank_variable("SLURM_LOCALID", hint=_HINT)

    def node_rank(self) -> int:
        return rank_variable("SLURM_NODEID", first_set("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), hint=_HINT)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        tasks_here, variable = self._tasks_on_this_node()
        if tasks_here is not None and tasks_here != num_devices:
            raise ValueError(
                f"SLURM starts {tasks_here} task(s) on this node ({variable}), but devices={num_devices}. srun "
                f"starts one process per device: set devices={tasks_here}, or submit with "
                f"--ntasks-per-node={num_devices}."
            )
        nodes_variable = first_set("SLURM_NNODES", "SLURM_JOB_NUM_NODES")
        if nodes_variable is not None and size_variable(nodes_variable) != num_nodes:
            raise ValueError(
                f"The SLURM job has {nodes_variable}={os.environ[nodes_variable]} node(s), but num_nodes="
                f"{num_nodes}. Set num_nodes={os.environ[nodes_variable]}, or submit with --nodes={num_nodes}."
            )
        # Each variable is checked where it is read: read them all before anything starts.
        self.global_rank()
        check_rank("SLURM_LOCALID", self.local_rank(), num_devices, f"devices={num_devices}", hint=_HINT)
        check_rank("SLURM_NODEID", self.node_rank(), num_nodes, f"num_nodes={num_nodes}", hint=_HINT)
        _ = self.main_port
        check_main_address(
            self.main_address, derived_from="the job's first node", must_resolve_now=self.node_rank() == 0
        )

    def _tasks_on_this_node(self) -> tuple[int | None, str]:
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE")
        if per_node is not None:
            return size_variable("SLURM_NTASKS_PER_NODE"), f"SLURM_NTASKS_PER_NODE={per_node}"
        layout = os.environ.get("SLURM_TASKS_PER_NODE") or os.environ.get("SLURM_STEP_TASKS_PER_NODE")
        if layout is None:
            return None, ""
        counts = expand_tasks_per_node(layout)
        node = self.node_rank() if "SLURM_NODEID" in os.environ else 0
        if not 0 <= node < len(counts):
            return None, ""
        return counts[node], f"SLURM_TASKS_PER_NODE={layout}, node {node}"

    def __repr__(self) -> str:
        return f"SLURMEnvironment(job_id={os.environ.get('SLURM_JOB_ID')!r})"


def is_interactive_allocation() -> bool:
    """Whether this is an interactive SLURM session, in which the user starts the processes.

    Told by the job name, unless srun started this process as one of several tasks of a step
    (``SLURM_STEP_NUM_TASKS`` > 1): ``srun -n2 bash -c "python train.py"`` is named ``bash`` too, and each of
    its tasks is a rank, not a session that starts ranks of its own.
    """
    step_tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "1")
    several_tasks = step_tasks.isdigit() and int(step_tasks) > 1
    return SLURMEnvironment.job_name() in INTERACTIVE_JOB_NAMES and not several_tasks


def expand_nodelist(nodelist: str) -> list[str]:
    """The hosts of a SLURM node list, in order: ``"a[01-02,7],b"`` -> ``["a01", "a02", "a7", "b"]``.

    Several bracket groups in one name expand to every combination (``r[1-2]n[1-2]``), and
    zero padding is kept (``[001-003]``).
    """
    hosts: list[str] = []
    for item in _split_outside_brackets(nodelist):
        hosts.extend(_expand_host(item, nodelist))
    return hosts


def expand_tasks_per_node(layout: str) -> list[int]:
    """Tasks on each node from SLURM's compressed form: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in layout.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(f"SLURM_TASKS_PER_NODE={layout!r} is not of the form '2(x3),1'.")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _split_outside_brackets(text: str) -> list[str]:
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth < 0 or depth > 1:
            raise ValueError(f"The SLURM node list {text!r} has unbalanced or nested brackets.")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise ValueError(f"The SLURM node list {text!r} has an unclosed '['.")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _expand_host(item: str, nodelist: str) -> list[str]:
    match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]*)\](.*)", item)
    if match is None:
        return [item]
    prefix, ranges, rest = match.groups()
    tails = _expand_host(rest, nodelist) if rest else [""]
    return [prefix + number + tail for number in _expand_ranges(ranges, nodelist) for tail in tails]


def _expand_ranges(ranges: str, nodelist: str) -> list[str]:
    numbers: list[str] = []
    for part in ranges.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if match is None:
            raise ValueError(f"The SLURM node list {nodelist!r} has a bad range {part!r}; expected '1-4' or '7'.")
        start, end = match.group(1), match.group(2)
        if end is None:
            numbers.append(start)
            continue
        if int(end) < int(start):
            raise ValueError(f"The SLURM node list {nodelist!r} has a descending range {part!r}.")
        numbers.extend(str(number).zfill(len(start)) for number in range(int(start), int(end) + 1))
    return numbers
