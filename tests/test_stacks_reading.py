"""Reading a rank's own stack dump: the line of the script it waits in and the call it made
there, which notebook 04's picture of a hung job draws (no process is started here: the
dump is faulthandler's text through ``stacks.readable``, as a rank writes it)."""
import matplotlib

from workshop_lib import plots, stacks

matplotlib.use("Agg")

SCRIPT = """import torch.distributed as dist


def main():
    if rank == 0:
        dist.all_reduce(sums)
    dist.barrier()
"""


def dump(script, line, call):
    return stacks.readable(
        "Thread 0x00007f (most recent call first):\n"
        '  File "/usr/lib/python3/threading.py", line 320 in wait\n'
        "\n"
        "Current thread 0x00007e (most recent call first):\n"
        f'  File "/site-packages/torch/distributed/distributed_c10d.py", line 2900 in {call}\n'
        f'  File "/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper\n'
        f'  File "{script}", line {line} in main\n'
        f'  File "{script}", line 9 in <module>\n')


def test_each_rank_waits_where_its_dump_says(tmp_path):
    script = tmp_path / "debug_job.py"
    script.write_text(SCRIPT)
    waiting = {0: stacks.where_waiting(dump(script, 6, "all_reduce"), str(script)),
               1: stacks.where_waiting(dump(script, 7, "barrier"), str(script))}
    assert waiting[0] == {"line": 6, "code": "dist.all_reduce(sums)", "calls": "all_reduce"}
    assert waiting[1] == {"line": 7, "code": "dist.barrier()", "calls": "barrier"}
    assert stacks.where_waiting(dump(script, 6, "all_reduce"), "other.py") is None
    ax = plots.draw_hung_job(waiting, "debug_job.py")
    assert "2 different calls" in ax.get_title()
    assert any("debug_job.py:6: dist.all_reduce(sums)" in t.get_text() for t in ax.texts)
    same = plots.draw_hung_job({0: waiting[1], 1: waiting[1]}, "debug_job.py")
    assert "every rank in the same call" in same.get_title()
    # A job that ended before its stacks were read: no rank, and no verdict drawn from none.
    assert "no rank's stack was read" in plots.draw_hung_job({}, "debug_job.py").get_title()
