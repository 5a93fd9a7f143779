"""Each learner's share of the server, enforced by the kernel's control groups: memory and
CPU for everything the learner runs together (not per process, as rlimits are), their
processes, and under the local spawner the GPUs that are not theirs.

The hub (jupyterhub_config.py) makes a group per learner before it starts their server, and
the server's process joins it before it becomes the learner: every kernel, terminal and
launch under it stays inside, and a learner cannot leave (the groups are root's). The
groups are ``ddp-workshop/LEARNER`` in the hierarchy the host offers: cgroup v2
(``memory.max``, ``cpu.max``, ``pids.max``; under the root, where v2 lets controllers be
handed down) or v1 (``memory``, ``cpu``, ``pids`` and ``devices`` controllers; under the
hub's own group, ``/proc/self/cgroup``). GPUs need v1's ``devices`` controller (v2 filters devices
with eBPF programs, which the kit does not load): elsewhere ``CUDA_VISIBLE_DEVICES`` is
advice only, and ``unenforced`` says so, as it says for every limit the host cannot hold.
Disk space is disks.py's.
"""
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
NVIDIA_MAJOR = 195  # /dev/nvidiaN is character device 195:N (nvidiactl is 195:255)
CPU_PERIOD_US = 100_000
GROUP = "ddp-workshop"


def _own_group(controller):
    """The hub's own group path in ``controller``'s v1 hierarchy ("" for v2's)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    return None


class Cgroups:
    """The class's groups on this host: ``version`` 2, 1 or None (none can be made)."""

    def __init__(self, limits, root=ROOT):
        self.limits, self.root = limits, root
        self.version = self._detect()

    def _detect(self):
        if (self.root / "cgroup.controllers").exists():
            wanted = {"memory", "cpu", "pids"}
            offered = set((self.root / "cgroup.controllers").read_text().split())
            return 2 if wanted <= offered else None
        if all((self.root / c).is_dir() for c in ("memory", "cpu", "pids")):
            return 1
        return None

    def folders(self, learner):
        """``{controller: the learner's group folder}``."""
        if self.version == 2:
            # Under the root: v2 lets no group with processes of its own (the hub's) hand
            # controllers down to groups below it.
            return {"unified": self.root / GROUP / learner}
        found = {}
        for controller in ("memory", "cpu", "pids", "devices"):
            own = _own_group(controller)
            if own is not None and (self.root / controller).is_dir():
                found[controller] = self.root / controller / own / GROUP / learner
        return found

    def make(self, learner, gpu_ids=(), visible=()):
        """The learner's groups with their limits; the files a process writes its pid (0:
        itself) into to join them."""
        memory, cpus = self.limits.get("memory_bytes"), self.limits.get("cpus")
        tasks = self.limits.get("nproc")
        folders = self.folders(learner)
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        if self.version == 2:
            group = folders["unified"]
            for above in (self.root, group.parent):
                (above / "cgroup.subtree_control").write_text("+memory +cpu +pids")
            if memory:
                (group / "memory.max").write_text(str(memory))
                (group / "memory.swap.max").write_text("0")
            if cpus:
                (group / "cpu.max").write_text(f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
            if tasks:
                (group / "pids.max").write_text(str(tasks))
            return [group / "cgroup.procs"]
        if memory:
            (folders["memory"] / "memory.limit_in_bytes").write_text(str(memory))
            swap = folders["memory"] / "memory.memsw.limit_in_bytes"
            if swap.exists():  # memory and swap together: no way round the limit by swapping
                swap.write_text(str(memory))
        if cpus:
            (folders["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (folders["cpu"] / "cpu.cfs_quota_us").write_text(str(int(cpus * CPU_PERIOD_US)))
        if tasks:
            (folders["pids"] / "pids.max").write_text(str(tasks))
        if "devices" in folders:
            for gpu in gpu_ids:
                if str(gpu) not in visible:
                    (folders["devices"] / "devices.deny").write_text(
                        f"c {NVIDIA_MAJOR}:{int(gpu)} rwm")
        return [folder / "cgroup.procs" for folder in folders.values()]

    def unenforced(self, gpus_shared):
        """One line per limit this host cannot enforce for the learners (none: [])."""
        lines = []
        if self.version is None:
            lines.append("memory, CPU and processes per learner: no cgroup hierarchy with "
                         "the memory, cpu and pids controllers here (each process keeps its "
                         "rlimits)")
        if gpus_shared and (self.version != 1 or not self.folders("probe").get("devices")):
            lines.append("GPUs: no cgroup v1 devices controller here, so "
                         "CUDA_VISIBLE_DEVICES is advice (a learner can use every GPU)")
        return lines


def remove_groups(limits, root=ROOT):
    """Remove the class's groups (after its accounts' processes ended): the names of those
    that could not be removed."""
    groups = Cgroups(limits, root)
    left = []
    if groups.version is None:
        return left
    for folder in groups.folders("any").values():
        top = folder.parent
        if not top.is_dir():
            continue
        for group in [*sorted(p for p in top.iterdir() if p.is_dir()), top]:
            try:
                group.rmdir()
            except OSError:
                left.append(str(group))
    return left


def join(procs_files):
    """Move this process into the groups (run in the child, before it becomes the
    learner: the groups' files are root's)."""
    for path in procs_files:
        Path(path).write_text("0")
