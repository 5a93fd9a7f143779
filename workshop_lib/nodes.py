"""One job on several "nodes": a torchrun agent per node, here all on this machine.

On a cluster every node runs the same torchrun command; the agents meet at a rendezvous
(c10d: a key-value store that the first node hosts), agree on node ranks, and only then
start their processes. This module starts those agents side by side on one machine, so
that a learner sees multi-node training, and elastic membership, without a cluster
(notebook 06). It prints each node's command: on real nodes, type it on node i with
the first node's address in place of 127.0.0.1 (and without ``--local-addr`` and
``is_host``, which torchrun then works out from the node's own address).

    python -m workshop_lib.launch --nnodes=2 --nproc-per-node=1 -m workshop_lib.train_ddp
    python -m workshop_lib.launch --nnodes=1:2 --max-restarts=1 -m workshop_lib.train_ddp

Node ranks come from the rendezvous, which numbers the agents in sorted order of their
``(address, process id, ...)`` (torch 2.14's ``dynamic_rendezvous``:
``sorted(state.participants)``, each a ``_NodeDesc(addr, pid, local_id)``): host-name
order on a cluster, process-id order here, not the order they arrived in (torchrun's
``--node-rank`` counts only for ``--rdzv-backend=static``). Each agent's log says which
node rank and global ranks it got, in every attempt (``NodesResult.rounds``).
From Python: ``result = nodes.run(["-m", "workshop_lib.train_ddp", ...], nnodes="2")``.
The agents' processes share this machine's cores: threads per process follow every
process on the machine, and the run record's start says ``nodes``. On the CPU, two local
nodes compute what the one-node job computes: notebook 06 checks that their validation
losses agree within 1e-6 (``findings/beyond_one_machine.py``, ``SAME_RUN``).

Elastic membership: ``--nnodes=1:2 --max-restarts=1``; when a node is lost the remaining
agents re-form a smaller group and the processes resume from the checkpoint. Measured
here (node 1 SIGKILLed after the first checkpoint): with torchrun's defaults the group
re-formed 41-44 s later (15 s of missed heartbeats, then 30 s waiting for more nodes);
with ``--rdzv-conf=keep_alive_interval=2,last_call_timeout=10`` (the tests and the
notebook) 15-16 s later, 13 of 13 runs finishing all epochs. The global batch shrinks
with the group: ``--lr-scaling linear`` rescales the learning rate on resume. The node
that hosts the rendezvous store (node 0 here; ``worker-0`` on Kubernetes) must stay.
"""
import contextlib
import os
import re
import secrets
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib import hardware, launch
from workshop_lib.distributed import free_port
from workshop_lib.errors import CourseError

HOST = "127.0.0.1"  # not "localhost": that may resolve to IPv6 first
# GLOO_SOCKET_IFNAME: gloo's connections go over the loopback interface, the one that
# 127.0.0.1 is on (gloo otherwise picks the interface of the machine's hostname).
# LOGLEVEL=INFO: each agent then logs the rendezvous' outcome (its node rank, its
# processes' global ranks); the launcher reads it from the agent's output and shows it.
NODE_ENV = {"GLOO_SOCKET_IFNAME": "lo", "LOGLEVEL": "INFO"}
# The block an agent logs after each rendezvous ("Rendezvous complete for workers").
RENDEZVOUS = re.compile(
    r"Rendezvous complete for workers\. Result:.*?restart_count=(\d+).*?group_rank=(\d+)"
    r".*?group_world_size=(\d+).*?local_ranks=\[([\d, ]*)\].*?global_ranks=\[([\d, ]*)\]",
    re.S)


def parse_nnodes(nnodes):
    """torchrun's ``--nnodes``: "N" or "MIN:MAX" -> (min, max)."""
    low, colon, high = str(nnodes).partition(":")
    try:
        low, high = int(low), int(high if colon else low)
    except ValueError:
        raise CourseError(f"--nnodes takes N or MIN:MAX, got {nnodes!r}") from None
    if not 1 <= low <= high:
        raise CourseError(f"--nnodes {nnodes}: need 1 <= MIN <= MAX")
    return low, high


