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
"""
import argparse
import importlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import tomllib

KIT = Path(__file__).resolve().parent
REPO = KIT.parents[1]
COURSE_ID = "ddp-workshop"  # assessment/nbgrader_config.py's CourseDirectory.course_id
ASSIGNMENT_DIR = "ddp_refactor"  # learners fetch it from the exchange: not in their home
DEFAULT_PYTHON = "/usr/bin/python3.11"
# Entries of the course environment that the class environment makes its own: the
# development-mode install of workshop_lib points into the repository, which learners'
# accounts may not be able to read.
NOT_LINKED = re.compile(r"^(__editable__.*|workshop_lib-.*\.dist-info|__pycache__)$")
# Files in the grader's copy of assessment/ that belong to the instructor's own runs.
NOT_COPIED = ("gradebook.db", "submitted", "autograded", "feedback", "grades.csv",
              "autograde.log", "runs", "grading_run", "train_digits*.py", "__pycache__",
              ".ipynb_checkpoints", "release")
# Run by the class environment's Python: the installed distributions whose Requires-Python
# excludes it.
UNSUPPORTED_DISTRIBUTIONS = """
import importlib.metadata, sys
from packaging.specifiers import SpecifierSet
version = "%d.%d.%d" % sys.version_info[:3]
for dist in importlib.metadata.distributions():
    needs = dist.metadata.get("Requires-Python")
    if needs and not SpecifierSet(needs).contains(version, prereleases=True):
        print(dist.metadata["Name"])
"""
# Run by the class environment's Python: the exercises and the assessment in the day's
# order (workshop_lib.day: the day's sessions, then the second day's), grouped by notebook.
CATALOGUE = """
import json
from pathlib import Path
from workshop_lib import day, labs
sessions = sorted(day.SESSIONS, key=lambda session: session.minutes is None)
exercises, found = labs.catalogue(), []
for stem in [Path(session.notebook).stem for session in sessions]:
    found += [{"key": key, "notebook": stem, "kind": "exercise"}
              for key, notebook in exercises.items() if notebook == stem]
    if stem == "ASSIGNMENT":
        found.append({"key": stem, "notebook": stem, "kind": "assessment"})
found += [{"key": key, "notebook": notebook, "kind": "exercise"}
          for key, notebook in exercises.items() if key not in {f["key"] for f in found}]
print(json.dumps(found))
""".replace("ASSIGNMENT", ASSIGNMENT_DIR)
PASSWORD_LENGTH = {"class_password": 12, "instructor_password": 20}
# Learners' passwords are read off a printed card: no characters that look alike.
CARD_ALPHABET = "abcdefghjkmnpqrstuvwxyzACDEFGHJKLMNPQRTUVWXY34679"
LEARNER_PASSWORD_LENGTH = 12
# nbgrader's own modes for the course's exchange folders (exchange/default/*.py): the
# course and outbound readable by all, inbound writable and not listable, feedback
# enterable and not listable.
EXCHANGE_MODES = {"": 0o755, "outbound": 0o755, "inbound": 0o2733, "feedback": 0o711}
SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# The addresses on the loopback interface that the class's tokens and passwords go to:
# ports only root can bind (serve checks; README.md, "What is protected").
INTERNAL_PORTS = {"hub_port": 881, "proxy_api_port": 882, "formgrader_port": 883,
                  "progress_port": 884}


class KitError(Exception):
    """A one-line reason why the command cannot go on, and what to do."""


def run(*command, **kwargs):
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                            **kwargs)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines() or ["(no output)"]
        raise KitError(f"{' '.join(map(str, command))} failed: {said[-1]}")
    return result.stdout


def settings_path(state):
    return state / "class.json"


def load_settings(state):
    path = settings_path(state)
    if not path.exists():
        raise KitError(f"{state} has no class settings yet: run `classroom.py --state {state} "
                       f"init` first")
    return json.loads(path.read_text())


def env_python(state):
    return state / "env" / "bin" / "python"


# ---------------------------------------------------------------------------------- env

def classroom_pins():
    """The exact versions of JupyterHub and its parts: pyproject.toml's `classroom` group."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    return project["project"]["optional-dependencies"]["classroom"]


