"""Train a small CNN on the course's digits, data-parallel with DDP (notebook 02's answer).

    torchrun --standalone --nproc-per-node=2 my_train_ddp.py --epochs 3

Keep: load_data() for the data; the flags --epochs, --batch-size (per process), --lr, --seed
and --out; and, in --out, log.jsonl (one JSON record per epoch with val_loss and val_acc)
and checkpoint.pt (a dict with the model's state_dict under "model").
"""
import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from workshop_lib.labs.conversion_data import load_data


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


class Trainer:
    def __init__(self, model, train_loader, val_loader, optimizer, device, out, rank):
        self.model, self.optimizer, self.device, self.out = model, optimizer, device, out
        self.train_loader, self.val_loader, self.rank = train_loader, val_loader, rank

    def run_epoch(self, epoch):
        self.train_loader.sampler.set_epoch(epoch)  # a new shuffle, and shard, each epoch
        self.model.train()
        for x, y in self.train_loader:
            x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(x), y).backward()  # DDP averages the gradients here
            self.optimizer.step()

    @torch.no_grad()
    def evaluate(self):
        """[sum of losses, correct predictions, samples] over ALL ranks' validation shards."""
        self.model.eval()
        sums = torch.zeros(3, device=self.device)
        for x, y in self.val_loader:
            x, y = x.to(self.device), y.to(self.device)
            logits = self.model(x)
            sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"),
                                 (logits.argmax(1) == y).sum(),
                                 torch.tensor(len(y), device=self.device)])
        dist.all_reduce(sums)  # every rank takes part; every rank gets the global sums
        return sums

    def save(self, epoch, sums):
        if self.rank != 0:  # one process prints and writes
            return
        record = {"epoch": epoch, "val_loss": (sums[0] / sums[2]).item(),
                  "val_acc": (sums[1] / sums[2]).item()}
        print(f"epoch {epoch}: val_loss {record['val_loss']:.4f} "
              f"val_acc {record['val_acc']:.4f}", flush=True)
        with open(self.out / "log.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")
        torch.save({"epoch": epoch, "model": self.model.module.state_dict()},
                   self.out / "checkpoint.pt")

    def train(self, epochs):
        for epoch in range(1, epochs + 1):
            self.run_epoch(epoch)
            self.save(epoch, self.evaluate())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/my_train_ddp"))
    args = parser.parse_args()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")

    torch.manual_seed(args.seed)
    train_set, val_set = load_data()
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_shard = Subset(val_set, range(rank, len(val_set), world_size))  # no padding
    val_loader = DataLoader(val_shard, batch_size=256)
    model = Net().to(device)
    model = DDP(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "log.jsonl").write_text("")
    Trainer(model, train_loader, val_loader, optimizer, device, args.out, rank).train(args.epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
