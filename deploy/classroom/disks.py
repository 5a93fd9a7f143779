"""Each learner's home on a filesystem of its own, so that one learner filling their home
fills only theirs: not the other homes, the exchange or the hub's database, which share
the class folder's filesystem.

A home is a sparse ext4 image, ``DIR/disks/NAME.img`` (it takes on the host only what the
learner wrote), loop-mounted on ``DIR/homes/NAME`` with ``nosuid,nodev``; its size is
``init --home-size``. ``accounts add`` makes and mounts it, ``serve`` mounts again what a
restart of the machine unmounted, ``down`` unmounts it before the account goes. Where the
host cannot loop-mount (no loop devices, no mount rights in a container) the homes stay
plain folders and ``serve`` says so (``problem``).
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


def unmount(state, name, home):
    """Unmount the learner's home and remove their image."""
    if mounted(home):
        _run("umount", home)
    image(state, name).unlink(missing_ok=True)