def python_version(python):
    return run(python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").strip()


def link_tree(source, target):
    """``target`` as a copy of ``source`` made of hard links (no space, instant); a copy
    where they are on different file systems."""
    if target.exists():
        shutil.rmtree(target)
    try:
        run("cp", "-a", "--link", source, target)
    except KitError:
        shutil.rmtree(target, ignore_errors=True)
        run("cp", "-a", source, target)


def rewrite_script(source, target, old_bins, new_python):
    """A console script of the course environment (its first line runs a Python of one of
    ``old_bins``), for the class environment's Python; False for any other file. Written
    as a new file: ``source`` may share its inode with the course's."""
    data = source.read_bytes()
    first, _, rest = data.partition(b"\n")
    interpreter = first[2:].decode(errors="replace").strip()
    if first.startswith(b"#!") and str(Path(interpreter).parent) in old_bins \
            and Path(interpreter).name.startswith("python"):
        target.write_bytes(b"#!" + str(new_python).encode() + b"\n" + rest)
        target.chmod(0o755)
        return True
    return False


def build_env(state, course_env, python):
    """DIR/env: a virtual environment of ``python`` (Debian's, readable by every account)
    holding the course environment's packages as hard links, workshop_lib as a plain copy,
    and the classroom pins installed with pip."""
    given_bin = str(Path(course_env).absolute() / "bin")
    course_env = Path(course_env).resolve()
    if not (course_env / "pyvenv.cfg").exists():
        raise KitError(f"{course_env} is not the course's environment: run `make setup` first")
    if not Path(python).exists():
        raise KitError(f"{python} not found: apt-get install python3.11 (the class "
                       f"environment needs a Python that every account can run)")
    course_python = course_env / "bin" / "python"
    version = python_version(course_python)
    if python_version(python) != version:
        raise KitError(f"{python} is Python {python_version(python)}, the course environment "
                       f"{version}: pass --python with a Python {version} outside /root")
    env = state / "env"
    site = f"lib/python{version}/site-packages"
    # Built again only when the course environment, the pins or the Python change.
    built_from = json.dumps({"course_env": str(course_env), "python": str(python),
                             "packages": sorted(p.name for p in (course_env / site).iterdir()),
                             "pins": classroom_pins()})
    stamp = env / ".built-from"
    if stamp.exists() and stamp.read_text() == built_from:
        return None
    if env.exists():
        shutil.rmtree(env)
    run(python, "-m", "venv", "--without-pip", env)
    for entry in sorted((course_env / site).iterdir()):
        if not NOT_LINKED.match(entry.name):
            link_tree(entry, env / site / entry.name)
    shutil.copytree(REPO / "workshop_lib", env / site / "workshop_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    link_tree(course_env / "share", env / "share")
    # etc/ is small and the class changes it: a copy. The course's nbgrader_config.py
    # finds a course folder through the repository; the class names its own.
    shutil.copytree(course_env / "etc", env / "etc")
    (env / "etc" / "jupyter" / "nbgrader_config.py").unlink(missing_ok=True)
    for script in sorted((course_env / "bin").iterdir()):
        target = env / "bin" / script.name
        if target.exists() or target.is_symlink() or script.name.startswith("activate"):
            continue
        if not rewrite_script(script, target, {given_bin, str(course_env / "bin")},
                              env / "bin" / "python"):
            link_tree(script, target)
    # A linked package may not support this Python: pip chose it for the course
    # environment's (Debian 12's 3.11.2 and soupsieve 4.1.3, which needs 3.11.5 and fails on
    # every CSS selector, so nbgrader's feedback). pip picks those again, for this Python.
    python_bin = env / "bin" / "python"
    unsupported = run(python_bin, "-c", UNSUPPORTED_DISTRIBUTIONS).split()
    if unsupported:
        run(python_bin, "-m", "pip", "uninstall", "--quiet", "--yes", *unsupported)
    run(python_bin, "-m", "pip", "install", "--quiet", "--no-warn-script-location",
        *classroom_pins(), *unsupported)
    still = run(python_bin, "-c", UNSUPPORTED_DISTRIBUTIONS).split()
    if still:
        raise KitError(f"no version of {', '.join(still)} supports {python}: pass --python "
                       f"with a newer Python {version}")
    run(python_bin, "-m", "pip", "check")
    # Readable by every account (linked files share their modes with the course's: this
    # only ever adds read permission).
    run("chmod", "-R", "a+rX", env)
    stamp.write_text(built_from)
    return unsupported


def install_proxy(state):
    """configurable-http-proxy, at the version package-lock.json pins, in DIR/proxy."""
    if not shutil.which("npm") or not shutil.which("node"):
        raise KitError("npm not found: install Node.js 20 or newer with npm (JupyterHub's "
                       "proxy, configurable-http-proxy, is a Node program)")
    node = run("node", "--version").strip()
    if int(node.lstrip("v").split(".")[0]) < 20:
        raise KitError(f"Node.js {node}: configurable-http-proxy 5.3.0 needs 20 or newer")
    proxy = state / "proxy"
    proxy.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(KIT / name, proxy / name)
    wanted = json.loads((KIT / "package.json").read_text())["dependencies"]
    installed = proxy / "node_modules" / "configurable-http-proxy" / "package.json"
    if not (installed.exists() and json.loads(installed.read_text())["version"]
            == wanted["configurable-http-proxy"]):
        run("npm", "ci", "--omit=dev", "--no-audit", "--no-fund", "--prefix", proxy)


def command_env(args):
    state = args.state
    ensure_reachable(state)
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)
    reinstalled = build_env(state, args.course_env, args.python)
    install_proxy(state)
    if reinstalled is None:
        print(f"{state / 'env'}: the class environment is up to date")
    else:
        print(f"{state / 'env'}: the class environment ({' '.join(classroom_pins())}"
              + (f"; reinstalled for {args.python}: {', '.join(reinstalled)}"
                 if reinstalled else "") + ")")
    print(f"{state / 'proxy'}: configurable-http-proxy")


# --------------------------------------------------------------------------------- init

def user_exists(name):
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def recorded_accounts(state):
    path = state / "accounts.txt"
    return path.read_text().split() if path.exists() else []


def record_account(state, name):
    accounts = recorded_accounts(state)
    if name not in accounts:
        (state / "accounts.txt").write_text("\n".join([*accounts, name]) + "\n")


def add_account(state, name, home, comment):
    """A locked Unix account (no password: people log in through the hub) whose home only
    it can open."""
    if user_exists(name):
        if name not in recorded_accounts(state):
            raise KitError(f"an account named {name} already exists and is not this class's: "
                           f"choose another name (--prefix, --grader)")
        return
    run("useradd", "--create-home", "--home-dir", home, "--shell", "/bin/bash",
        "--user-group", "--comment", comment, "--key", "HOME_MODE=0700", name)
    record_account(state, name)
    # useradd follows login.defs (Debian's: umask 022, a world-readable home) unless told.
    home.chmod(0o700)


def copy_learner_material(state):
    """DIR/course: what each learner's home receives on first start (the notebooks and the
    cluster files), and the script that copies it, readable by every account."""
    sys.path.insert(0, str(REPO / "jupyter" / "learner"))
    sys.dont_write_bytecode = True  # root writes nothing into the repository
    try:
        import make_workspace
    finally:
        sys.path.pop(0)
    course = state / "course"
    if course.exists():
        shutil.rmtree(course)
    for relative, original in make_workspace.learner_files().items():
        if relative.parts[0] == ASSIGNMENT_DIR or relative.parts[:2] == ("deploy", "classroom"):
            continue
        target = course / "files" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(original, target)
    # The hub's command for every learner's server (a Python script: batchspawner runs it
    # inside its own wrapper).
    start = course / "jupyterhub-learner"
    # -s: no site-packages from the learner's ~/.local in the server (its kernels keep them).
    start.write_text(f"#!{env_python(state)} -s\n"
                     + (KIT / "learner" / "first_start.py").read_text())
    run("chmod", "-R", "a+rX,go-w", course)
    start.chmod(0o755)


def install_config(state, settings):
    """DIR/config: the learners' and the grader's Jupyter settings (README.md lists them)."""
    config = state / "config"
    if config.exists():
        shutil.rmtree(config)
    shutil.copytree(KIT / "learner", config / "learner",
                    ignore=shutil.ignore_patterns("first_start.py", "__pycache__"))
    shutil.copytree(KIT / "grader", config / "grader",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # The progress service's code (a package the hub runs with PYTHONPATH=config): the
    # repository may be closed to the grader account that runs it.
    shutil.copytree(KIT / "progress", config / "progress",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (config / "class.json").write_text(json.dumps(
        {"course_id": settings["course_id"], "exchange": str(state / "exchange"),
         "course_folder": settings["course_folder"]}, indent=1) + "\n")
    # The board's columns: every exercise of the day, as the class's notebooks order them.
    (config / "progress" / "exercises.json").write_text(run(env_python(state), "-c", CATALOGUE))
    run("chmod", "-R", "a+rX,go-w", config)


def make_exchange(state, grader, course_id):
    """nbgrader's exchange: the root with the modes nbgrader's release insists on (open to
    all; the sticky bit added), and the course's folders in it made now, before any learner
    exists, as the grader's, with nbgrader's modes. A folder of the course that another
    account made first (a learner squatting the course's name) is refused: the grader
    could not release into it, and its owner would read every submission."""
    exchange = state / "exchange"
    exchange.mkdir(exist_ok=True)
    exchange.chmod(0o1777)
    owner = pwd.getpwnam(grader)
    for name, mode in EXCHANGE_MODES.items():
        folder = exchange / course_id / name
        if folder.is_symlink() or (folder.exists() and folder.stat().st_uid != owner.pw_uid):
            holder = folder.lstat().st_uid
            raise KitError(f"{folder} belongs to uid {holder}, not the grader {grader}: "
                           f"remove it (a squatted course folder) and run init again")
        folder.mkdir(exist_ok=True)
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        folder.chmod(mode)


def exchange_filesystem(state, settings):
    """The exchange on a filesystem of its own (disks.py), where the host can loop-mount."""
    if settings.get("exchange_bytes") and disks().problem() is None:
        (state / "exchange").mkdir(exist_ok=True)
        try:
            disks().make_exchange(state, state / "exchange", settings["exchange_bytes"])
        except OSError as error:
            raise KitError(f"cannot give the exchange a filesystem of its own ({error}): "
                           f"`init --exchange-size 0` keeps it a plain folder") from None


def make_progress_folder(state, grader):
    """DIR/progress: the progress service's database, the grader's alone (the service runs
    as the grader); kept by a new init (it holds the day's records)."""
    folder = state / "progress"
    if folder.is_symlink() or (folder.exists() and folder.stat().st_uid
                               != pwd.getpwnam(grader).pw_uid):
        raise KitError(f"{folder} is not the grader {grader}'s: remove it and run init again")
    folder.mkdir(exist_ok=True)
    shutil.chown(folder, grader, grader)
    folder.chmod(0o700)
    return folder


def copy_course_folder(state, grader):
    """The grader's copy of assessment/, with its nbgrader_config.py and grading guards:
    the formgrader's course folder. Kept if it exists (it holds the gradebook)."""
    home = Path(pwd.getpwnam(grader).pw_dir)
    course = home / "assessment"
    if not course.exists():
        shutil.copytree(REPO / "assessment", course,
                        ignore=shutil.ignore_patterns(*NOT_COPIED))
        run("chown", "-R", f"{grader}:{grader}", course)
        run("chmod", "-R", "go-rwx", course)
    return course


def secrets_folder(state):
    folder = state / "secrets"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o700)
    return folder


def write_secrets(state, given, shared_class_password):
    """The instructors' password, and the class password only where the instructor asked
    for one (without it, nobody logs in with it: the file goes)."""
    folder = secrets_folder(state)
    for name, length in PASSWORD_LENGTH.items():
        path = folder / name
        if name == "class_password" and not shared_class_password:
            path.unlink(missing_ok=True)
            continue
        if given.get(name):
            path.write_text(given[name] + "\n")
        elif not path.exists():
            path.write_text(secrets.token_urlsafe(length)[:length] + "\n")
        path.chmod(0o600)


def parse_size(text):
    """``"8G"`` -> bytes; ``"0"`` -> 0 (no limit)."""
    found = re.fullmatch(r"(\d+)([KMGT]?)", text.strip().upper())
    if not found:
        raise KitError(f"{text!r} is not a size: a number with K, M, G or T, e.g. 8G")
    return int(found[1]) * SIZE_UNITS.get(found[2], 1)


def tls_files(state, args):
    """``(certificate, key)`` the hub serves HTTPS with, or ``(None, None)`` for plain HTTP,
    which only the loopback interface gets unless --insecure-http says otherwise."""
    if args.ssl_cert or args.ssl_key:
        if not (args.ssl_cert and args.ssl_key):
            raise KitError("--ssl-cert and --ssl-key go together: give both")
        for path in (args.ssl_cert, args.ssl_key):
            if not Path(path).is_file():
                raise KitError(f"{path} not found: give the certificate and key files")
        return str(Path(args.ssl_cert).resolve()), str(Path(args.ssl_key).resolve())
    if args.self_signed:
        return self_signed_certificate(state, args.self_signed)
    if args.ip not in LOOPBACK and not args.insecure_http:
        raise KitError(f"--ip {args.ip} without TLS would send passwords and cookies in "
                       f"clear: give --ssl-cert/--ssl-key, or --self-signed NAME, or "
                       f"--insecure-http to accept that")
    return None, None


def self_signed_certificate(state, name):
    """A certificate for ``name`` (the server's DNS name or address) signed by itself, and
    its key, in DIR/secrets; kept when it exists for the same name."""
    if not shutil.which("openssl"):
        raise KitError("openssl not found: apt-get install openssl (for --self-signed), or "
                       "give --ssl-cert/--ssl-key")
    folder = secrets_folder(state)
    cert, key, made_for = folder / "tls.crt", folder / "tls.key", folder / "tls.name"
    if not (cert.exists() and key.exists() and made_for.exists()
            and made_for.read_text() == name):
        kind = "IP" if re.fullmatch(r"[\d.]+|[0-9a-fA-F:]+", name) else "DNS"
        alt = f"subjectAltName={kind}:{name}" + ("" if name in LOOPBACK else
                                                 ",IP:127.0.0.1")
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
            "-days", "30", "-subj", f"/CN={name}", "-addext", alt,
            "-keyout", key, "-out", cert)
        made_for.write_text(name)
    key.chmod(0o600)
    return str(cert), str(key)


def closed_folders(path):
    """``path`` and the folders above it that other accounts cannot pass through."""
    return [folder for folder in (path, *path.parents)
            if folder.exists() and not folder.stat().st_mode & stat.S_IXOTH]


def ensure_reachable(state):
    """Every account reaches the class folder (its environment, the exchange, its home)."""
    closed = closed_folders(state.parent)
    if closed:
        raise KitError(f"{closed[0]} is closed to other accounts (mode "
                       f"{stat.S_IMODE(closed[0].stat().st_mode):o}), so learners could not "
                       f"reach {state}: choose a class folder every account can reach, e.g. "
                       f"/srv/ddp-workshop")


def command_init(args):
    state = args.state
    ensure_reachable(state)
    if not env_python(state).exists():
        raise KitError(f"{state / 'env'} is missing: run `classroom.py --state {state} env` "
                       f"first")
    for folder in (state, state / "homes"):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)  # every account reaches its own home and the shared files
    hub = state / "hub"
    hub.mkdir(exist_ok=True)
    hub.chmod(0o700)
    gpu_ids = [g for g in args.gpu_ids.split(",") if g] if args.gpu_ids else []
    if args.spawner == "local" and args.gpus_per_learner and not gpu_ids:
        raise KitError("--gpus-per-learner with the local spawner needs --gpu-ids (the "
                       "devices to share out, e.g. 0,1,2,3)")
    ssl_cert, ssl_key = tls_files(state, args)
    add_account(state, args.grader, state / "grader", "ddp-workshop grader")
    course_folder = copy_course_folder(state, args.grader)
    make_progress_folder(state, args.grader)
    settings = {
        "course_id": COURSE_ID,
        "grader": args.grader,
        "course_folder": str(course_folder),
        "instructors": args.instructors,
        "ip": args.ip, "port": args.port, "hub_port": args.hub_port,
        "proxy_api_port": args.proxy_api_port, "formgrader_port": args.formgrader_port,
        "progress_port": args.progress_port, "anonymous_survey": args.anonymous_survey,
        "idle_timeout_s": args.idle_timeout,
        "spawner": args.spawner,
        "shared_class_password": args.shared_class_password,
        "ssl_cert": ssl_cert, "ssl_key": ssl_key,
        "limits": {"data_bytes": parse_size(args.memory_limit), "nproc": args.nproc_limit,
                   "fsize_bytes": parse_size(args.file_size_limit),
                   "memory_bytes": parse_size(args.learner_memory), "cpus": args.learner_cpus},
        "gpus_per_learner": args.gpus_per_learner, "gpu_ids": gpu_ids,
        "home_bytes": parse_size(args.home_size),
        "exchange_bytes": parse_size(args.exchange_size),
        "exchange_quota_bytes": parse_size(args.exchange_quota),
        "slurm": {"gpus_per_learner": args.gpus_per_learner, "partition": args.partition,
                  "slurm_conf": args.slurm_conf, "exechost": args.exechost,
                  "runtime": args.runtime, "start_timeout_s": args.start_timeout,
                  "cpus_per_gpu": args.cpus_per_gpu, "mem_per_gpu": args.mem_per_gpu,
                  "cpus": args.cpus_per_seat, "mem": args.mem_per_seat},
    }
    check_internal_ports(settings)
    settings_path(state).write_text(json.dumps(settings, indent=1) + "\n")
    settings_path(state).chmod(0o644)
    write_secrets(state, {"class_password": os.environ.get("CLASS_PASSWORD"),
                          "instructor_password": os.environ.get("CLASS_INSTRUCTOR_PASSWORD")},
                  args.shared_class_password)
    exchange_filesystem(state, settings)
    make_exchange(state, args.grader, COURSE_ID)
    copy_learner_material(state)
    install_config(state, settings)
    write_slurm_limit(state, settings)
    scheme = "https" if ssl_cert else "http"
    print(f"{state}: class {COURSE_ID}, grader {args.grader} ({course_folder}), "
          f"instructors {', '.join(args.instructors) or 'none'}, {args.spawner} spawner, "
          f"{scheme}; passwords in {state / 'secrets'}")
    if args.shared_class_password:
        print("WARNING: --shared-class-password: every learner logs in with one class "
              "password, so any learner can log in as any other and read, change and submit "
              "their work. Use it only where learners are not graded.", file=sys.stderr)


