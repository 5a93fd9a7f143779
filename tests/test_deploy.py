"""The cluster forms of the course's job (deploy/): a SLURM batch script, run here on a
real two-node SLURM, with the flags of the local launch.

The SLURM test needs Debian's slurmctld, slurmd, slurm-client and munge (``.ci/run``
installs them) and root; without them it is skipped, except under CI, where that is a
failure.
"""
import os
import subprocess
from pathlib import Path

import pytest
import slurm

from conftest import DDP_RUN_FLAGS, REPO
from workshop_lib import nodes, runlog

DEPLOY = REPO / "deploy"
JOB_LIMIT_S = 300


def test_the_batch_script_is_valid_bash():
    result = subprocess.run(["bash", "-n", str(DEPLOY / "train_ddp.sbatch")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = slurm.missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"under CI, {reason}")
        pytest.skip(reason)
    # Two nodes, each a share of this machine's cores.
    cores = len(os.sched_getaffinity(0))
    with slurm.Cluster(tmp_path_factory.mktemp("slurm"), nodes=2,
                       cpus=max(1, cores // 2)) as running:
        yield running


@pytest.mark.slow
def test_the_batch_script_trains_on_two_slurm_nodes(cluster, tmp_path):
    out = tmp_path / "run"
    job = cluster.submit(
        DEPLOY / "train_ddp.sbatch", *DDP_RUN_FLAGS, cwd=REPO,
        options=["--nodes=2", f"--cpus-per-task={cluster.cpus}", f"--output={tmp_path}/%j.out",
                 f"--time={JOB_LIMIT_S // 60 + 1}"],
        # One process per node, as the local two-node launch; both nodes are on this
        # machine, so their processes share its cores. LOGLEVEL: torchrun's agents log
        # their rendezvous (node rank, global ranks).
        env={"OUT": str(out), "NPROC_PER_NODE": "1", "WORKSHOP_PROCESSES_ON_MACHINE": "2",
             "LOGLEVEL": "INFO"})
    state = cluster.wait(job, timeout=JOB_LIMIT_S)
    log = Path(tmp_path / f"{job}.out")
    output = log.read_text(errors="replace") if log.exists() else "(no job output)"
    assert state == "COMPLETED", f"job {job} {state}:\n{output[-4000:]}\n{cluster.logs()}"
    run = runlog.read(out)
    assert run.start["world_size"] == 2
    assert run.final["val_acc"] >= 0.95, "the learning bar"
    rounds = nodes.rendezvous_rounds(output)
    assert sorted(r["group_rank"] for r in rounds) == [0, 1], "two nodes, one agent each"
    assert sorted(rank for r in rounds for rank in r["global_ranks"]) == [0, 1]
