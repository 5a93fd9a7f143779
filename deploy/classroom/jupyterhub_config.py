"""JupyterHub for the class: read by `classroom.py serve`, which names the class's folder in
$CLASSROOM_DIR. Every setting comes from that folder (class.json, written by `classroom.py
init`; the passwords and TLS files in secrets/; the learners in learners.txt), and
everything the hub writes goes to its hub/ folder.
"""
import json
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 - JupyterHub defines get_config when it loads this file

STATE = Path(os.environ["CLASSROOM_DIR"])
KIT = Path(__file__).resolve().parent
HUB = STATE / "hub"
ENV_BIN = STATE / "env" / "bin"
settings = json.loads((STATE / "class.json").read_text())
course_id = settings["course_id"]
instructors = set(settings["instructors"])
learners = set((STATE / "learners.txt").read_text().split())
grader_home = Path(settings["course_folder"]).parent
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def secret(name):
    return (STATE / "secrets" / name).read_text().strip()


# The hub, its proxy and its state. Only the proxy's public port may face the class; the
# hub's API and the proxy's API stay on the loopback interface.
scheme = "https" if settings.get("ssl_cert") else "http"
c.JupyterHub.bind_url = f"{scheme}://{settings['ip']}:{settings['port']}"
if settings.get("ssl_cert"):
    # The proxy terminates TLS: the only port that faces the class speaks HTTPS.
    c.JupyterHub.ssl_cert = settings["ssl_cert"]
    c.JupyterHub.ssl_key = settings["ssl_key"]
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{settings['hub_port']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [
    str(STATE / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(HUB / "jupyterhub-proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{HUB / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(HUB / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(HUB / "jupyterhub.pid")

# Who logs in: each learner account with its own password (PAM: the hub runs as root), the
# instructors with theirs (classroom_auth.py); a shared class password only where `init`
# was told --shared-class-password. JupyterHub 5+ lets nobody in unless told whom.
sys.path.insert(0, str(KIT))
sys.dont_write_bytecode = True  # nothing of the hub's goes into the repository
from classroom_auth import ClassroomAuthenticator  # noqa: E402 - found through KIT

c.JupyterHub.authenticator_class = ClassroomAuthenticator
if settings.get("shared_class_password"):
    c.ClassroomAuthenticator.shared_password = secret("class_password")
c.ClassroomAuthenticator.instructor_password = secret("instructor_password")
c.ClassroomAuthenticator.instructors = instructors
c.Authenticator.allowed_users = learners | instructors

# The formgrader: a hub-managed service, run as the grader account in its copy of the
# course's assessment/ (nbgrader's settings there carry the grading guards), reached by
# the instructors' group only. Instructors list learners and start or stop their servers,
# but do not open them: every page a learner's server sends is the learner's to write (a
# server of their own making on their port, too), and on the hub's origin it would run
# with the instructor's login (README.md: "Who can do what").
c.JupyterHub.load_groups = {"instructors": {"users": sorted(instructors)}}
# The progress service (progress/): learners' kernels report their verdicts to it with
# their server's token, which the hub gives access to it (server_token_scopes, below); the
# board is the instructors' through a scope of their own (README.md: the board).
PROGRESS = "progress"
PROGRESS_ACCESS = f"access:services!service={PROGRESS}"
BOARD_SCOPE = "custom:progress:board"
progress_url = f"http://127.0.0.1:{settings['progress_port']}"
formgrader_url = f"http://127.0.0.1:{settings['formgrader_port']}"


def listen_as_grader(url):
    """The formgrader and the progress service run as the grader account on ports below
    1024, bound by the hub's root before it becomes the grader (listen.py): no learner's
    process can take their address while the hub restarts and collect the tokens sent to
    it (README.md: "What is protected")."""
    return [str(ENV_BIN / "python"), str(KIT / "listen.py"), "--user", settings["grader"],
            "--url", url, "--"]


c.JupyterHub.custom_scopes = {
    BOARD_SCOPE: {"description": "read the class's progress board, its JSON and CSV"}}
c.JupyterHub.load_roles = [
    {"name": "instructor", "groups": ["instructors"],
     "scopes": [f"access:services!service={course_id}", "list:users", "read:users",
                "admin:servers", PROGRESS_ACCESS, BOARD_SCOPE]},
    {"name": "progress-reporter", "users": sorted(learners), "scopes": [PROGRESS_ACCESS]},
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]
c.JupyterHub.services = [
    {
        "name": course_id,
        "url": formgrader_url,
        "cwd": settings["course_folder"],
        "command": [*listen_as_grader(formgrader_url), str(ENV_BIN / "python"),
                    str(STATE / "config" / "grader" / "formgrader.py"),
                    f"--ServerApp.root_dir={grader_home}"],
        "environment": {
            "JUPYTER_CONFIG_PATH": str(STATE / "config" / "grader"),
            "JUPYTERHUB_DEFAULT_URL": "/formgrader",
            "PATH": f"{ENV_BIN}:{SYSTEM_PATH}",
        },
        "oauth_no_confirm": True,
    },
    {
        "name": PROGRESS,
        "url": progress_url,
        "cwd": str(STATE / "progress"),
        "command": [*listen_as_grader(progress_url), str(ENV_BIN / "python"), "-m",
                    "progress.service",
                    f"--data={STATE / 'progress'}", f"--learners={STATE / 'learners.txt'}",
                    f"--formgrader=/services/{course_id}/formgrader",
                    f"--exercises={STATE / 'config' / 'progress' / 'exercises.json'}",
                    *(["--anonymous-survey"] if settings.get("anonymous_survey") else [])],
        "environment": {"PYTHONPATH": str(STATE / "config"),
                        "PATH": f"{ENV_BIN}:{SYSTEM_PATH}"},
        "oauth_no_confirm": True,
        # An instructor's login gives the service a token with the board's scope; a
        # learner's, without it (they do not hold it), is refused the board.
        "oauth_client_allowed_scopes": [BOARD_SCOPE],
    },
    {
        "name": "idle-culler",
        "command": [str(ENV_BIN / "python"), "-m", "jupyterhub_idle_culler",
                    f"--timeout={settings['idle_timeout_s']}"],
    },
]


def landing_page(handler):
    """Instructors land on the formgrader (in a tab of its own: inside JupyterLab's panel
    it stays blank under JupyterHub 4.1+, nbgrader#1870); learners on their JupyterLab."""
    user = handler.current_user
    if user is not None and user.name in instructors:
        return f"/services/{course_id}/formgrader"
    return None


c.JupyterHub.default_url = landing_page

# Each learner's JupyterLab, as that learner, in their home: the course's learner settings
# (config/learner: the Assignment List and Validate, no instructor panel), the course's
# notebooks copied in on first start (course/first_start.py).
c.Spawner.cmd = [str(STATE / "course" / "jupyterhub-learner")]
c.Spawner.default_url = "/lab/tree/notebooks"
c.Spawner.notebook_dir = "~"
# The server reads no settings, extensions or Python packages from the learner's home
# (~/.jupyter, ~/.local/share/jupyter/labextensions, ~/.local/lib: the start command runs
# Python with -s): what it serves is the class's JupyterLab, not pages the learner wrote.
c.Spawner.disable_user_config = True
limits = settings.get("limits", {})
c.Spawner.environment = {
    "JUPYTER_CONFIG_PATH": str(STATE / "config" / "learner"),
    "JUPYTER_PREFER_ENV_PATH": "1",
    "PATH": f"{ENV_BIN}:{SYSTEM_PATH}",
    # first_start.py sets these rlimits on the server, so on every kernel, terminal and
    # launch under it (README.md: limits).
    "CLASSROOM_LIMITS": json.dumps(limits),
    # Where workshop_lib.progress sends each verdict, with the server's own token (its
    # kernels inherit JUPYTERHUB_API_TOKEN): the service directly, on the loopback
    # interface, as the hub reaches it (a SLURM job on another node needs the service on an
    # address it reaches, like the hub's API: README.md, SLURM settings).
    "CLASS_PROGRESS_URL": f"{progress_url}/services/{PROGRESS}/",
    # workshop_lib.progress sends the token only to a listener of root's or this account's.
    "CLASS_PROGRESS_OWNER": settings["grader"],
}
# The server's token: JupyterHub's default ('server' role) and the progress service.
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server",
                                 PROGRESS_ACCESS]
gpu_ids, gpus_each = settings.get("gpu_ids", []), settings.get("gpus_per_learner", 0)
if settings["spawner"] == "local" and gpus_each and gpu_ids:
    # Learner k of learners.txt gets the k-th run of gpus_each devices, round the list; the
    # others are closed to them by their devices group where the host has one (limits.py).
    order = sorted(learners)

    def assign_gpus(spawner):
        k = order.index(spawner.user.name) if spawner.user.name in order else 0
        picked = [gpu_ids[(k * gpus_each + i) % len(gpu_ids)] for i in range(gpus_each)]
        spawner.environment["CUDA_VISIBLE_DEVICES"] = ",".join(picked)

    c.Spawner.pre_spawn_hook = assign_gpus
# A class logging in at once: start at most this many servers together, and give each
# the time a busy machine needs (jupyterhub#3396).
c.JupyterHub.concurrent_spawn_limit = 10
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 180

if settings["spawner"] == "slurm":
    # Each learner's JupyterLab is a SLURM job of theirs (submitted with sudo as them),
    # with its share of GPUs: SLURM sets CUDA_VISIBLE_DEVICES in the job.
    import batchspawner  # noqa: F401 - adds the API the jobs report their port to

    slurm = settings["slurm"]
    c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
    c.SlurmSpawner.batchspawner_singleuser_cmd = str(ENV_BIN / "batchspawner-singleuser")
    c.SlurmSpawner.exec_prefix = "sudo -E -u {username}"
    gpus = slurm["gpus_per_learner"]
    c.SlurmSpawner.req_gres = f"gpu:{gpus}" if gpus else ""
    # CPUs and memory with the GPUs (batchspawner writes --cpus-per-task and --mem only
    # when these are set; without them a seat gets SLURM's default of one CPU).
    if gpus:
        c.SlurmSpawner.req_nprocs = str(slurm.get("cpus_per_gpu", 4) * gpus)
        per_gpu = slurm.get("mem_per_gpu", "16G")
        c.SlurmSpawner.req_memory = f"{int(per_gpu[:-1]) * gpus}{per_gpu[-1]}" \
            if per_gpu[-1].isalpha() else str(int(per_gpu) * gpus)
    else:
        c.SlurmSpawner.req_nprocs = str(slurm.get("cpus", 2))
        c.SlurmSpawner.req_memory = slurm.get("mem", "4G")
    c.SlurmSpawner.req_partition = slurm["partition"]
    c.SlurmSpawner.req_runtime = slurm["runtime"]
    # A job waiting in the queue longer than this is cancelled (README.md: sizing).
    c.SlurmSpawner.start_timeout = slurm["start_timeout_s"]
    if slurm["slurm_conf"]:
        # The hub's own squeue and scancel, and each learner's sbatch, talk to this cluster.
        os.environ["SLURM_CONF"] = slurm["slurm_conf"]
        c.Spawner.environment["SLURM_CONF"] = slurm["slurm_conf"]
    if slurm["exechost"]:
        # One machine whose node names do not resolve: the hub reaches every job's server
        # at this address, and the server listens there only (batchspawner's default, for
        # servers on other machines, is every interface).
        c.SlurmSpawner.state_exechost_exp = slurm["exechost"]
        c.Spawner.args = [f"--ServerApp.ip={slurm['exechost']}"]
else:
    # Each learner's server, and all under it, in the learner's control groups: memory, CPU
    # and processes for the learner as a whole, and only their GPUs (limits.py).
    from jupyterhub.spawner import LocalProcessSpawner
    from limits import Cgroups, join

    cgroups = Cgroups(limits)

    class LimitedSpawner(LocalProcessSpawner):
        def make_preexec_fn(self, name):
            become = super().make_preexec_fn(name)
            if cgroups.version is None:
                return become
            visible = self.environment.get("CUDA_VISIBLE_DEVICES", "").split(",")
            procs = cgroups.make(name, gpu_ids, visible)

            def preexec():
                join(procs)  # as root, before becoming the learner
                become()

            return preexec

    c.JupyterHub.spawner_class = LimitedSpawner