# ----------------------------------------------------------------------------- accounts

def learner_names(prefix, count):
    width = max(2, len(str(count)))
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def command_accounts(args):
    state = args.state
    settings = load_settings(state)
    if args.action == "add":
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,20}", args.prefix):
            raise KitError(f"--prefix {args.prefix!r}: lower-case letters, digits and '-', "
                           f"starting with a letter, at most 21 characters")
        names = learner_names(args.prefix, args.count)
        own_disks = settings.get("home_bytes") and disks().problem() is None
        for name in names:
            add_account(state, name, state / "homes" / name, "ddp-workshop learner")
            if own_disks:  # a home of its own size (disks.py)
                try:
                    disks().make(state, name, state / "homes" / name, settings["home_bytes"])
                except OSError as error:
                    raise KitError(f"cannot give {name} a home filesystem ({error}): "
                                   f"`init --home-size 0` keeps plain folders") from None
        quota = settings.get("exchange_quota_bytes")
        if quota and disks().exchange_problem(state / "exchange") is None:
            for name in names:
                disks().limit_in_exchange(state / "exchange", name, quota)
        learners = sorted(set(load_learners(state)) | set(names))
        (state / "learners.txt").write_text("\n".join(learners) + "\n")
        write_slurm_limit(state, settings)
        made = set_learner_passwords(state, names)
        sheet = write_handout(state, settings)
        print(f"{len(names)} learner accounts: {names[0]} .. {names[-1]} (homes in "
              f"{state / 'homes'}; {len(made)} new passwords, the hand-out sheet {sheet}, "
              f"readable by root only); restart the hub to let new ones in (`serve` ends "
              f"the class accounts' processes before it starts the hub)")
    else:
        removed = remove_accounts(state, keep={settings["grader"]})
        (state / "learners.txt").unlink(missing_ok=True)
        write_slurm_limit(state, settings)
        passwords = learner_passwords(state)
        save_learner_passwords(state, {name: word for name, word in passwords.items()
                                       if name not in removed})
        write_handout(state, settings)
        print(f"removed {len(removed)} learner accounts")


