"""A real SLURM cluster on this machine for tests: munged, slurmctld and one slurmd per
node, started in a scratch folder and stopped after, as a learner's cluster runs them
(Debian's slurm-wlm).

Everything lives in the folder: ``slurm.conf`` (found by the daemons and the commands
through ``SLURM_CONF``), ``gres.conf`` when the nodes have GPUs, state, spool, logs and pid
files; the ports are free ones. munge's key and socket go to a temporary folder of their own
(munged wants every folder above its socket open to all, which pytest's temporary folders
are not), removed at the end. Nothing under /etc is read or changed, so a SLURM already
installed on the machine is left alone.
The daemons run as root (slurmd starts jobs as their user).

GPUs are faked as SLURM's own test suite does: each node declares ``Gres=gpu:N`` and
``gres.conf`` names N devices that exist everywhere (/dev/tty0..), with autodetection off;
SLURM then hands them out and sets each job's ``CUDA_VISIBLE_DEVICES``, as with real GPUs.

    with slurm.Cluster(tmp_path, nodes=2) as cluster:
        job = cluster.submit("deploy/train_ddp.sbatch", "--epochs", "5")
        state = cluster.wait(job, timeout=300)
"""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from conftest import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("mungekey", "sbatch", "scontrol", "sinfo", "squeue", "scancel")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
SLURM_CONF = """\
ClusterName=workshop
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge}/munge.sock
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
# No cgroups (containers, CI): processes are tracked through /proc, tasks not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
{job_submit}
ReturnToService=2
# A node has the CPUs and GPUs this file gives it, whatever this machine has.
SlurmdParameters=config_overrides
{gres_types}
{nodes}
PartitionName=workshop Nodes=ALL Default=YES MaxTime=60 State=UP
"""
# Each node a slurmd of its own on this machine, with its own port: SLURM sees a cluster
# of `nodes` nodes, all at 127.0.0.1.
NODE = ("NodeName=node{i} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus}"
        "{gres}")


def missing():
    """Why a cluster cannot be started here (None: it can)."""
    absent = [name for name in (*DAEMONS, *COMMANDS) if not shutil.which(name)]
    if absent:
        return (f"SLURM and munge are not installed ({', '.join(absent)} not found): "
                f"apt-get install slurmctld slurmd slurm-client munge")
    if os.geteuid() != 0:
        return "slurmd runs jobs as their user, so this test cluster needs root"
    return None


