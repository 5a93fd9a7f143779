"""A DDP job that trains the course's CNN on digits. After every epoch rank 0 alone
evaluates the model on the whole validation set and saves a checkpoint, while the other
ranks wait for it. It has a bug: run it, find it, fix it (notebook 04).

    torchrun --standalone --nproc-per-node=2 debug_eval_job.py --out runs/debug_eval
"""
import argparse
import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from workshop_lib import data, models


@torch.no_grad()
def evaluate(model, loader):
    """[correct predictions, samples] over the whole validation set."""
    model.eval()
    device = next(model.parameters()).device  # every tensor below is made there
    sums = torch.zeros(2, device=device)
    for x, y in loader:
        logits = model(x)
        sums += torch.stack([(logits.argmax(dim=1) == y).sum(),
                             torch.tensor(len(y), device=device)])
    return sums


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/debug_eval"))
    parser.add_argument("--dist-timeout", type=float, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.dist_timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    train_set, val_set, info = data.load("digits")
    torch.manual_seed(0)
    model = DDP(models.build("cnn", info))
    sampler = DistributedSampler(train_set, world_size, rank, seed=0)
    train_loader = data.TensorLoader(train_set, 32, sampler, "cpu")
    val_loader = data.TensorLoader(val_set, 512, SequentialSampler(val_set), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:  # rank 0 alone evaluates and saves; the others wait below
            sums = evaluate(model, val_loader)
            print(f"epoch {epoch}: val_acc {sums[0] / sums[1]:.4f} over {int(sums[1])} "
                  f"validation samples", flush=True)
            torch.save(model.module.state_dict(), args.out / "checkpoint.pt")
        dist.barrier()  # every rank waits for rank 0's checkpoint before going on

    if rank == 0:
        result = {"val_acc": (sums[0] / sums[1]).item(), "val_samples": int(sums[1])}
        (args.out / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
