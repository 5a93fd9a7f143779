"""The bench's processes: spawn N, join them in one group, measure, leave, then rank 0 alone.

Each worker joins the process group, takes its part in the collective measurements
(``measure.collective``) and leaves the group; a worker whose measurement raises ends at
once instead, tearing nothing down (``distributed.process_group``), so that with NCCL the
error ends the job rather than a teardown waiting for ranks stuck in a collective; the
bench's process then stops the others and raises the worker's error
(``distributed.spawn``). Then the other ranks exit, and rank 0 measures what one process
measures alone (``solo.alone``) and writes the raw results.
"""
import json
import os
import tempfile
from pathlib import Path

import torch

from workshop_lib import data, distributed, hardware
from workshop_lib.bench import measure, solo


def worker(rank, plan, port, result_path):
    """One spawned process, rank ``rank`` of ``plan.world_size``."""
    if plan.device_type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # one thread per rank: ranks never fight over a core
    train_set, _, info = data.load(plan.dataset, plan.data_dir)
    with distributed.process_group(hardware.backend_for(device), timeout_s=plan.timeout_s,
                                   device=device, init_method=f"tcp://127.0.0.1:{port}",
                                   rank=rank, world_size=plan.world_size):
        results = measure.collective(rank, plan, device, train_set, info)
    if rank == 0:
        results.update(solo.alone(plan, device, train_set, info))
        Path(result_path).write_text(json.dumps(results))


def launch(plan):
    """Run the measurements in ``plan.world_size`` fresh processes; rank 0's raw results.

    Spawned, not forked: a fork of a process whose OpenMP pool is running can deadlock.
    """
    if plan.device_type == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"  # the workers' OpenMP pools start with one thread
    with tempfile.TemporaryDirectory() as folder:
        result_path = Path(folder) / "raw.json"
        # A worker's CourseError (say, a batch larger than a rank's share of the data) is
        # raised here as a CourseError: one line, as everywhere in the course.
        distributed.spawn(worker, plan.world_size, plan, distributed.free_port(),
                          str(result_path))
        return json.loads(result_path.read_text())
