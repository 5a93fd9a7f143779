"""The sandbox every learner script runs in while it is graded, made by bubblewrap (bwrap).

``ddp_checks`` launches each job through ``Job.popen``. Inside, the job sees:

- its scratch folder (mode 0700, read-write), at the same path as outside so that the
  paths it records mean the same to the checks: its copy of the script, ddp_recorder.py
  and its rooms (ddp_recorder_*.py), digits_data.py, the settings file and its evidence/
  and out/ folders. Nothing else of the course: not source/ (the hidden tests), not
  gradebook.db, not submitted/ or another learner's folder, not the grader's home;
- read-only, what Python and torch need: /usr, /bin, /lib*, the Python installation
  (sys.base_prefix), the environment (sys.prefix) and its site-packages, and a minimal
  /etc (the loader's cache, and its own hosts, passwd and group files);
- a /tmp, /dev and /proc of its own; on GPUs also the NVIDIA device files and /sys (for
  NVML and NCCL's topology);
- namespaces of its own: processes (every process the job started dies with it, whatever
  session it made), network (loopback only: enough for torchrun --standalone and gloo
  on one machine), host name, IPC;
- an environment made from an allowlist (no JUPYTERHUB_* token, no instructor path), and
  its settings in a file of its scratch folder, not on any command line (``ps`` shows
  command lines to every account).

When the grader is root, the job also runs as a throw-away unprivileged uid, drawn per
launch, that owns its scratch folder (``setpriv`` drops every capability). Any other
grader (the class server's grader account, an instructor's workstation) gets an
unprivileged sandbox: a user namespace, which the kernel must allow.

Where no sandbox can be made, ``sandboxed()`` refuses while nbgrader grades
(NBGRADER_EXECUTION=autograde) in one line saying what is missing, unless the instructor
set DDP_CHECKS_UNSANDBOXED=1; elsewhere (a learner's own notebook, their own code and
account) the job runs without one.

Standard library only: the notebook's kernel imports this file.
"""
import functools
import grp
import os
import pwd
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

UNSANDBOXED_ENV = "DDP_CHECKS_UNSANDBOXED"  # "1": the instructor grades without a sandbox
HOSTNAME = "ddp-sandbox"
# Throw-away uids are drawn here: above the ranges that useradd and subuid maps hand out.
UID_RANGE = (1_500_000_000, 2_000_000_000)
# The environment a job gets: these names and prefixes, if set, and nothing else.
KEPT_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES",
            "DDP_RECORDER_DATA_MODULE", "LD_LIBRARY_PATH")
KEPT_PREFIXES = ("OMP_", "MKL_", "NCCL_")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/nsswitch.conf", "/etc/localtime")
GPU_PATHS = ("/sys", "/run/nvidia-persistenced")
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")  # the driver's, found where they are
# What one graded job may use: enough that no correct script comes near it (the assessment's
# README says, limit by limit, what a correct job uses), little enough that thirty jobs
# graded one after another cannot exhaust the server. Set with prlimit inside the sandbox,
# soft and hard: the job cannot raise them again.
TASKS_BASE, TASKS_PER_RANK = 128, 64  # its processes and threads, together (RLIMIT_NPROC)
FILE_BYTES = 256 * 2**20  # the largest file it writes (RLIMIT_FSIZE)
DATA_BYTES = 8 * 2**30  # each process's data (RLIMIT_DATA: CUDA reserves address space,
#                         not data, so RLIMIT_AS would refuse a correct GPU job)
CPU_SECONDS_PER_LIMIT_SECOND = 4  # each process's CPU time, per second of the time limit
TMP_BYTES = 512 * 2**20  # its own /tmp (memory: a tmpfs)
# Its own /dev/shm: NCCL keeps buffers there for GPUs that talk through host memory.
SHM_BASE, SHM_PER_RANK = 256 * 2**20, 128 * 2**20


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made while grading: shown as its message alone, no traceback."""

    def _render_traceback_(self):
        return [f"\x1b[0;31mGrading refused\x1b[0m: {self}"]


def grading():
    return os.environ.get("NBGRADER_EXECUTION") == "autograde"


def problem():
    """Why no sandbox can be made here (what is missing and what to do), or None."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return ("bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: "
                "apt-get install bubblewrap)")
    if (os.geteuid() == 0 and shutil.which("setpriv") is None) or not shutil.which("prlimit"):
        return "setpriv or prlimit is not installed: install util-linux"
    return _probe(bwrap, os.geteuid())


