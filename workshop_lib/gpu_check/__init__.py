"""The instructor's check of a GPU machine, in two sizes.

    python -m workshop_lib.gpu_check --smoke [--out DIR]   # one GPU, torch alone, minutes
    make gpu-check                                         # the tests, notebooks and bench

Both write ``report.md`` and ``report.json`` in ``--out`` (default ``build/gpu-check/``
at the repository's root, ``.../smoke`` for the smoke) and print the Markdown at the end:
per step pass, fail (with the step's own error line) or skipped (with the reason), its
seconds against its time limit, and its key figures.

Modules: ``__main__`` (the command), ``smoke`` and ``full`` (the two sets of steps),
``steps`` (running steps under time limits), ``process`` (one command under a limit,
stopped with all it started), ``failures`` (a failure's own error line), ``report``,
``budget`` (make gpu-check's estimated seconds per step, and their basis), ``library``
(the course's entry points the check calls, one function each), ``environment`` (the
commands' environment; ``standins/`` for packages a bare GPU image lacks), ``probes``
(in-process CUDA measurements, run as subprocesses), ``run_notebook`` (papermill in a
process of its own).

Nothing here imports more than the standard library and torch at module level: the
smoke must start on a GPU image that holds nothing else.
"""
