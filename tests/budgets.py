"""The test suite's time, as a budget: what CI may spend, and each notebook's share.

CI runs `make test` on a fresh 2-core clone in at most SUITE_BUDGET_S (the developers'
budget, well inside CI's 90-minute limit). The notebooks are the largest part: each runs
twice, with the reference solutions on two processes (tests/test_notebook_NN.py) and with
the stubs on one process (tests/test_notebooks_one_process.py, two notebooks side by side,
each with the least sizes that take its paths). NOTEBOOK_BUDGET_S gives each run of each
notebook its seconds on such a machine, from measured papermill runs with some room; the
test session ends with a table of what each execution took against its budget
(conftest.py), so a notebook that grows past its share is seen in the CI log without a
timing assertion that a busy machine could fail.
"""

SUITE_BUDGET_S = 35 * 60
# The notebooks' share of the suite: the rest is torchrun, nbgrader, SLURM, the hub and
# the browser tests.
NOTEBOOKS_SHARE = 0.6

# notebook: (seconds with the solutions on two processes, seconds with the stubs on one).
# Measured in the fresh-clone runs of 2026-12-01 (the latest: solutions 702 s in all; stubs
# 382 s of executions, two at a time, in 193 s of the suite), with room.
NOTEBOOK_BUDGET_S = {
    "00_welcome": (40, 40),
    "01_sgd_and_batch_size": (110, 50),
    "02_from_one_gpu_to_many": (160, 90),
    # 03 with the square-root run on three seeds, NovoGrad and the challenge's answer on
    # three seeds: 232-273 s in the fresh-clone runs of 2026-12-06.
    "03_keeping_accuracy_at_scale": (300, 80),
    "04_when_things_go_wrong": (170, 140),  # 134 s, 103 s with the second hang
    "05_worked_example": (180, 120),
    "06_beyond_one_machine": (150, 80),
    "07_inside_ddp": (90, 60),
    "08_looking_back": (30, 30),  # no launch: its kernel reads records (measured 5 s)
}
RUNS = ("solutions, 2 processes", "stubs, 1 process")