@functools.lru_cache
def _probe(bwrap, uid):
    try:
        probe = subprocess.run([bwrap, *_namespaces(uid), "--ro-bind", "/", "/", "true"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap did not run ({error})"
    if probe.returncode == 0:
        return None
    why = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
    if uid == 0:
        return f"bwrap cannot make a sandbox here ({why}): grade on a host or in a " \
               f"container that allows mount and PID namespaces"
    return (f"bwrap cannot make a sandbox here ({why}): enable unprivileged user "
            f"namespaces (sysctl user.max_user_namespaces=15000, and "
            f"kernel.unprivileged_userns_clone=1 or "
            f"kernel.apparmor_restrict_unprivileged_userns=0 where the kernel has them)")


def sandboxed():
    """Whether to launch jobs in the sandbox. Raises ``SandboxUnavailable`` while grading
    where none can be made and the instructor did not ask to grade without one."""
    if os.environ.get(UNSANDBOXED_ENV) == "1":
        return False
    reason = problem()
    if reason is None:
        return True
    if grading():
        raise SandboxUnavailable(
            f"no sandbox for the learners' scripts: {reason}. To grade without one (each "
            f"script then runs with your rights), set {UNSANDBOXED_ENV}=1 "
            f"(make autograde UNSANDBOXED=1).")
    return False


def _namespaces(uid):
    if uid == 0:  # privileged bwrap; setpriv makes the job an unprivileged uid
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try"]
    return ["--unshare-all", "--unshare-user"]


def _in_use_uids():
    uids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uids.add(entry.stat().st_uid)
            except OSError:
                pass
    return uids


def unused_uid():
    """A uid (and gid) no account, group or running process has."""
    in_use = _in_use_uids()
    draw = random.SystemRandom()
    while True:
        uid = draw.randrange(*UID_RANGE)
        if uid in in_use:
            continue
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
        except KeyError:
            return uid


def job_environment(source, scratch, path_dirs):
    """The job's whole environment: the allowlist's values from ``source``, and its own
    PATH, HOME and TMPDIR (/tmp, read-only where it holds the scratch folder: /dev/shm)."""
    env = {name: value for name, value in source.items()
           if name in KEPT_ENV or name.startswith(KEPT_PREFIXES)}
    env.update(PATH=os.pathsep.join([*path_dirs, "/usr/bin", "/bin"]), HOME=str(scratch),
               TMPDIR="/dev/shm" if Path(scratch).is_relative_to("/tmp") else "/tmp",
               PYTHONUNBUFFERED="1")
    return env


def _data_package():
    """The folder of the package whose module DDP_RECORDER_DATA_MODULE names (the
    workshop's own exercise: its script imports it too), to be readable in the sandbox;
    for digits_data, the course's library (workshop_lib), which a learner's script may
    use too (checkpoint.save_atomic), or None where it is not installed."""
    name = os.environ.get("DDP_RECORDER_DATA_MODULE", "digits_data").partition(".")[0]
    if name == "digits_data":
        name = "workshop_lib"
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


class Job:
    """One launch in the sandbox: ``scratch`` (made by the caller, holding everything the
    job needs) is handed to the job, ``popen`` starts it, ``finish`` takes the folder back."""

    def __init__(self, scratch, on_gpu, nproc=2, time_limit_s=300):
        self.scratch = Path(scratch).resolve()
        self.on_gpu = on_gpu
        self.nproc, self.time_limit_s = nproc, time_limit_s
        self.grader_uid, self.grader_gid = os.geteuid(), os.getegid()
        self.uid = unused_uid() if self.grader_uid == 0 else None
        if self.uid is not None:
            _chown_tree(self.scratch, self.uid, self.uid)
        os.chmod(self.scratch, 0o700)

    def _binds(self):
        args = []
        for folder in SYSTEM_DIRS:
            path = Path(folder)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), folder]
            elif path.is_dir():
                args += ["--ro-bind", folder, folder]
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--perms", "1777", "--size", str(self.shm_bytes()), "--tmpfs", "/dev/shm",
                 "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--dir", "/etc"]
        made = {Path(p) for p in ("/", "/proc", "/dev", "/dev/shm", "/tmp", "/etc")}
        for file in SYSTEM_FILES:
            if Path(file).exists():
                args += ["--ro-bind", file, file]
        python = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
                  *(Path(p).resolve() for p in _site_packages())}
        data_package = _data_package()
        if data_package is not None:
            python.add(data_package)
        bound = [Path(p) for p in SYSTEM_DIRS]
        for folder in sorted(python):  # a folder before those inside it
            if folder.is_dir() and not any(folder.is_relative_to(p) for p in bound):
                args += [*_parents(folder, made), "--ro-bind", str(folder), str(folder)]
                bound.append(folder)
        if self.on_gpu:
            for device in sorted(Path("/dev").glob("nvidia*")):
                args += ["--dev-bind", str(device), str(device)]
            for path in GPU_PATHS:
                args += ["--ro-bind-try", path, path]
            for folder in driver_folders():  # libcuda where the image keeps it
                if not any(folder.is_relative_to(p) for p in bound):
                    args += [*_parents(folder, made), "--ro-bind", str(folder), str(folder)]
                    bound.append(folder)
        args += [*_parents(self.scratch, made), "--bind", str(self.scratch), str(self.scratch)]
        if self.scratch.is_relative_to("/tmp"):
            # Its parent folders are in the job's /tmp, where it could otherwise write
            # files at the course's paths (they would vanish with it, but fool a reader).
            args += ["--remount-ro", "/tmp"]
        return args

    def _etc_files(self):
        uid = self.uid if self.uid is not None else self.grader_uid
        return {
            "/etc/hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost\n",
            "/etc/passwd": f"learner:x:{uid}:{uid}:learner:{self.scratch}:/bin/false\n",
            "/etc/group": f"learner:x:{uid}:\n",
        }

    def command(self, argv):
        """bwrap's command line for ``argv``, and the files it reads from pipes."""
        args = [shutil.which("bwrap"), "--die-with-parent", "--new-session",
                *_namespaces(self.grader_uid), "--hostname", HOSTNAME, *self._binds()]
        files = self._etc_files()
        args += [arg for dest in files
                 for arg in ("--perms", "0644", "--ro-bind-data", "{fd}", dest)]
        # The sandbox's own root (the folders made above, /etc) read-only: the scratch
        # folder, /tmp and /dev/shm are the only places the job writes.
        args += ["--remount-ro", "/", "--chdir", str(self.scratch)]
        if self.uid is not None:
            args += [shutil.which("setpriv"), f"--reuid={self.uid}", f"--regid={self.uid}",
                     "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
                     "--no-new-privs", "--"]
        return args + self.limits() + list(argv), files

    def shm_bytes(self):
        return SHM_BASE + SHM_PER_RANK * self.nproc

    def limits(self):
        """prlimit's command that sets the job's limits, soft and hard, then runs it. Tasks
        are counted per uid (the throw-away one) or per uid of the job's own user
        namespace: only the job's own count."""
        limits = {"nproc": TASKS_BASE + TASKS_PER_RANK * self.nproc, "fsize": FILE_BYTES,
                  "data": DATA_BYTES,
                  "cpu": int(CPU_SECONDS_PER_LIMIT_SECOND * self.time_limit_s) + 60}
        return [shutil.which("prlimit") or "/usr/bin/prlimit",
                *(f"--{name}={value}:{value}" for name, value in limits.items()), "--"]

    def popen(self, argv, env, **popen_args):
        """Start ``argv`` in the sandbox with the allowlist's variables of ``env``, in the
        scratch folder (``subprocess.Popen``'s other arguments but env and cwd)."""
        args, files = self.command(argv)
        fds = []
        for content in files.values():
            read, write = os.pipe()
            os.write(write, content.encode())  # a few bytes: the pipe holds them
            os.close(write)
            fds.append(read)
        unused = iter(fds)
        args = [str(next(unused)) if arg == "{fd}" else arg for arg in args]
        # The allowlist's environment, given to bwrap itself: --setenv would show the
        # values on bwrap's command line.
        job_env = job_environment(env, self.scratch, [str(Path(sys.executable).parent)])
        data_package = _data_package()
        if data_package is not None:  # importable from the one folder bound for it
            job_env["PYTHONPATH"] = str(data_package.parent)
        try:
            return subprocess.Popen(args, env=job_env, pass_fds=fds, start_new_session=True,
                                    **popen_args)
        finally:
            for fd in fds:
                os.close(fd)

    def finish(self):
        """Take the scratch folder back once the job is gone: anything in it that is not
        a plain file or folder (a link to the hidden tests, a FIFO the checks would wait
        on) is removed, and the grader owns the rest again."""
        for root, dirs, files in os.walk(self.scratch):
            for name in dirs + files:
                path = os.path.join(root, name)
                mode = os.lstat(path).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    os.unlink(path)
                elif self.uid is not None:
                    os.chown(path, self.grader_uid, self.grader_gid, follow_symlinks=False)
        if self.uid is not None:
            os.chown(self.scratch, self.grader_uid, self.grader_gid, follow_symlinks=False)


