"""The end of each epoch of debug_job.py after its evaluation, without the model or the
data: the collectives that follow it, in the same order, on each rank. Notebook 04 runs it with
TORCH_DISTRIBUTED_DEBUG=DETAIL, which checks before every collective that all ranks call
the same one.

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node=2 debug_mismatch.py
"""
import argparse
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist-timeout", type=float, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.dist_timeout))
    rank = dist.get_rank()

    sums = torch.tensor([0.5, 90.0, 100.0])  # this rank's [loss sum, correct, samples]
    if rank == 0:
        dist.all_reduce(sums)
        print(f"val_acc {sums[1] / sums[2]:.4f}", flush=True)
    dist.barrier()  # every rank waits for rank 0's checkpoint before going on
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