def node_commands(target, nnodes, nproc, port, run_id, max_restarts=0, rdzv_conf=None,
                  host=HOST):
    """The torchrun command of each node (as typed on it; output and logs go as torchrun
    sends them). ``nnodes``: "N", or "MIN:MAX" for elastic membership. ``rdzv_conf``: the
    rendezvous' settings, e.g. ``{"last_call_timeout": 10}`` (seconds an elastic job waits
    for more nodes once MIN have joined; 30 by default)."""
    _, count = parse_nnodes(nnodes)
    # Every agent here matches 127.0.0.1, so say which one hosts the store: node 0 (then
    # node 1 can leave without taking the rendezvous with it).
    conf = [",".join(f"{k}={v}" for k, v in {"is_host": int(node == 0),
                                              **(rdzv_conf or {})}.items())
            for node in range(count)]
    return [["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
             f"--max-restarts={max_restarts}", "--rdzv-backend=c10d",
             f"--rdzv-endpoint={host}:{port}", f"--rdzv-id={run_id}",
             f"--rdzv-conf={conf[node]}", f"--local-addr={host}", *target]
            for node in range(count)]


def gpu_slices(visible, nnodes):
    """Each node's share of this machine's GPUs (``visible``: their CUDA indices), so that
    two agents never put their local rank 0 on the same GPU."""
    per_node = len(visible) // nnodes
    return [visible[i * per_node:(i + 1) * per_node] for i in range(nnodes)]


def node_envs(nnodes, nproc, visible, device="auto"):
    """(processes per node, each node's environment) for ``nnodes`` nodes on this machine
    with the GPUs ``visible`` (CUDA indices), their processes on ``device``:

    - "cuda": each node its own equal share of the GPUs, one process per GPU (``nproc``
      "auto": the whole share; a number: that many of it);
    - "cpu": ``nproc`` CPU processes per node ("auto": one), the GPUs hidden, so that no
      process of a job meant for the CPU touches one (notebook 06 under profile "cpu");
    - "auto": "cuda" if there are GPUs enough for one per process, else "cpu".
    """
    if nproc == "gpu":
        device, nproc = "cuda", "auto"
    if device == "auto":
        wanted = nnodes if nproc == "auto" else nnodes * int(nproc)
        device = "cuda" if wanted <= len(visible) else "cpu"
    if device == "cuda":
        per_node = len(visible) // nnodes if nproc == "auto" else int(nproc)
        if per_node < 1 or per_node * nnodes > len(visible):
            needed = nnodes * max(per_node, 1)
            raise CourseError(f"{nnodes} nodes of {max(per_node, 1)} GPU process(es) each "
                              f"needs at least {needed} GPUs; this machine has {len(visible)} "
                              f"(run them on the CPU: --device cpu)")
    elif device == "cpu":
        per_node = 1 if nproc == "auto" else int(nproc)
    else:
        raise ValueError(f"device is 'auto', 'cpu' or 'cuda', got {device!r}")
    # The machine's cores are shared by every node's processes, not by one node's only.
    shared = {**NODE_ENV, **launch.RESTART_SAFE_ENV,
              hardware.SHARERS_ENV: str(nnodes * per_node)}
    if device == "cuda":  # each node its own GPUs, as on real nodes
        return per_node, [{**shared, "CUDA_VISIBLE_DEVICES": ",".join(gpus[:per_node])}
                          for gpus in gpu_slices(visible, nnodes)]
    return per_node, [{**shared, "CUDA_VISIBLE_DEVICES": ""}] * nnodes


def rendezvous_rounds(agent_output):
    """Every rendezvous an agent completed, as logged: restart_count, node rank
    (group_rank), number of nodes, and its processes' local and global ranks."""
    return [{"restart_count": int(m[1]), "group_rank": int(m[2]),
             "group_world_size": int(m[3]),
             "local_ranks": [int(r) for r in m[4].split(",") if r.strip()],
             "global_ranks": [int(r) for r in m[5].split(",") if r.strip()]}
            for m in RENDEZVOUS.finditer(agent_output)]


def global_rank_of(path, rounds):
    """The global rank that writes the log file ``path`` (``.../attempt_N/<local rank>/...``)
    of an agent that logged these ``rounds``; None while the attempt's is not logged yet."""
    attempt = int(Path(path).parent.parent.name.removeprefix("attempt_"))
    local_rank = launch.local_rank_of(path)
    for round_ in rounds:
        if round_["restart_count"] == attempt and local_rank in round_["local_ranks"]:
            return round_["global_ranks"][round_["local_ranks"].index(local_rank)]
    return None


