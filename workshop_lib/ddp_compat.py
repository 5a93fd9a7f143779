"""DistributedDataParallel's options under the name the installed torch takes.

torch 2.13 renamed DDP's ``broadcast_buffers`` (re-send rank 0's buffers before every
forward) to ``forward_sync_buffers``; torch 2.11 and 2.12 take only the old name, 2.13 and
newer warn that it is deprecated. The course supports both, so every place that wraps a
model asks here for the keyword, chosen from the installed signature.

One difference stays: ``broadcast_buffers=False`` also skips the one send of rank 0's
buffers at construction, which ``forward_sync_buffers=False`` still does. The course
builds every rank's model from the same seed (or loads the same checkpoint on every rank),
so the buffers already agree there.
"""
import functools
import inspect

from torch.nn.parallel import DistributedDataParallel


@functools.cache
def ddp_keywords():
    """The keyword arguments the installed DistributedDataParallel takes."""
    return frozenset(inspect.signature(DistributedDataParallel.__init__).parameters)


def buffer_sync(on):
    """``{keyword: on}``: DDP re-sends rank 0's buffers before every forward, or not."""
    name = "forward_sync_buffers" if "forward_sync_buffers" in ddp_keywords() \
        else "broadcast_buffers"
    return {name: on}


def options(**chosen):
    """DDP keyword arguments with ``forward_sync_buffers`` under this torch's name."""
    if "forward_sync_buffers" in chosen:
        chosen.update(buffer_sync(chosen.pop("forward_sync_buffers")))
    return chosen
