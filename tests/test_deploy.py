"""The cluster forms of the course's job (deploy/): a SLURM batch script, run here on a
real two-node SLURM, and Kubeflow manifests, checked offline against the operators'
published schemas. All three run train_ddp with the flags of the local launch.

The SLURM test needs Debian's slurmctld, slurmd, slurm-client and munge (``.ci/run``
installs them) and root; without them it is skipped, except under CI, where that is a
failure.
"""
import ipaddress
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import slurm
import yaml

from conftest import DDP_RUN_FLAGS, REPO
from workshop_lib import hardware, nodes, runlog, train_ddp

DEPLOY = REPO / "deploy"
MANIFESTS = {"trainjob.yaml": "trainjob.schema.json", "pytorchjob.yaml": "pytorchjob.schema.json"}
# Where a cluster's job differs from the local launch: the hardware picks the device
# (--device auto, the default), and the run record goes to the job's own folder.
CLUSTER_CHOSEN = {"--device", "--out"}
JOB_LIMIT_S = 300


def load(name):
    return yaml.safe_load((DEPLOY / name).read_text())


def container_command(manifest):
    """The training container's command: TrainJob's trainer, or PyTorchJob's worker."""
    if manifest["kind"] == "TrainJob":
        return manifest["spec"]["trainer"]["command"]
    (container,) = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"]
    return container["command"]