def learner_passwords(state):
    """``{account: password}`` from DIR/secrets/learner_passwords (root's only)."""
    path = state / "secrets" / "learner_passwords"
    if not path.exists():
        return {}
    return dict(line.split(" ", 1) for line in path.read_text().splitlines() if line)


def save_learner_passwords(state, passwords):
    path = secrets_folder(state) / "learner_passwords"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f"{name} {word}\n" for name, word in sorted(passwords.items())))


def set_learner_passwords(state, names):
    """A random password for each of ``names`` that has none yet, set on the account with
    chpasswd (the hub checks it through PAM) and kept for the hand-out sheet."""
    passwords = learner_passwords(state)
    made = {name: "".join(secrets.choice(CARD_ALPHABET)
                          for _ in range(LEARNER_PASSWORD_LENGTH))
            for name in names if name not in passwords}
    if made:
        subprocess.run(["chpasswd"], input="".join(f"{n}:{w}\n" for n, w in made.items()),
                       text=True, capture_output=True, check=True)
        save_learner_passwords(state, {**passwords, **made})
    return made


def write_handout(state, settings):
    """DIR/secrets/handout.txt: one card per learner (address, account, password), cut
    along the lines and handed to each learner; root's only, like the passwords."""
    scheme = "https" if settings.get("ssl_cert") else "http"
    address = f"{scheme}://{settings['ip']}:{settings['port']}/"
    cut = "-" * 60
    cards = [f"{cut}\n  DDP workshop -- {address}\n  account:  {name}\n"
             f"  password: {word}\n  (yours alone: do not share it)\n"
             for name, word in learner_passwords(state).items()]
    path = secrets_folder(state) / "handout.txt"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(cards) + (cut + "\n" if cards else ""))
    return path


