"""Each learner's GPUs under SLURM: at most ``init --gpus-per-learner`` at a time over all of
their jobs, their server's included, so that a learner's own ``sbatch --gres=gpu:2`` cannot
take a node's GPUs while the next learner's server waits.

SLURM enforces it through its job_submit/lua plugin: ``job_submit.lua`` (beside this file)
with the class's learners and their GPUs filled in, written to
``DIR/config/job_submit.lua`` by ``init`` and ``accounts``, for the cluster's administrator
to install beside slurm.conf (``JobSubmitPlugins=lua``). SLURM's own per-user limits
(a QOS with ``MaxTRESPerUser``) would need its accounting database; the plugin needs none.
``problem`` asks the cluster itself whether the limit holds: a learner's
``sbatch --test-only`` for one GPU more than their share must be refused by the class's
script.
"""
import os
import pwd
import subprocess
from pathlib import Path

TEMPLATE = Path(__file__).with_name("job_submit.lua")
MARK = "ddp-workshop:"  # the start of every refusal the script writes


def script(learners, gpus_per_learner):
    """The class's job_submit.lua: ``learners`` (account names) by uid."""
    uids = {}
    for name in learners:
        try:
            uids[pwd.getpwnam(name).pw_uid] = name
        except KeyError:
            pass
    table = ", ".join(f'[{uid}] = "{name}"' for uid, name in sorted(uids.items()))
    return (TEMPLATE.read_text().replace("--LEARNERS--", table)
            .replace("--GPUS--", str(int(gpus_per_learner))))


def write(state, learners, gpus_per_learner):
    path = Path(state) / "config" / "job_submit.lua"
    path.write_text(script(learners, gpus_per_learner))
    path.chmod(0o644)
    return path


def problem(state, slurm, learner):
    """Why a learner's own jobs can hold more GPUs than theirs (one line), or None."""
    wanted = int(slurm.get("gpus_per_learner") or 0) + 1
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if slurm.get("slurm_conf"):
        env["SLURM_CONF"] = slurm["slurm_conf"]
    command = ["sbatch", "--test-only", f"--gres=gpu:{wanted}", "--output=/dev/null",
               *([f"--partition={slurm['partition']}"] if slurm.get("partition") else []),
               "--wrap", "true"]
    install = (f"install {Path(state) / 'config' / 'job_submit.lua'} as job_submit.lua "
               f"beside slurm.conf, with JobSubmitPlugins=lua (README.md)")
    try:
        said = subprocess.run(command, user=learner, env=env, cwd="/", capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return f"GPUs under SLURM: could not ask the cluster ({error}); {install}"
    if MARK in said.stderr:
        return None
    return (f"GPUs under SLURM: {learner}'s own sbatch for {wanted} GPU(s) was not refused "
            f"by the class's script; {install}")
