"""A real SLURM cluster on the test hosts: slurmctld on the first, one slurmd on each (Debian's slurm-wlm).

Authentication is ``auth/none`` (SLURM 22.05 still ships it): the cluster lives inside the test hosts, which
only reach each other, so munge would add a daemon and a key without protecting anything.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from hosts import Host

TOOLS = ("slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel", "sinfo", "squeue")


def why_unavailable() -> str | None:
    missing = [name for name in TOOLS if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not found: install Debian's slurm-wlm (.ci/run does)"
    return None


class SlurmCluster:
    def __init__(self, hosts: list[Host], directory: Path) -> None:
        self.hosts = hosts
        self.directory = directory
        self.conf = directory / "slurm.conf"
        self._daemons: list[subprocess.Popen] = []

    def start(self, timeout: float = 60) -> None:
        first = self.hosts[0]
        (self.directory / "state").mkdir()
        nodes = []
        for host in self.hosts:
            (self.directory / f"spool-{host.name}").mkdir()
            nodes.append(f"NodeName={host.name} NodeAddr={host.address} CPUs={os.cpu_count() or 1} State=UNKNOWN")
        d = self.directory
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=stratagem",
                    f"SlurmctldHost={first.name}({first.address})",
                    "AuthType=auth/none",
                    "CredType=cred/none",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={d}/state",
                    f"SlurmdSpoolDir={d}/spool-%n",
                    f"SlurmctldPidFile={d}/slurmctld.pid",
                    f"SlurmdPidFile={d}/slurmd-%n.pid",
                    f"SlurmctldLogFile={d}/slurmctld.log",
                    f"SlurmdLogFile={d}/slurmd-%n.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/builtin",
                    "ReturnToService=2",
                    "JobRequeue=1",
                    "KillWait=10",
                    *nodes,
                    "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
                ]
            )
            + "\n"
        )
        self._daemons.append(first.start(["slurmctld", "-D", "-i"], d / "slurmctld.out", env=self.env))
        for host in self.hosts:
            self._daemons.append(
                host.start(["slurmd", "-D", "-N", host.name], d / f"slurmd-{host.name}.out", env=self.env)
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.split()
            if len(states) == len(self.hosts) and all(state == "idle" for state in states):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM nodes did not become idle within {timeout} s; see {d}")

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, argv: list[str], check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
        """``argv`` (srun, sbatch, scontrol ...) on the first host, as a user on the login node."""
        return subprocess.run(
            self.hosts[0].command(argv),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def job_field(self, job: str, field: str) -> str:
        shown = self.run(["scontrol", "show", "job", job], check=False).stdout
        for word in shown.split():
            if word.startswith(f"{field}="):
                return word.partition("=")[2]
        return ""

    def stop(self) -> None:
        """Cancel what still runs, then end the daemons and every process this cluster started: slurmstepd
        daemonises, so a job a failed test left running outlives slurmd otherwise."""
        if self._daemons:
            self.run(["scancel", "--partition=test"], check=False)
            deadline = time.monotonic() + 20
            while self.run(["squeue", "-h"], check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for daemon in self._daemons:
            try:
                os.killpg(daemon.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            daemon.wait()
        self._daemons = []
        for pid in self._processes_of_this_cluster():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _processes_of_this_cluster(self) -> list[int]:
        """Processes whose environment names this cluster's slurm.conf (its step daemons and their tasks)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if marker in (entry / "environ").read_bytes().split(b"\0"):
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found
