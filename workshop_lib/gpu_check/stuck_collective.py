"""A collective that cannot finish in time, for the smoke check: each NCCL rank queues an
all-reduce behind a GPU kernel that runs longer than the process group's timeout (a rank
busy on its GPU, as a peer that never arrives keeps a collective waiting). With the
settings the course's launches make (``launch.NCCL_FAIL_FAST_ENV``), NCCL's watchdog, not
Python, ends the rank: within the timeout and about 25 s, its log naming the collective.

    torchrun --standalone --nproc-per-node=1 -m workshop_lib.gpu_check.stuck_collective \\
        --timeout-s 5 --kernel-s 90
"""
import os
import sys

import torch
import torch.distributed as dist

from workshop_lib import cli, distributed


def cycles_per_second(device):
    """How many cycles of ``torch.cuda._sleep`` the GPU spins through in a second, timed
    with CUDA events on a short sleep."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10**8
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize(device)
    return cycles / (start.elapsed_time(end) / 1000)


def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.gpu_check.stuck_collective")
    parser.add_argument("--timeout-s", type=float, default=5.0,
                        help="the process group's collective timeout")
    parser.add_argument("--kernel-s", type=float, default=90.0,
                        help="how long the GPU kernel ahead of the all-reduce runs")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or "LOCAL_RANK" not in os.environ:
        print("error: this runs under torchrun on a GPU: torchrun --standalone "
              "--nproc-per-node=1 -m workshop_lib.gpu_check.stuck_collective", file=sys.stderr)
        return 2
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    with distributed.process_group("nccl", timeout_s=args.timeout_s, device=device):
        x = torch.ones(1024, device=device)
        dist.all_reduce(x)
        torch.cuda.synchronize(device)  # the group works: what follows is the timeout alone
        torch.cuda._sleep(int(args.kernel_s * cycles_per_second(device)))
        dist.all_reduce(x)  # queued behind the kernel: it cannot finish within the timeout
        print(f"[rank {dist.get_rank()}] all-reduce queued behind a {args.kernel_s:.0f} s "
              f"kernel, timeout {args.timeout_s:.0f} s", flush=True)
        torch.cuda.synchronize(device)
        print("not stopped: the all-reduce finished after the kernel", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
