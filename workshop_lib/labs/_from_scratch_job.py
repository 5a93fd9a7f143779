"""The job behind notebook 02's ``from_scratch`` check: the learner's ``NaiveDataParallel``
trained against DDP (``naive_ddp.compare_with_ddp``), watching what the learner's own code
does while it wraps the model and while it syncs the gradients: which ``torch.distributed``
collectives it calls, and whether it builds a ``DistributedDataParallel``. A class that
wraps torch's DDP trains exactly as DDP does; the count shows it did not do the work.

    torchrun --standalone --nproc-per-node=2 -m workshop_lib.labs._from_scratch_job \
        --wrapper my_naive_ddp.py --out result.json
"""
import argparse
import contextlib
import functools
import json
import os
from collections import Counter
from pathlib import Path

import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.nn.parallel import DistributedDataParallel

from workshop_lib import cli, distributed, naive_ddp
from workshop_lib.errors import CourseError, exit_cleanly_on_course_error, record_errors

# The collectives a wrapper could write DDP's communication with, by their public names.
COLLECTIVES = ("broadcast", "all_reduce", "all_reduce_coalesced", "reduce", "all_gather",
               "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "all_to_all", "all_to_all_single", "scatter", "gather", "send", "recv",
               "isend", "irecv", "broadcast_object_list", "all_gather_object")


class Watch:
    """Counts the collectives called, and the DDP wrappers built, during a phase."""

    def __init__(self):
        self.phase = None
        self.calls = {"wrap": Counter(), "sync": Counter()}
        self.ddp_built = {"wrap": 0, "sync": 0}

    @contextlib.contextmanager
    def during(self, phase):
        self.phase = phase
        try:
            yield
        finally:
            self.phase = None

    def install(self):
        """Route every collective of both namespaces, and DDP's constructor, through the
        counters. Before the learner's file is imported, so that names it imports directly
        (``from torch.distributed import broadcast``) are the counted ones too."""
        for name in COLLECTIVES:
            original = getattr(distributed_c10d, name, None)
            if original is None:
                continue
            counted = self._counted(name, original)
            for namespace in (dist, distributed_c10d):
                setattr(namespace, name, counted)
        build = DistributedDataParallel.__init__

        @functools.wraps(build)
        def counted_build(ddp, *args, **kwargs):
            if self.phase is not None:
                self.ddp_built[self.phase] += 1
            return build(ddp, *args, **kwargs)

        DistributedDataParallel.__init__ = counted_build

    def _counted(self, name, original):
        @functools.wraps(original)
        def counted(*args, **kwargs):
            if self.phase is not None:
                self.calls[self.phase][name] += 1
            return original(*args, **kwargs)
        return counted

    def wrapper(self, learners_class):
        """``learners_class`` as compare_with_ddp uses it, each phase watched."""
        def wrap(module):
            with self.during("wrap"):
                model = learners_class(module)
            sync = model.sync_gradients

            def watched_sync():
                with self.during("sync"):
                    return sync()
            model.sync_gradients = watched_sync
            return model
        return wrap


@record_errors
@exit_cleanly_on_course_error
def main(argv=None):
    parser = cli.ArgumentParser(prog="torchrun ... -m workshop_lib.labs._from_scratch_job",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wrapper", type=Path, required=True,
                        help="the file defining the learner's NaiveDataParallel")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True, help="the result, as JSON")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        raise CourseError("this job runs under torchrun (the from_scratch check starts it)")
    if not args.wrapper.is_file():
        raise CourseError(f"--wrapper {args.wrapper}: no such file")
    watch = Watch()
    watch.install()
    learners_class = naive_ddp.load_wrapper(args.wrapper)
    with distributed.process_group("gloo"):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        difference = naive_ddp.compare_with_ddp(rank, world_size, args.steps,
                                                wrapper=watch.wrapper(learners_class))
        if rank == 0:
            args.out.write_text(json.dumps({
                "steps": args.steps, "world_size": world_size,
                "max_abs_difference": difference,
                "collectives": {phase: dict(calls) for phase, calls in watch.calls.items()},
                "ddp_built": watch.ddp_built}))


if __name__ == "__main__":
    main()
