"""What `nbgrader autograde` grades: the assignment's own cells and files, nothing else.

nbgrader executes a submitted notebook in one kernel, cell by cell, before it scores the
test cells, and it restores only the locked cells' text. Left alone, a cell that a learner
added (or the solution cell itself, which is kernel code) could replace the checks in
`ddp_checks` by ones that always pass; a tag on a test cell (`skip-execution`) would leave
it unexecuted and so worth full points; a file submitted next to the notebook could shadow a
module the kernel imports. The two preprocessors below run in autograde's sanitize step
(nbgrader_config.py puts them there), after nbgrader's own DeduplicateIds and before its
OverwriteCells:

- ``KeepAssignmentCellsOnly`` rebuilds the notebook from the assignment's cells, in the
  source notebook's order: each cell's nbgrader metadata comes from the gradebook and no
  other metadata is kept; a cell a learner added is dropped, one they deleted is put back
  from the gradebook. The text of every cell but the script cell is the submission's, so
  that OverwriteCells still reports and undoes edits of locked cells. The script cell is
  always the file it writes: its first line is forced to the ``%%writefile`` line that
  nbgrader_config.py names (the learner's code below it becomes the script, never kernel
  code).
- ``KeepAssignmentFilesOnly`` deletes from the folder being graded every file that came with
  the submission rather than from source/ (the notebook itself aside): only the notebook
  counts, and the instructor's copies of the provided files are already there.
- ``UseInstructorGradingFiles`` makes the files that grade (the checks, the recorder, the
  sandbox, the data module) the instructor's, verified by hash, before each learner: their
  bytes and SHA-256 are read from source/ when autograde grades its first learner; before
  every learner source/'s copies are hashed again (a change means something wrote into the
  instructor's folder since: grading stops, in one line), and each file of the folder
  being graded is written afresh from those bytes and its hash checked.

- ``ExecuteOverPrivateSockets`` is nbgrader's Execute with the grading kernel's channels on
  private Unix sockets (``workshop_lib.kernels``): over TCP on 127.0.0.1 any local account
  could subscribe to the kernel's IOPub while a submission is graded and read every cell it
  runs, the hidden tests among them, and what they print.

The script itself is not kernel code: ddp_checks launches it in every rank, next to the
recorder, inside the bubblewrap sandbox of ddp_sandbox.py (README.md, "What grading
guarantees").
"""
import hashlib
import re
import shutil
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from nbgrader.utils import find_all_files
from traitlets import List, Unicode

WRITEFILE = re.compile(r"%%writefile\b")


def as_script_cell(source, first_line):
    """The cell's text with ``first_line`` as its first line: a ``%%writefile`` line (after
    any blank lines) is replaced by it, and anything else gets it on top."""
    lines = source.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines and WRITEFILE.match(lines[0].strip()):
        lines.pop(0)
    return "\n".join([first_line, *lines])


