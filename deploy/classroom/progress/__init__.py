"""The class's progress service: learners' kernels report every `labs.check` verdict (and the
assessment's Validate result, and the closing survey) to it with their own hub credentials;
the instructors' board shows the class live.

- ``store``: the records, kept in SQLite, one learner's never written by another;
- ``board``: what the board shows (the grid, who is stuck, the common NOT YET reasons, the
  survey) and its CSV files, computed from the records;
- ``service``: the hub-managed tornado service that takes the records and serves the board.

deploy/classroom/README.md ("The instructor's board") says how the class uses it.
"""
