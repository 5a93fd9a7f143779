"""The parameters that break a careless data-parallel wrapper, in one small network.

Notebook 07, "Inside DDP", section 4 ("Frozen, unused and tied parameters") trains it with
every wrapper of the package. ``EdgeCaseNet`` has:

- a frozen layer (``requires_grad=False``): no gradient, nothing to send;
- tied weights: ``decode`` uses ``encode``'s weight (one ``Parameter``, used twice in
  forward; its gradient is the sum of both uses, and it must be all-reduced once);
- a branch used only in some steps, on some ranks (``use_branch``): its parameters get no
  gradient where it is skipped, and a wrapper that waits for them hangs.

``uses_branch(step, rank)`` is the schedule the tests and checks follow: every third step
all ranks use the branch, the next only rank 0, the next none.
"""
import torch
from torch import nn


class EdgeCaseNet(nn.Module):
    def __init__(self, in_features=64, hidden=32, num_classes=10):
        super().__init__()
        self.frozen = nn.Linear(in_features, hidden).requires_grad_(False)
        self.encode = nn.Linear(hidden, hidden)
        self.decode = nn.Linear(hidden, hidden)
        self.decode.weight = self.encode.weight  # tied: one Parameter, two uses
        self.branch = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x, use_branch=True):
        h = torch.relu(self.frozen(x.flatten(1)))
        h = torch.relu(self.decode(torch.relu(self.encode(h))))
        if use_branch:
            h = h + torch.relu(self.branch(h))
        return self.head(h)


def uses_branch(step, rank):
    """Whether rank ``rank`` takes the branch at ``step``: all, then rank 0 only, then none."""
    return (True, rank == 0, False)[step % 3]