def load_learners(state):
    path = state / "learners.txt"
    return path.read_text().split() if path.exists() else []


def remove_accounts(state, keep=()):
    """Remove the accounts this kit created (and their homes), except ``keep``."""
    removed, kept = [], []
    for name in recorded_accounts(state):
        if name in keep:
            kept.append(name)
            continue
        if user_exists(name):
            # Processes left by the account (a server the hub did not stop) would keep
            # userdel from removing it, and its home filesystem from being unmounted.
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
            home = Path(pwd.getpwnam(name).pw_dir)
            try:
                disks().unmount(state, name, home)
            except OSError as error:
                raise KitError(f"cannot unmount {home}: {error}") from None
            run("userdel", "--remove", name)
        removed.append(name)
    (state / "accounts.txt").write_text("".join(f"{name}\n" for name in kept))
    return removed


def command_down(args):
    state = args.state
    removed = remove_accounts(state)
    print(f"removed {len(removed)} accounts ({', '.join(removed) or 'none'})")
    try:
        disks().unmount_exchange(state, state / "exchange")
    except OSError as error:
        raise KitError(f"cannot unmount {state / 'exchange'}: {error}") from None
    if settings_path(state).exists():
        left = kit_module("limits").remove_groups(load_settings(state).get("limits", {}))
        if left:
            print(f"control groups still in use, not removed: {', '.join(left)}")
    if args.purge:
        shutil.rmtree(state)
        print(f"removed {state}")


