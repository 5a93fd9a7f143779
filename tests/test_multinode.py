"""One job on several "nodes": torchrun agents on this machine, as on a cluster's nodes.

These test the parts without launching; the real launches are notebook 06's (two nodes,
and the elastic job that loses one), asserted in tests/test_notebook_06.py.
"""
import os

import pytest

from workshop_lib import hardware, launch, nodes
from workshop_lib.errors import CourseError

TARGET = ["-m", "workshop_lib.train_ddp", "--flag"]
# The end of an agent's log (LOGLEVEL=INFO) after its rendezvous, as torch 2.14 writes it.
PREFIX = "I1130 15:12:02.504000 4765 torch/distributed/elastic/agent/server/api.py:553]"
AGENT_LOG = "".join(f"{PREFIX} {line}\n" for line in [
    "[default] Rendezvous complete for workers. Result:", "  restart_count={restart}",
    "  master_addr=127.0.0.1", "  master_port=33475", "  group_rank={node}",
    "  group_world_size={nodes}", "  local_ranks=[0, 1]", "  role_ranks={ranks}",
    "  global_ranks={ranks}", "  role_world_sizes=[4, 4]"])


def test_each_node_runs_the_same_torchrun_command_but_one_hosts_the_rendezvous():
    commands = nodes.node_commands(TARGET, "2", 3, 29400, "job-7")
    assert len(commands) == 2
    first, second = commands
    assert first[0] == "torchrun" and first[-3:] == TARGET
    for flag in ("--nnodes=2", "--nproc-per-node=3", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=job-7", "--local-addr=127.0.0.1"):
        assert flag in first and flag in second
    assert "--rdzv-conf=is_host=1" in first and "--rdzv-conf=is_host=0" in second
    assert [a for a in first if "is_host" not in a] == [a for a in second if "is_host" not in a]


def test_elastic_membership_is_a_range_of_nodes_and_rendezvous_settings():
    commands = nodes.node_commands(TARGET, "1:3", 1, 29400, "job", max_restarts=2,
                                   rdzv_conf={"last_call_timeout": 5})
    assert len(commands) == 3, "as many agents as the most nodes"
    assert all("--nnodes=1:3" in c and "--max-restarts=2" in c for c in commands)
    assert "--rdzv-conf=is_host=0,last_call_timeout=5" in commands[2]
    assert nodes.parse_nnodes("2") == (2, 2) and nodes.parse_nnodes("1:4") == (1, 4)
    for bad in ("0", "3:2", "two", "1:"):
        with pytest.raises(CourseError, match="--nnodes"):
            nodes.parse_nnodes(bad)


def test_the_agents_log_says_which_node_rank_and_global_ranks_each_node_got(tmp_path):
    text = (AGENT_LOG.format(restart=0, node=1, nodes=2, ranks="[2, 3]")
            + "I1130 ... other lines\n"
            + AGENT_LOG.format(restart=1, node=0, nodes=1, ranks="[0, 1]"))
    rounds = nodes.rendezvous_rounds(text)
    assert rounds == [
        {"restart_count": 0, "group_rank": 1, "group_world_size": 2, "local_ranks": [0, 1],
         "global_ranks": [2, 3]},
        {"restart_count": 1, "group_rank": 0, "group_world_size": 1, "local_ranks": [0, 1],
         "global_ranks": [0, 1]}]
    # Log folders are named by local rank: attempt 0's local rank 1 was global rank 3.
    log = tmp_path / "run_x" / "attempt_0" / "1" / "stdout.log"
    assert nodes.global_rank_of(log, rounds) == 3
    assert nodes.global_rank_of(tmp_path / "run_x" / "attempt_1" / "1" / "stdout.log",
                                rounds) == 1
    assert nodes.global_rank_of(tmp_path / "run_x" / "attempt_2" / "0" / "stdout.log",
                                rounds) is None, "not logged yet: wait"


def test_a_failed_rank_on_another_node_is_named_by_its_global_rank(tmp_path):
    folder = tmp_path / "run_x" / "attempt_0" / "0"  # node 1's local rank 0
    folder.mkdir(parents=True)
    (folder / "stderr.log").write_text("error: --lr must be positive\n")
    rounds = nodes.rendezvous_rounds(AGENT_LOG.format(restart=0, node=1, nodes=2,
                                                      ranks="[1, 2]"))
    root_cause = "Root Cause (first observed failure):\n  rank      : 1 (local_rank: 0)\n" \
                 "  exitcode  : 2 (pid: 9)\n"
    assert launch._root_cause(root_cause, tmp_path, lambda p: nodes.global_rank_of(p, rounds)) \
        == (1, 2, "--lr must be positive")


def test_the_job_fails_as_the_node_whose_process_failed_first(tmp_path):
    def error_file(node, attempt, written_ns):
        path = tmp_path / f"node{node}" / "run_x" / f"attempt_{attempt}" / "0" / "error.json"
        path.parent.mkdir(parents=True)
        path.write_text("{}")
        os.utime(path, ns=(written_ns, written_ns))

    error_file(0, 0, 1_000)  # node 0 failed first in the first attempt, but that was retried
    error_file(0, 1, 3_000)  # in the last, node 0's rank only saw its peer go
    error_file(1, 1, 2_000)
    results = [launch.LaunchResult(1, 2, tmp_path, failed_rank=rank, error=error)
               for rank, error in ((0, "Connection closed by peer"), (1, "InjectedFault"))]
    log_dirs = [tmp_path / "node0", tmp_path / "node1"]
    assert nodes.first_failure(results, log_dirs).error == "InjectedFault"
    assert nodes.first_error_ns(tmp_path / "node2") == float("inf"), "no error file"
    fine = launch.LaunchResult(0, 1, tmp_path)
    assert nodes.first_failure([fine, results[0]], log_dirs) is results[0]
    assert nodes.first_failure([fine, fine], log_dirs) is None


def test_each_node_gets_its_own_gpus_and_threads_follow_every_nodes_processes():
    per_node, envs = nodes.node_envs(2, "auto", ["0", "1", "2", "3"])
    assert per_node == 2
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    assert {e[hardware.SHARERS_ENV] for e in envs} == {"4"}
    assert nodes.gpu_slices(["4", "6", "7"], 3) == [["4"], ["6"], ["7"]]
    # Fewer GPUs than nodes: one CPU process per node, the GPU hidden from both.
    per_node, envs = nodes.node_envs(2, "auto", ["0"])
    assert per_node == 1 and [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["", ""]
    per_node, envs = nodes.node_envs(3, 2, [])
    assert per_node == 2 and envs[0]["CUDA_VISIBLE_DEVICES"] == ""
    assert envs[0][hardware.SHARERS_ENV] == "6"
    with pytest.raises(CourseError, match="needs at least 2 GPUs"):
        nodes.node_envs(2, "gpu", ["0"])


def test_the_launcher_starts_nodes_when_asked_for_several(monkeypatch):
    calls = []
    monkeypatch.setattr(nodes, "run", lambda *a, **k: calls.append((a, k)) or
                        launch.LaunchResult(0, 1, None))
    from workshop_lib.launch.__main__ import main

    assert main(["--nnodes=1:2", "--max-restarts=1", *TARGET]) == 0
    (args, kwargs), = calls
    assert args[:4] == (TARGET, "1:2", "auto", 1)