def driver_folders():
    """The folders holding the GPU driver's user-space libraries (libcuda, libnvidia-ml):
    those the loader's cache names (``ldconfig -p``) and those on LD_LIBRARY_PATH. Container
    images often keep them outside /usr (/usr/local/nvidia/lib64, say), where a sandbox
    binding only the system's folders would not show them to the job."""
    folders = set()
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                               timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        cache = ""
    for line in cache.splitlines():
        name, _, path = line.partition("=>")
        if name.strip().startswith(DRIVER_LIBRARIES):
            folders.add(Path(path.strip()).resolve().parent)
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if entry and any(Path(entry).glob(f"{prefix}*") for prefix in DRIVER_LIBRARIES):
            folders.add(Path(entry).resolve())
    return sorted(folder for folder in folders if folder.is_dir())


def _parents(path, made):
    """bwrap's arguments that make ``path``'s missing parent folders, 0755: those bwrap
    makes on its own for a mount point are 0700, closed to a throw-away uid."""
    args = []
    for parent in reversed(path.parents):
        if parent not in made:
            args += ["--perms", "0755", "--dir", str(parent)]
            made.add(parent)
    return args


def _site_packages():
    import site

    return [p for p in site.getsitepackages() if Path(p).is_dir()]


def _chown_tree(folder, uid, gid):
    os.chown(folder, uid, gid, follow_symlinks=False)
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


if __name__ == "__main__":
    # `make autograde` asks first, so that a machine without a sandbox grades nobody.
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    try:
        if sandboxed():
            how = "as a throw-away uid" if os.geteuid() == 0 else "in a user namespace"
            print(f"Sandbox: each learner's script runs in bubblewrap, {how}.")
        else:
            print(f"WARNING: {UNSANDBOXED_ENV}=1: learners' scripts run WITHOUT a sandbox, "
                  f"with your rights.")
    except SandboxUnavailable as refusal:
        sys.exit(f"Grading refused: {refusal}")