# -------------------------------------------------------------------------------- serve

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


def process_uids(pid_folder):
    """The real, effective, saved and file-system uids of a process (its /proc folder's
    owner is not enough: a process that makes itself non-dumpable shows root's)."""
    fields = dict(line.split(":", 1) for line in (pid_folder / "status").read_text()
                  .splitlines() if ":" in line)
    if fields.get("State", "").split()[:1] in (["Z"], ["X"]):
        return set()  # ended already, waiting for its parent to read its status
    return {int(uid) for uid in fields.get("Uid", "").split()}


def end_processes_of_accounts(state):
    """End every process of the class's accounts (learners and grader) on this machine: none
    may hold an address of the hub's while it starts, nor outlive it. ``(account, count)``
    for each account that had any."""
    uids = {pwd.getpwnam(name).pw_uid: name for name in recorded_accounts(state)
            if user_exists(name)}
    counts, ended = {}, True
    for _ in range(50):  # again while any were found: one may have forked meanwhile
        if not ended:
            break
        ended = False
        for folder in Path("/proc").iterdir():
            try:
                owners = process_uids(folder) & set(uids) if folder.name.isdigit() else set()
                if owners:
                    os.kill(int(folder.name), signal.SIGKILL)
                    name = uids[owners.pop()]
                    counts[name], ended = counts.get(name, 0) + 1, True
            except (FileNotFoundError, ProcessLookupError):
                pass
    return sorted(counts.items())


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


def kit_module(name):
    """One of the kit's modules beside this file (limits.py, disks.py, ...)."""
    sys.path.insert(0, str(KIT))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def disks():
    """The kit's disks.py (the homes' filesystems)."""
    return kit_module("disks")


def write_slurm_limit(state, settings):
    """Under SLURM, the class's job_submit.lua for these learners (slurm_gpus.py)."""
    if settings["spawner"] == "slurm":
        kit_module("slurm_gpus").write(state, load_learners(state),
                                       settings["slurm"]["gpus_per_learner"])


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


# ---------------------------------------------------------------------------------- CLI

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