def flags_without(args, names):
    """``args`` less the flags in ``names`` and their values (all take one)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        else:
            kept.append(arg)
    return kept


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_manifest_is_valid_for_the_operators_published_schema(name):
    schema = json.loads((DEPLOY / "schemas" / MANIFESTS[name]).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    manifest = load(name)
    jsonschema.Draft202012Validator(schema).validate(manifest)
    # The object's name becomes pods' and services' names: a DNS-1035 label.
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", manifest["metadata"]["name"])


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_schema_rejects_a_misspelt_field_and_a_wrong_type(name):
    validator = jsonschema.Draft202012Validator(
        json.loads((DEPLOY / "schemas" / MANIFESTS[name]).read_text()))
    misspelt = load(name)
    misspelt["spec"]["numNode"] = 2
    assert not validator.is_valid(misspelt), "strict validation: unknown fields are errors"
    wrong = load(name)
    if wrong["kind"] == "TrainJob":
        wrong["spec"]["trainer"]["numNodes"] = "2"
    else:
        wrong["spec"]["elasticPolicy"]["minReplicas"] = "1"
    assert not validator.is_valid(wrong)


def test_the_pytorchjob_passes_the_operators_admission_checks():
    """What the Training Operator's webhook checks beyond the schema (v1.9.0,
    pkg/webhooks/pytorch/pytorchjob_webhook.go)."""
    spec = load("pytorchjob.yaml")["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    assert set(replicas) <= {"Master", "Worker"}
    assert "Worker" in replicas, "an elastic policy needs Worker replicas"
    assert "nProcPerNode" not in spec["elasticPolicy"], "deprecated: spec.nprocPerNode"
    for replica in replicas.values():
        containers = replica["template"]["spec"]["containers"]
        assert all(c.get("image") for c in containers)
        assert "pytorch" in [c["name"] for c in containers]
    assert spec["elasticPolicy"]["minReplicas"] <= replicas["Worker"]["replicas"] \
        <= spec["elasticPolicy"]["maxReplicas"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_manifest_runs_the_local_launchs_command(name):
    command = container_command(load(name))
    # torchrun with no rendezvous flags of its own: the operator sets them (PET_*).
    assert command[:1] == ["torchrun"] and not any(a.startswith("--rdzv") for a in command)
    target = command[command.index("-m"):]
    local = nodes.node_commands(["-m", "workshop_lib.train_ddp", *DDP_RUN_FLAGS], "2", 1, 29400,
                                "job")[0]
    local_target = local[local.index("-m"):]
    assert target[:2] == local_target[:2] == ["-m", "workshop_lib.train_ddp"]
    assert flags_without(target[2:], CLUSTER_CHOSEN) == flags_without(local_target[2:],
                                                                      CLUSTER_CHOSEN)
    args = train_ddp.parse_args(target[2:])  # flags the script accepts, values it takes
    assert str(args.out).startswith("/runs/")


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_run_record_goes_to_the_shared_volume(name):
    text = json.dumps(load(name))
    claim = load("runs-volume.yaml")
    assert claim["kind"] == "PersistentVolumeClaim"
    assert "ReadWriteMany" in claim["spec"]["accessModes"], "every node reads and writes it"
    assert f'"claimName": "{claim["metadata"]["name"]}"' in text
    assert '"mountPath": "/runs"' in text


def test_the_image_installs_the_course_with_the_environments_python():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    version = re.search(r"^FROM python:(\d+\.\d+)", dockerfile, re.M)[1]
    assert version == "{}.{}".format(*sys.version_info[:2])
    for line in re.findall(r"^COPY (.+) \S+$", dockerfile, re.M):
        for path in line.split():
            assert (REPO / path).exists(), f"the Dockerfile copies {path}, which is missing"


def test_the_batch_script_is_valid_bash():
    result = subprocess.run(["bash", "-n", str(DEPLOY / "train_ddp.sbatch")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_batch_script_refuses_gpu_ranks_without_their_cpus(tmp_path):
    """4 GPUs on a node with the header's 2 CPUs: the job stops at once and says what to
    ask for, before any rendezvous; with 16 CPUs it goes on (here to the SLURM commands,
    which find no job)."""
    env = {"PATH": os.environ["PATH"], "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "2"}
    refused = subprocess.run(["bash", str(DEPLOY / "train_ddp.sbatch")], capture_output=True,
                             text=True, env=env, cwd=tmp_path, timeout=30)
    assert refused.returncode == 1 and refused.stderr.strip() == (
        "error: 4 GPU ranks would share 2 CPUs; ask for CPUs and memory with the GPUs: "
        "sbatch --gpus-per-node=4 --cpus-per-task=16 --mem-per-gpu=16G "
        "deploy/train_ddp.sbatch"), refused.stderr
    enough = subprocess.run(["bash", str(DEPLOY / "train_ddp.sbatch")], capture_output=True,
                            text=True, env={**env, "SLURM_CPUS_PER_TASK": "16"}, cwd=tmp_path,
                            timeout=30)
    assert "would share" not in enough.stderr


def test_the_interface_for_an_address_is_the_one_holding_it_or_the_route_to_it():
    """deploy/interface_for.sh, run against this machine's own interfaces: the loopback's
    address, each other address this machine holds, one beside it on the same network (the
    route to it), and a name that resolves to nothing (one line, saying what to set)."""
    script = str(DEPLOY / "interface_for.sh")

    def interface_for(address):
        return subprocess.run([script, address], capture_output=True, text=True, timeout=30)

    assert interface_for("127.0.0.1").stdout.strip() == "lo"
    held = [line.split() for line in subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout.splitlines()]
    for _, name, _, cidr, *_ in held:
        own = ipaddress.ip_interface(cidr)
        assert interface_for(str(own.ip)).stdout.strip() == name, cidr
        others = [str(host) for host in itertools.islice(own.network.hosts(), 4)
                  if host != own.ip]
        if name != "lo" and others:  # another host on its network: the route leaves by it
            assert interface_for(others[0]).stdout.strip() == name, others[0]
    unknown = interface_for("no-such-host.invalid")
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1
    assert "set GLOO_SOCKET_IFNAME" in unknown.stderr


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
    assert run.start["threads_per_process"] == hardware.threads_per_process(2)
    # CPU ranks on two nodes: each node binds gloo to the interface it reaches the
    # rendezvous host (NodeAddr 127.0.0.1 here) by, not to what its name resolves to.
    assert output.count(": gloo on lo") == 2, output[-4000:]
    rounds = nodes.rendezvous_rounds(output)
    assert sorted(r["group_rank"] for r in rounds) == [0, 1], "two nodes, one agent each"
    assert sorted(rank for r in rounds for rank in r["global_ranks"]) == [0, 1]
