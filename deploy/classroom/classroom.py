"""The class server: one JupyterHub for a whole class, every learner a Unix account with
their own JupyterLab, nbgrader's exchange between them and the instructor's formgrader.

    python3 deploy/classroom/classroom.py --state DIR COMMAND [options]

Commands, in the order a class day uses them (``make classroom`` runs the first four):

    env       the class environment DIR/env: Debian's Python with the course's packages
              (the project's .venv, linked, not downloaded again) and JupyterHub's (the
              `classroom` pins of pyproject.toml); configurable-http-proxy in DIR/proxy
    init      the class: settings (DIR/class.json), the instructors' password and TLS
              files (DIR/secrets), the grader account and its copy of assessment/, the
              course's exchange folders (the grader's), the learners' material
    accounts  learner accounts: `accounts add N` creates PREFIX01..PREFIXNN, each with a
              random password of its own (the hand-out sheet DIR/secrets/handout.txt);
              `accounts remove` removes every account the kit created (DIR/accounts.txt)
    serve     JupyterHub in the foreground, its state in DIR/hub (Ctrl-C stops it and every
              learner's server)
    down      remove the kit's accounts (learners and grader); --purge also removes DIR

Runs as root (it creates accounts and the hub starts servers as their users), with any
Python 3.11+ (standard library only). Everything it writes is under DIR, except the
accounts (useradd/userdel), which `down` removes. README.md beside this file says more.

Each command lives in the module of what it manages, beside this file: ``kit_env.py``
(the class environment), ``kit_init.py`` (settings, the grader, the exchange, the
learners' material), ``kit_accounts.py`` (accounts, passwords, ``down``), ``kit_serve.py``
(the hub), on ``kit.py`` (what they share); the learners' limits are ``limits.py``,
``disks.py`` and ``slurm_gpus.py``.
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the kit's modules, beside this file
from kit import REPO, KitError  # noqa: E402
from kit_accounts import command_accounts, command_down  # noqa: E402
from kit_env import DEFAULT_PYTHON, command_env  # noqa: E402
from kit_init import command_init  # noqa: E402
from kit_serve import INTERNAL_PORTS, command_serve  # noqa: E402


def parser():
    main = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    main.add_argument("--state", type=Path, required=True,
                      help="the class's folder (all it writes goes there), e.g. /srv/ddp-workshop")
    commands = main.add_subparsers(dest="command", required=True)

    env = commands.add_parser("env", help="build the class environment")
    env.add_argument("--course-env", type=Path, default=REPO / ".venv",
                     help="the course's environment (`make setup`): its packages are linked")
    env.add_argument("--python", default=DEFAULT_PYTHON,
                     help="a Python every account can run, of the course environment's version")
    env.set_defaults(run=command_env)

    init = commands.add_parser("init", help="settings, grader, exchange, learner material")
    init.add_argument("--grader", default="ddp-grader", help="the grader's account name")
    init.add_argument("--instructors", nargs="*", default=["instructor"],
                      help="hub user names of the instructors (the formgrader is theirs)")
    init.add_argument("--ip", default="127.0.0.1",
                      help="the address learners open (0.0.0.0: every interface; other than "
                           "the loopback it needs TLS or --insecure-http)")
    init.add_argument("--ssl-cert", default="", help="the hub's TLS certificate (PEM)")
    init.add_argument("--ssl-key", default="", help="its private key (PEM)")
    init.add_argument("--self-signed", default="", metavar="NAME",
                      help="make a self-signed certificate for NAME (the server's name or "
                           "address) in DIR/secrets and serve HTTPS with it")
    init.add_argument("--insecure-http", action="store_true",
                      help="serve plain HTTP on a non-loopback --ip: passwords and cookies "
                           "cross the network in clear")
    init.add_argument("--shared-class-password", action="store_true",
                      help="INSECURE: learners log in with one class password "
                           "(secrets/class_password) instead of their own, so any learner "
                           "can log in as any other")
    init.add_argument("--memory-limit", default="8G",
                      help="each process of a learner: its data (RLIMIT_DATA; 0: none)")
    init.add_argument("--exchange-size", default="16G",
                      help="the exchange's own filesystem (sparse: it takes what is "
                           "submitted); 0 keeps it a folder of the class folder's")
    init.add_argument("--exchange-quota", default="256M",
                      help="each learner's space in the exchange, where the kernel keeps "
                           "quotas; 0: none")
    init.add_argument("--home-size", default="4G",
                      help="each learner's home: a filesystem of this size of its own "
                           "(a sparse image, loop-mounted; 0: a plain folder)")
    init.add_argument("--learner-memory", default="6G",
                      help="memory of each learner, all their processes together (a cgroup; "
                           "0: none)")
    init.add_argument("--learner-cpus", type=float, default=2,
                      help="CPUs of each learner, all their processes together (a cgroup's "
                           "quota; 0: none)")
    init.add_argument("--nproc-limit", type=int, default=512,
                      help="processes and threads of each learner account (RLIMIT_NPROC)")
    init.add_argument("--file-size-limit", default="4G",
                      help="largest file a learner's process writes (RLIMIT_FSIZE; 0: none)")
    init.add_argument("--gpu-ids", default="",
                      help="local: the GPUs to share out, comma-separated (e.g. 0,1,2,3): "
                           "learner k gets --gpus-per-learner of them in turn")
    init.add_argument("--port", type=int, default=8000,
                      help="the class's address (the only port that faces the class)")
    loopback = "on 127.0.0.1, below 1024: only root binds it"
    init.add_argument("--hub-port", type=int, default=INTERNAL_PORTS["hub_port"],
                      help=f"the hub's API, {loopback}")
    init.add_argument("--proxy-api-port", type=int, default=INTERNAL_PORTS["proxy_api_port"],
                      help=f"the proxy's API, {loopback}")
    init.add_argument("--formgrader-port", type=int, default=INTERNAL_PORTS["formgrader_port"],
                      help=f"the formgrader, {loopback}")
    init.add_argument("--progress-port", type=int, default=INTERNAL_PORTS["progress_port"],
                      help=f"the progress service (the instructors' board), {loopback}")
    init.add_argument("--anonymous-survey", action="store_true",
                      help="the board and its CSV never say who answered the closing "
                           "survey what")
    init.add_argument("--idle-timeout", type=int, default=3600,
                      help="stop a learner's server idle this many seconds")
    init.add_argument("--spawner", choices=["local", "slurm"], default="local",
                      help="learners' servers as processes here, or as SLURM jobs")
    init.add_argument("--gpus-per-learner", type=int, default=0,
                      help="GPUs of each learner: slurm, the job's --gres=gpu:N; local, "
                           "CUDA_VISIBLE_DEVICES from --gpu-ids")
    init.add_argument("--cpus-per-gpu", type=int, default=4,
                      help="slurm: CPUs a seat gets per GPU")
    init.add_argument("--mem-per-gpu", default="16G", help="slurm: memory a seat gets per GPU")
    init.add_argument("--cpus-per-seat", type=int, default=2,
                      help="slurm: CPUs of a seat without GPUs")
    init.add_argument("--mem-per-seat", default="4G",
                      help="slurm: memory of a seat without GPUs")
    init.add_argument("--partition", default="", help="slurm: the partition of the jobs")
    init.add_argument("--runtime", default="8:00:00", help="slurm: the jobs' time limit")
    init.add_argument("--start-timeout", type=int, default=900,
                      help="slurm: seconds a learner's job may wait in the queue")
    init.add_argument("--slurm-conf", default="",
                      help="slurm: SLURM_CONF for the hub's sbatch/squeue (default: the system's)")
    init.add_argument("--exechost", default="",
                      help="slurm: the address of every job's node (a one-machine cluster "
                           "whose node names do not resolve: 127.0.0.1)")
    init.set_defaults(run=command_init)

    accounts = commands.add_parser("accounts", help="add or remove learner accounts")
    accounts.add_argument("action", choices=["add", "remove"])
    accounts.add_argument("count", type=int, nargs="?", default=30)
    accounts.add_argument("--prefix", default="learner")
    accounts.set_defaults(run=command_accounts)

    serve = commands.add_parser("serve", help="run JupyterHub in the foreground")
    serve.set_defaults(run=command_serve)

    down = commands.add_parser("down", help="remove the accounts the kit created")
    down.add_argument("--purge", action="store_true", help="also remove the state folder")
    down.set_defaults(run=command_down)
    return main


def main(argv=None):
    args = parser().parse_args(argv)
    args.state = args.state.resolve()
    if os.geteuid() != 0:
        sys.exit("classroom: run it as root (sudo make classroom): it creates the class's "
                 "accounts, and the hub starts each learner's server as its learner")
    try:
        args.run(args)
    except KitError as error:
        sys.exit(f"classroom: {error}")


if __name__ == "__main__":
    main()
