"""Each learner's home on a filesystem of its own, so that one learner filling their home
fills only theirs: not the other homes, the exchange or the hub's database, which share
the class folder's filesystem.

A home is a sparse ext4 image, ``DIR/disks/NAME.img`` (it takes on the host only what the
learner wrote), loop-mounted on ``DIR/homes/NAME`` with ``nosuid,nodev``; its size is
``init --home-size``. ``accounts add`` makes and mounts it, ``serve`` mounts again what a
restart of the machine unmounted, ``down`` unmounts it before the account goes. Where the
host cannot loop-mount (no loop devices, no mount rights in a container) the homes stay
plain folders and ``serve`` says so (``problem``).

The exchange, where every learner submits, is one filesystem of its own too,
``DIR/disks/exchange.img`` on ``DIR/exchange`` (``init --exchange-size``): a learner who
fills it fills neither the homes nor the hub's database. Within it each learner has a quota
(``init --exchange-quota``, set with ``setquota`` from Debian's ``quota``) where the kernel
keeps ext4 quotas (``CONFIG_QUOTA`` and ``CONFIG_QFMT_V2``); ``exchange_problem`` names
what is missing where it does not, and ``serve`` says so.
"""
import os
import shutil
import subprocess
from pathlib import Path

MOUNT_OPTIONS = "loop,nosuid,nodev"


def problem():
    """Why homes cannot have filesystems of their own here (one line), or None."""
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount", "losetup")
               if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (apt-get install e2fsprogs mount)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices here (/dev/loop-control)"
    return None


def image(state, name):
    return Path(state) / "disks" / f"{name}.img"


def mounted(folder):
    return os.path.ismount(folder)


def _run(*command):
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines() or ["(no output)"]
        raise OSError(f"{' '.join(map(str, command))}: {said[-1]}")


def make(state, name, home, size_bytes):
    """The learner's image (made once) mounted on their home, which it then owns, 0700."""
    path = image(state, name)
    if not path.exists():
        path.parent.mkdir(mode=0o700, exist_ok=True)
        with open(path, "wb") as disk:
            disk.truncate(size_bytes)
        path.chmod(0o600)
        # No blocks kept for root: the learner gets the whole size.
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "root_owner=0:0", path)
    mount(state, name, home)


def mount(state, name, home):
    if mounted(home) or not image(state, name).exists():
        return False
    _run("mount", "-o", MOUNT_OPTIONS, image(state, name), home)
    shutil.chown(home, name, name)
    Path(home).chmod(0o700)
    lost = Path(home) / "lost+found"
    if lost.is_dir():
        lost.rmdir()
    return True


EXCHANGE = "exchange"  # the image's name: no learner account has it (a prefix and digits)
QUOTA_FILES = 4000    # files (inodes) of each learner in the exchange


def make_exchange(state, folder, size_bytes):
    """The exchange's image (made once: with ext4's quota feature where this kernel mounts
    it) mounted on ``folder``."""
    path = image(state, EXCHANGE)
    if not path.exists() and not mounted(folder) and any(Path(folder).iterdir()):
        raise OSError(f"{folder} already holds files, which the new filesystem would hide")
    if not path.exists():
        path.parent.mkdir(mode=0o700, exist_ok=True)
        with open(path, "wb") as disk:
            disk.truncate(size_bytes)
        path.chmod(0o600)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "quota", "-E", "quotatype=usrquota",
             path)
        try:
            mount_exchange(state, folder)
        except OSError:  # no ext4 quotas in this kernel: the same filesystem without them
            _run("mkfs.ext4", "-q", "-F", "-m", "0", path)
    mount_exchange(state, folder)


def _has_quota(path):
    features = subprocess.run(["dumpe2fs", "-h", str(path)], capture_output=True,
                              text=True).stdout
    return any(line.startswith("Filesystem features:") and " quota" in line
               for line in features.splitlines())


def mount_exchange(state, folder):
    path = image(state, EXCHANGE)
    if mounted(folder) or not path.exists():
        return False
    quota = ",usrquota" if _has_quota(path) else ""
    _run("mount", "-o", MOUNT_OPTIONS + quota, path, folder)
    lost = Path(folder) / "lost+found"
    if lost.is_dir():
        lost.rmdir()
    return True


def quotas_on(folder):
    """Whether the filesystem mounted on ``folder`` enforces user quotas."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] == str(folder):
            return "usrquota" in fields[3].split(",")
    return False


def exchange_problem(folder):
    """Why learners have no quota of their own in the exchange (one line), or None."""
    if not mounted(folder):
        return "the exchange is not a filesystem of its own (init --exchange-size 0)"
    if not quotas_on(folder):
        return "this kernel keeps no ext4 quotas (CONFIG_QUOTA, CONFIG_QFMT_V2)"
    if shutil.which("setquota") is None:
        return "setquota not found (apt-get install quota)"
    return None


def limit_in_exchange(folder, name, size_bytes):
    """The learner's quota in the exchange: ``size_bytes`` and QUOTA_FILES files."""
    blocks = str(size_bytes // 1024)  # setquota counts 1 KiB blocks
    _run("setquota", "-u", name, blocks, blocks, QUOTA_FILES, QUOTA_FILES, folder)


def unmount_exchange(state, folder):
    if mounted(folder):
        _run("umount", folder)


def unmount(state, name, home):
    """Unmount the learner's home and remove their image."""
    if mounted(home):
        _run("umount", home)
    image(state, name).unlink(missing_ok=True)