def first_error_ns(log_dir):
    """When the first error file of an agent's last attempt was written (ns; a failed
    process writes one as it exits); after every time if there is none."""
    files = list(Path(log_dir).glob("*/attempt_*/*/error.json"))
    last = max((int(f.parent.parent.name.removeprefix("attempt_")) for f in files), default=0)
    return min((f.stat().st_mtime_ns for f in files
                if f.parent.parent.name == f"attempt_{last}"), default=float("inf"))


def first_failure(results, log_dirs):
    """Of the nodes' results (and their agents' log folders), the failed one whose process
    failed first; None if none failed."""
    failed = [(r, d) for r, d in zip(results, log_dirs, strict=True) if not r.ok]
    return min(failed, key=lambda f: first_error_ns(f[1]))[0] if failed else None


@dataclass
class NodesResult(launch.LaunchResult):
    """A multi-node job's outcome: ``rounds`` lists every rendezvous each node's agent
    completed (``node``: which agent; ``seen_s``: when, from the job's start), ``killed``
    the nodes removed on purpose (``kill_node``) and when."""

    rounds: list = field(default_factory=list)
    killed: dict = field(default_factory=dict)

    def node_ranks(self, restart_count=0):
        """{global rank: node rank} in the given attempt."""
        return {rank: r["group_rank"] for r in self.rounds
                if r["restart_count"] == restart_count for rank in r["global_ranks"]}


class _Agent(launch.Job):
    """One node's torchrun agent, whose log files are named by local rank: their global
    ranks come from the rendezvous the agent logged."""

    def __init__(self, node, command, env, log_dir, quiet, stream, output):
        self.node = node
        self.rounds = []
        super().__init__(command, env, log_dir, quiet, stream, rank_of=self.global_rank,
                         output=output)

    def read_rounds(self):
        """The rendezvous this agent completed so far; returns the new ones."""
        found = rendezvous_rounds("".join(self.torchrun_output))
        new = found[len(self.rounds):]
        self.rounds = found
        return new

    def global_rank(self, path):
        return global_rank_of(path, self.rounds)

    def kill(self):
        """SIGKILL the agent and its processes at once: a node that loses power."""
        workers = list(self.worker_pids().values())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class NodesJob:
    """The agents of one job, each a ``launch.Job``; their output shown as one job's.

    ``shown``: each node's command as a learner would type it, printed before the start.
    """

    def __init__(self, commands, envs, log_dir, shown=(), quiet=False, stream=None):
        self.log_dir, self.quiet, self.stream = Path(log_dir), quiet, stream or sys.stdout
        self.output, self.killed, self.rounds = [], {}, []
        for line in shown:
            self.echo(line + "\n")
        self.started = time.monotonic()
        self.agents = [_Agent(node, command, env, self.log_dir / f"node{node}", quiet,
                              self.stream, self.output)
                       for node, (command, env) in enumerate(zip(commands, envs, strict=True))]

    def echo(self, text):
        self.output.append(text)
        if not self.quiet:
            self.stream.write(text)
            self.stream.flush()

    def poll(self):
        """Show new output; note each newly completed rendezvous, once."""
        for agent in self.agents:
            for round_ in agent.read_rounds():
                seen = time.monotonic() - self.started
                self.rounds.append({"node": agent.node, **round_, "seen_s": round(seen, 2)})
                self.echo(f"[node {agent.node}] rendezvous {round_['restart_count']}: node "
                          f"rank {round_['group_rank']} of {round_['group_world_size']}, "
                          f"global ranks {round_['global_ranks']}\n")
            agent.logs.poll()

    def running(self):
        return [agent for agent in self.agents if agent.process.poll() is None]

    def kill_node(self, node):
        """Remove a node from the job, as when a machine dies (its agent gets no chance to
        leave the rendezvous): the other nodes' processes fail, and with ``--nnodes=MIN:MAX``
        and restarts left their agents form a smaller group and start again."""
        self.agents[node].kill()
        self.killed[node] = round(time.monotonic() - self.started, 2)
        self.echo(f"[node {node}] removed (agent and processes killed)\n")

    def wait(self, timeout=None):
        """Show the output until every agent has ended (or stop them all ``timeout`` seconds
        after the start); return the NodesResult and print its summary."""
        timed_out = False
        while self.running():
            self.poll()
            if timeout is not None and time.monotonic() - self.started > timeout:
                timed_out = True
                self.stop()
                break
            time.sleep(0.1)
        results = [agent.result(timeout if timed_out else None) for agent in self.agents]
        self.poll()
        result = self._combine(results)
        self.echo("\n" + result.summary() + "\n")
        return result

    def _combine(self, results):
        # The job succeeded when every node that was not removed on purpose did; else it
        # failed as the node whose process failed first. Each agent names only its own
        # first failure (node 0's is often "Connection closed by peer" when a rank of node
        # 1 crashed): on one machine, the error files' times say which came first.
        kept = [node for node in range(len(results)) if node not in self.killed]
        failed = first_failure([results[n] for n in kept],
                               [self.agents[n].log_dir for n in kept])
        first = failed or results[kept[0] if kept else 0]
        returncode = first.returncode if failed or not kept else 0  # every node removed: failed
        return NodesResult(
            returncode, max(r.attempts for r in results), self.log_dir,
            failed_rank=first.failed_rank, exitcode=first.exitcode, error=first.error,
            seconds=time.monotonic() - self.started,
            fault_to_exit_s=next((r.fault_to_exit_s for r in results if r.fault_to_exit_s),
                                 None),
            output=self.output, rounds=list(self.rounds), killed=dict(self.killed))

    def stop(self):
        for agent in self.running():
            agent.stop()