def grade_id(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


class KeepAssignmentCellsOnly(NbGraderPreprocessor):
    """Grade the assignment's own cells, in their order, with their metadata, the script
    cell always writing the script."""

    script_cell = Unicode("", help="grade id of the cell that writes the learner's "
                                    "script").tag(config=True)
    script_first_line = Unicode("", help="that cell's first line, e.g. "
                                         "'%%writefile script.py'").tag(config=True)

    def preprocess(self, nb, resources):
        notebook, assignment = resources["nbgrader"]["notebook"], resources["nbgrader"][
            "assignment"]
        order = self.assignment_order(assignment, notebook)
        submitted = {}
        for cell in nb.cells:
            submitted.setdefault(grade_id(cell), cell)  # one per id after DeduplicateIds
        with Gradebook(resources["nbgrader"]["db_url"]) as gradebook:
            entry = gradebook.find_notebook(notebook, assignment)
            source_cells = {c.name: c for c in entry.source_cells}
            points = {c.name: c.max_score for c in entry.grade_cells}
            solutions = {c.name for c in entry.solution_cells}
            tasks = {c.name for c in entry.task_cells}
            cells = []
            for cell_id, name in order:
                original = source_cells[name]
                cell = submitted.get(name)
                if cell is None:
                    self.log.warning("Cell %s is missing from the submission: put back.",
                                     name)
                text = original.source if cell is None else cell.source
                if name == self.script_cell and self.script_first_line:
                    text = as_script_cell(text, self.script_first_line)
                cells.append(self.new_cell(original, text, cell_id, points.get(name),
                                           name in solutions, name in tasks))
        known = {name for _, name in order}
        dropped = sum(1 for cell in nb.cells if grade_id(cell) not in known)
        if dropped:
            self.log.warning("Dropped %d cell(s) that are not part of the assignment.",
                             dropped)
        nb.cells = cells
        return nb, resources

    def assignment_order(self, assignment, notebook):
        """``[(cell id, grade id)]`` of the source notebook, in order."""
        coursedir = CourseDirectory(config=self.config)
        path = Path(coursedir.format_path(coursedir.source_directory, ".", assignment),
                    f"{notebook}.ipynb")
        source = nbformat.read(path, as_version=4)
        missing = [i for i, cell in enumerate(source.cells) if not grade_id(cell)]
        if missing:
            raise ValueError(f"{path}: cells {missing} have no nbgrader grade id; give every "
                             f"cell of the assignment one (a read-only cell at least).")
        return [(cell.get("id"), grade_id(cell)) for cell in source.cells]

    @staticmethod
    def new_cell(original, text, cell_id, points, solution, task):
        meta = {"grade": points is not None, "grade_id": original.name,
                "locked": original.locked, "schema_version": 3, "solution": solution,
                "task": task, "cell_type": original.cell_type, "checksum": original.checksum}
        if points is not None:
            meta["points"] = points
        metadata = {"nbgrader": meta}
        if original.locked:
            metadata.update(deletable=False, editable=False)
        make = (nbformat.v4.new_code_cell if original.cell_type == "code"
                else nbformat.v4.new_markdown_cell)
        cell = make(text, metadata=metadata)
        if cell_id:
            cell.id = cell_id
        return cell


# nbgrader's own records of a submission, written by its exchange (submit, collect), that
# release_feedback reads back from the graded folder to address each learner's feedback.
NBGRADER_RECORDS = {"timestamp.txt", "submission_secret.txt"}


class KeepAssignmentFilesOnly(NbGraderPreprocessor):
    """Delete, from the folder being graded, what the submission brought besides its
    notebooks: files and folders that source/ does not have (nbgrader's own records of
    the submission stay)."""

    def preprocess(self, nb, resources):
        student = resources["nbgrader"]["student"]
        assignment = resources["nbgrader"]["assignment"]
        coursedir = CourseDirectory(config=self.config)
        source = coursedir.format_path(coursedir.source_directory, ".", assignment)
        graded = Path(coursedir.format_path(coursedir.autograded_directory, student,
                                            assignment))
        # What autograde copied from source/: the names at the top of those paths.
        provided = {Path(path).relative_to(source).parts[0] for path in
                    find_all_files(source, coursedir.ignore + ["*.ipynb"])}
        for path in sorted(graded.iterdir()):
            if path.suffix == ".ipynb" or path.name in provided | NBGRADER_RECORDS:
                continue
            self.log.warning("Removed %s: only the notebook of a submission is graded.",
                             path.name)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        return nb, resources


class GradingFilesChanged(RuntimeError):
    """The instructor's grading files in source/ changed while autograde ran."""


# The bytes of each grading file of source/ as autograde first read them, by path: one
# autograde process grades every learner, and each learner is graded with these.
_INSTRUCTOR_COPIES = {}


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


class UseInstructorGradingFiles(NbGraderPreprocessor):
    """Before each learner: the grading files of the folder being graded are the
    instructor's copies, written afresh and verified by their SHA-256, and source/'s own
    copies still hash as they did for the first learner."""

    # Every module of the checks and of the recorder (each loads its rooms beside it), the
    # sandbox and the data module: tests/test_assessment_checks.py holds this list to the
    # Python files of source/.
    files = List(Unicode(), default_value=[
        "ddp_checks.py", "ddp_checks_rules.py", "ddp_checks_run.py", "ddp_checks_launch.py",
        "ddp_checks_training.py", "ddp_checks_gradients.py", "ddp_checks_rank0.py",
        "ddp_recorder.py", "ddp_recorder_data.py", "ddp_recorder_steps.py",
        "ddp_recorder_outputs.py", "ddp_recorder_replay.py", "ddp_sandbox.py",
        "digits_data.py"],
        help="the files of the assignment that grade a submission").tag(config=True)

    def preprocess(self, nb, resources):
        student = resources["nbgrader"]["student"]
        assignment = resources["nbgrader"]["assignment"]
        coursedir = CourseDirectory(config=self.config)
        source = Path(coursedir.format_path(coursedir.source_directory, ".", assignment))
        graded = Path(coursedir.format_path(coursedir.autograded_directory, student,
                                            assignment))
        for name in self.files:
            original = (source / name).resolve()
            if not original.is_file():
                continue
            now = original.read_bytes()
            kept = _INSTRUCTOR_COPIES.setdefault(original, now)
            if _sha256(now) != _sha256(kept):
                raise GradingFilesChanged(
                    f"{original} changed while autograde ran (sha256 {_sha256(now)[:12]}, "
                    f"was {_sha256(kept)[:12]}): restore it (git checkout) and grade again.")
            target = graded / name
            if not target.is_file() or _sha256(target.read_bytes()) != _sha256(kept):
                self.log.warning("%s of %s is not the instructor's: replaced.", name, student)
            target.unlink(missing_ok=True)  # a link or a read-only file: replaced, not followed
            target.write_bytes(kept)
            if _sha256(target.read_bytes()) != _sha256(kept):
                raise GradingFilesChanged(f"{target} does not hold the instructor's copy "
                                          f"after writing it: check that folder's disk.")
        return nb, resources


class ExecuteOverPrivateSockets(Execute):
    """nbgrader's Execute (its settings, ``c.Execute.timeout`` among them, apply) with the
    kernel on private Unix sockets. nbgrader passes its own kernel manager class as an
    argument, which configuration cannot override: this class passes ours."""

    def __init__(self, *args, **kwargs):
        from workshop_lib.kernels import IpcKernelManager

        kwargs["kernel_manager_class"] = IpcKernelManager
        super().__init__(*args, **kwargs)
