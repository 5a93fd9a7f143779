"""`classroom.py serve`: JupyterHub in the foreground, after the checks that keep the class's
tokens and passwords its own (the internal ports), the class accounts' stray processes
ended, the homes mounted again, and one line for each learners' limit this host cannot
enforce.
"""
import os
import signal
import subprocess
import sys

from kit import COURSE_ID, KIT, KitError, disks, kit_module, load_learners, load_settings
from kit_accounts import end_processes_of_accounts

# The addresses on the loopback interface that the class's tokens and passwords go to:
# ports only root can bind (serve checks; README.md, "What is protected").
INTERNAL_PORTS = {"hub_port": 881, "proxy_api_port": 882, "formgrader_port": 883,
                  "progress_port": 884}


def check_internal_ports(settings):
    """The hub's API, the proxy's API, the formgrader and the progress service listen on
    the loopback interface, where every account can connect, and so bind: a learner's
    process holding one of those ports while the hub restarts would receive the tokens and
    passwords sent there. Below the host's first unprivileged port only root binds
    (listen.py binds the services' for them)."""
    first = kit_module("listen").unprivileged_start()
    for name in INTERNAL_PORTS:
        if settings[name] >= first:
            flag = "--" + name.replace("_", "-")
            fix = (f"give one below {first} (the default is {INTERNAL_PORTS[name]})"
                   if first > INTERNAL_PORTS[name] else
                   "let only root bind ports below 1024: sysctl "
                   "net.ipv4.ip_unprivileged_port_start=1024 (a container: docker run "
                   "--sysctl net.ipv4.ip_unprivileged_port_start=1024)")
            raise KitError(f"{flag} {settings[name]}: any account on this host can bind ports "
                           f"from {first} and take it while the hub restarts; {fix}")


def say_unenforced(settings, state=None):
    """One line for each learners' limit this host cannot enforce (limits.py, disks.py and,
    under SLURM, slurm_gpus.py: asked as a learner of the class in ``state``)."""
    if settings["spawner"] == "slurm":
        learners = load_learners(state) if state else []
        line = (kit_module("slurm_gpus").problem(state, settings["slurm"], learners[0])
                if learners else "GPUs under SLURM: not asked yet (no learner accounts)")
        lines = [line] if line else []
    else:
        shared = bool(settings.get("gpus_per_learner") and settings.get("gpu_ids"))
        lines = kit_module("limits").Cgroups(settings.get("limits", {})).unenforced(shared)
    why = "init --home-size 0" if not settings.get("home_bytes") else disks().problem()
    if why:
        lines.append(f"disk: the homes share the class folder's filesystem ({why})")
    if state and settings.get("exchange_quota_bytes"):
        why = disks().exchange_problem(state / "exchange")
        if why:
            lines.append(f"disk: no learner's quota in the exchange ({why}): one learner "
                         f"can fill it, and stop the others' submissions")
    for line in lines:
        print(f"NOT ENFORCED on this host: {line}", flush=True)


def mount_homes(state, settings):
    """Each learner's home filesystem and the exchange's, mounted again where a restart of
    the machine unmounted them."""
    if disks().problem() is None:
        disks().mount_exchange(state, state / "exchange")
        if settings.get("home_bytes"):
            for name in load_learners(state):
                disks().mount(state, name, state / "homes" / name)


def say_ended(ended, when):
    if ended:
        print(f"{when}: ended {sum(n for _, n in ended)} processes of "
              f"{', '.join(name for name, _ in ended)}", flush=True)


def command_serve(args):
    state = args.state
    settings = load_settings(state)
    if not load_learners(state):
        raise KitError(f"no learner accounts yet: `classroom.py --state {state} accounts add N`")
    check_internal_ports(settings)
    proxy = state / "proxy" / "node_modules" / ".bin"
    env = {**os.environ, "CLASSROOM_DIR": str(state),
           "PATH": f"{state / 'env' / 'bin'}:{proxy}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    scheme = "https" if settings.get("ssl_cert") else "http"
    address = f"{scheme}://{settings['ip']}:{settings['port']}"
    print(f"JupyterHub for {COURSE_ID} at {address}/ (state in {state / 'hub'}); the "
          f"instructors' board at {address}/services/progress/", flush=True)
    say_ended(end_processes_of_accounts(state), "before the hub starts")
    mount_homes(state, settings)
    say_unenforced(settings, state)
    # The hub in a process group of its own (a terminal's Ctrl-C reaches it once, through
    # this process). It stops the formgrader and the learners' servers with SIGINT, which
    # they would ignore, as started in the background, had it inherited SIGINT ignored.
    hub = subprocess.Popen(
        [str(state / "env" / "bin" / "jupyterhub"), "-f", str(KIT / "jupyterhub_config.py")],
        env=env, cwd=state / "hub", process_group=0,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda number, frame: hub.send_signal(number))
    code = hub.wait()
    say_ended(end_processes_of_accounts(state), "after the hub stopped")
    sys.exit(code)
