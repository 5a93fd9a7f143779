"""nbgrader's settings for the assessment. nbgrader reads this file from the folder it
runs in: run every nbgrader command (or `make ...`) from this folder."""
c = get_config()  # noqa: F821 - nbgrader defines get_config when it loads this file

c.CourseDirectory.course_id = "ddp-workshop"

# Files the notebook writes when it runs, next to it: in source/ when the instructor
# validates it (train_digits_ddp.py is then the solution!), in a learner's folder when
# they work. Never copy them into release/, nor from a submission into autograded/
# (where the notebook writes them afresh).
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback",
    "train_digits.py", "train_digits_ddp.py", "runs", "grading_run",
]

# Each test run of a learner's script is stopped after ddp_checks.Config.time_limit_s
# (300 s); a notebook cell may take that plus start-up, and no cell more than this
# (an endless loop in a learner's own cell is interrupted here, and grading goes on).
c.Execute.timeout = 420