def start(target, nnodes="2", nproc="auto", max_restarts=0, env=None, quiet=False,
          stream=None, port=None, run_id=None, rdzv_conf=None, device="auto"):
    """Start one torchrun agent per node on this machine and return a ``NodesJob``.

    ``nnodes``: "N", or "MIN:MAX" (elastic: the job goes on while MIN nodes remain; MAX
    agents are started). ``nproc``: processes per node, on ``device`` ("cuda", "cpu" or
    "auto", see ``node_envs``); "auto" gives each node an equal share of the GPUs if
    there are enough, else one CPU process per node. Give the target the same device
    (``--device``): the environment only hides or shares out the GPUs.
    """
    _, count = parse_nnodes(nnodes)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = visible.split(",") if visible else (
        [] if device == "cpu" else [str(i) for i in range(hardware.detect().gpus)])
    per_node, envs = node_envs(count, nproc, visible, device)
    port = port or free_port()
    launch.check_port_free(port, HOST)
    run_id = run_id or f"nodes-{secrets.token_hex(4)}"
    commands = node_commands(target, nnodes, per_node, port, run_id, max_restarts, rdzv_conf)
    envs = [{**node_env, **(env or {})} for node_env in envs]
    log_dir = Path(tempfile.mkdtemp(prefix="torchrun-nodes-"))
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    flags = slice(1, len(commands[0]) - len(target))
    run_commands = [[torchrun, *command[flags], "--redirects=3",
                     f"--log-dir={log_dir / f'node{node}'}", *target]
                    for node, command in enumerate(commands)]
    shown = [f"node {node}$ " + " ".join(f"{k}={shlex.quote(v)}" for k, v in node_env.items()
                                         if k != "LOGLEVEL") + " " + shlex.join(command)
             for node, (command, node_env) in enumerate(zip(commands, envs, strict=True))]
    return NodesJob(run_commands,
                    [{**launch.NCCL_FAIL_FAST_ENV, **launch.flight_recorder_env(log_dir),
                      **os.environ, "PYTHONUNBUFFERED": "1", **node_env} for node_env in envs],
                    log_dir, shown, quiet, stream)


def run(target, nnodes="2", nproc="auto", max_restarts=0, timeout=None, env=None,
        quiet=False, stream=None, port=None, run_id=None, rdzv_conf=None, device="auto"):
    """Run ``target`` on ``nnodes`` local nodes; return the NodesResult (see ``start``)."""
    return start(target, nnodes, nproc, max_restarts, env, quiet, stream, port, run_id,
                 rdzv_conf, device).wait(timeout)
