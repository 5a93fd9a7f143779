"""Timing a piece of work honestly, the one way every timer of the course does it.

GPU work is queued: a clock read right after a step measures the queueing, not the step.
So: synchronise (the queue is empty), read the clock, do the work, synchronise again (it
finished), read the clock. The bench, the trace, notebook 07's timings and the all-reduce
sweep all time through ``Stopwatch``, and all summarise repeated timings with ``summary``
(median and the spread, never one lucky number).
"""
import statistics
import time

from workshop_lib import hardware


class Stopwatch:
    """``with Stopwatch(device) as watch: work()`` then ``watch.seconds``; with several
    devices (``nn.DataParallel``'s), every one of them is synchronised."""

    def __init__(self, *devices):
        self.devices = devices or ("cpu",)
        self.seconds = None

    def _synchronize(self):
        for device in self.devices:
            hardware.synchronize(device)

    def __enter__(self):
        self._synchronize()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self._synchronize()
        self.seconds = time.perf_counter() - self._start
        return False


def summary(values):
    """Median, min, max and n of a list of numbers."""
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "n": len(ordered)}
