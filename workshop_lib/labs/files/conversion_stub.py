"""Train a small CNN on the course's digits, on one device. Make it a DDP job.

    python my_train_ddp.py --epochs 3                                  (as it is)
    torchrun --standalone --nproc-per-node=2 my_train_ddp.py --epochs 3 (when you are done)

Keep: load_data() for the data; the flags --epochs, --batch-size (per process), --lr, --seed
and --out; and, in --out, log.jsonl (one JSON record per epoch with val_loss and val_acc)
and checkpoint.pt (a dict with the model's state_dict under "model").
"""
import argparse
import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

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
    def __init__(self, model, train_loader, val_loader, optimizer, device, out):
        self.model, self.optimizer, self.device, self.out = model, optimizer, device, out
        self.train_loader, self.val_loader = train_loader, val_loader

    def run_epoch(self):
        self.model.train()
        for x, y in self.train_loader:
            x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()

    @torch.no_grad()
    def evaluate(self):
        """[sum of losses, correct predictions, samples] over the validation loader."""
        self.model.eval()
        sums = torch.zeros(3, device=self.device)
        for x, y in self.val_loader:
            x, y = x.to(self.device), y.to(self.device)
            logits = self.model(x)
            sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"),
                                 (logits.argmax(1) == y).sum(),
                                 torch.tensor(len(y), device=self.device)])
        return sums

    def save(self, epoch, sums):
        record = {"epoch": epoch, "val_loss": (sums[0] / sums[2]).item(),
                  "val_acc": (sums[1] / sums[2]).item()}
        print(f"epoch {epoch}: val_loss {record['val_loss']:.4f} "
              f"val_acc {record['val_acc']:.4f}", flush=True)
        with open(self.out / "log.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")
        torch.save({"epoch": epoch, "model": self.model.state_dict()},
                   self.out / "checkpoint.pt")

    def train(self, epochs):
        for epoch in range(1, epochs + 1):
            self.run_epoch()
            self.save(epoch, self.evaluate())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/my_train_ddp"))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    torch.manual_seed(args.seed)
    train_set, val_set = load_data()
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
    val_loader = DataLoader(val_set, batch_size=256)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "log.jsonl").write_text("")
    Trainer(model, train_loader, val_loader, optimizer, device, args.out).train(args.epochs)


if __name__ == "__main__":
    main()
