"""`classroom.py init`: the class's settings (DIR/class.json), the instructors' password
and TLS files (DIR/secrets), the grader and its copy of assessment/, nbgrader's exchange,
the progress service's folder and the learners' material and Jupyter settings.
"""
import json
import os
import pwd
import re
import secrets
import shutil
import sys
from pathlib import Path

from kit import (
    ASSIGNMENT_DIR,
    COURSE_ID,
    KIT,
    LOOPBACK,
    REPO,
    KitError,
    disks,
    ensure_reachable,
    env_python,
    parse_size,
    run,
    secrets_folder,
    settings_path,
    write_slurm_limit,
)
from kit_accounts import add_account
from kit_serve import check_internal_ports

# Files in the grader's copy of assessment/ that belong to the instructor's own runs.
NOT_COPIED = ("gradebook.db", "submitted", "autograded", "feedback", "grades.csv",
              "autograde.log", "runs", "grading_run", "train_digits*.py", "__pycache__",
              ".ipynb_checkpoints", "release")
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
# nbgrader's own modes for the course's exchange folders (exchange/default/*.py): the
# course and outbound readable by all, inbound writable and not listable, feedback
# enterable and not listable.
EXCHANGE_MODES = {"": 0o755, "outbound": 0o755, "inbound": 0o2733, "feedback": 0o711}


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