class Cluster:
    """``nodes`` nodes (node0, node1, ...: slurmds on this machine) of ``cpus`` CPUs and
    ``gpus`` fake GPUs each (and ``memory_mb`` of memory, for jobs that ask for some), in one
    partition; a context manager. ``job_submit_lua``: the text of a job_submit.lua that
    slurmctld runs on every submission (JobSubmitPlugins=lua; it reads the file again when
    it changes)."""

    def __init__(self, folder, nodes=1, cpus=None, gpus=0, memory_mb=None,
                 job_submit_lua=None):
        self.folder = Path(folder)
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [f"node{i}" for i in range(nodes)]
        self.cpus = cpus or len(os.sched_getaffinity(0))
        self.gpus = gpus
        self.memory_mb = memory_mb
        self.job_submit_lua = job_submit_lua
        self.env = {**os.environ, "SLURM_CONF": str(self.folder / "slurm.conf")}
        self.daemons = {}
        self.munge = None

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *error):
        self.stop()

    def start(self, timeout=60):
        """Start the daemons; return once the node takes jobs (or raise, with the logs)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "state").mkdir(exist_ok=True)
        munge = self.munge = Path(tempfile.mkdtemp(prefix="workshop-munge-"))
        munge.chmod(0o755)
        subprocess.run(["mungekey", "--create", f"--keyfile={munge / 'munge.key'}"],
                       check=True, capture_output=True)
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        if self.memory_mb:
            gres += f" RealMemory={self.memory_mb}"
        nodes = "\n".join(NODE.format(i=i, host=self.host, port=free_port(), cpus=self.cpus,
                                      gres=gres) for i in range(len(self.nodes)))
        (self.folder / "slurm.conf").write_text(SLURM_CONF.format(
            host=self.host, folder=self.folder, munge=munge, ctld_port=free_port(),
            gres_types="GresTypes=gpu" if self.gpus else "", nodes=nodes,
            job_submit="JobSubmitPlugins=lua" if self.job_submit_lua else ""))
        if self.job_submit_lua:
            (self.folder / "job_submit.lua").write_text(self.job_submit_lua)
        if self.gpus:
            (self.folder / "gres.conf").write_text(
                f"AutoDetect=off\nName=gpu File=/dev/tty[0-{self.gpus - 1}]\n")
        self._daemon("munged", "munged", "--foreground", f"--key-file={munge / 'munge.key'}",
                     f"--socket={munge / 'munge.sock'}", f"--pid-file={munge / 'munged.pid'}",
                     f"--log-file={munge / 'munged.log'}",
                     f"--seed-file={munge / 'munged.seed'}")
        self._until(lambda: (munge / "munge.sock").exists(), timeout, "munged's socket")
        conf = str(self.folder / "slurm.conf")
        # -c: a clean state (no jobs or nodes from an earlier run of the folder).
        self._daemon("slurmctld", "slurmctld", "-D", "-c", "-f", conf)
        self._until(lambda: self.command("scontrol", "ping").returncode == 0, timeout,
                    "slurmctld answering scontrol ping")
        for node in self.nodes:
            self._daemon(f"slurmd-{node}", "slurmd", "-D", "-f", conf, "-N", node)
        self._until(lambda: self.node_states() == ["idle"] * len(self.nodes), timeout,
                    f"{len(self.nodes)} idle node(s) in sinfo")

    def _daemon(self, name, *command):
        log = (self.folder / f"{name}.out").open("w")
        self.daemons[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              env=self.env, start_new_session=True)

    def _until(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        while not ready():
            for name, process in self.daemons.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited ({process.returncode}) while waiting "
                                       f"for {what}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} after {timeout} s\n{self.logs()}")
            time.sleep(0.5)

    def command(self, *command, timeout=30):
        """Run a SLURM command against this cluster."""
        return subprocess.run(command, capture_output=True, text=True, env=self.env,
                              timeout=timeout)

    def node_states(self):
        return self.command("sinfo", "--noheader", "--Node", "--format=%t").stdout.split()

    def submit(self, script, *args, options=(), env=None, cwd=None):
        """``sbatch`` a script with its arguments; return the job id."""
        result = subprocess.run(["sbatch", "--parsable", *options, str(script), *args],
                                capture_output=True, text=True, timeout=30, cwd=cwd,
                                env={**self.env, **(env or {})})
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed: {result.stderr}\n{self.logs()}")
        return result.stdout.strip().split(";")[0]

    def job(self, job_id):
        """``scontrol show job`` as a dict (JobState, ExitCode, StdOut, ...)."""
        text = self.command("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(field.split("=", 1) for field in text.split() if "=" in field)

    def wait(self, job_id, timeout):
        """Wait until the job ends; return its final state. After ``timeout`` seconds,
        cancel it and raise, with the daemons' logs."""
        deadline = time.monotonic() + timeout
        while (state := self.job(job_id).get("JobState")) not in ENDED:
            if time.monotonic() > deadline:
                self.command("scancel", job_id)
                raise RuntimeError(f"job {job_id} still {state} after {timeout} s; "
                                   f"cancelled\n{self.logs()}")
            time.sleep(1)
        return state

    def logs(self, lines=40):
        """The last lines of each daemon's log, to show with a failure."""
        parts = []
        munged_log = [self.munge / "munged.log"] if self.munge else []
        for path in [*sorted(self.folder.glob("*.log")), *munged_log,
                     *sorted(self.folder.glob("*.out"))]:
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"----- {path.name} -----\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self):
        """Cancel the jobs, stop the daemons (slurmd, the controller, munge; SIGKILL any
        that has not gone within 15 s), then kill whatever process of this cluster is left
        (a job step outlives slurmd)."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            jobs = self.command("squeue", "--noheader", "--format=%i").stdout.split()
            if jobs:
                self.command("scancel", *jobs)
                deadline = time.monotonic() + 30
                while (self.command("squeue", "--noheader", "--format=%i").stdout.strip()
                       and time.monotonic() < deadline):
                    time.sleep(1)
        for name in reversed(list(self.daemons)):  # slurmds, slurmctld, munged
            process = self.daemons.pop(name)
            if process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for process in self.leftovers():
            with contextlib.suppress(psutil.Error):
                process.kill()
        if self.munge:
            shutil.rmtree(self.munge, ignore_errors=True)

    def leftovers(self):
        """Processes still running whose environment names this cluster's slurm.conf: the
        daemons, job steps and the jobs' own processes, and nothing else."""
        found = []
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if process.environ().get("SLURM_CONF") == self.env["SLURM_CONF"]:
                    found.append(process)
        return found
