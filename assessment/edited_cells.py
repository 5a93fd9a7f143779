"""List the locked cells that learners changed in their submitted notebooks.

    python edited_cells.py ddp_refactor

nbgrader puts every locked cell (the tests, the provided code) back to its original
before it grades a notebook, so an edit gains nothing; this names who tried. It compares
each submitted notebook with the released one, cell by cell, by nbgrader's cell id.
(nbgrader's own autograde log also warns about the runs_and_reaches_target_accuracy
cell of every submission: that is its hidden part being put back, not an edit.)
"""
import json
import sys
from pathlib import Path


def locked_cells(notebook):
    cells = json.loads(Path(notebook).read_text())["cells"]
    return {cell["metadata"]["nbgrader"]["grade_id"]: "".join(cell["source"])
            for cell in cells
            if cell.get("metadata", {}).get("nbgrader", {}).get("locked")}


def edited_cells(release_notebook, submitted_notebook):
    """The ids of the locked cells that the submission changed or deleted, in order."""
    released = locked_cells(release_notebook)
    submitted = locked_cells(submitted_notebook)
    return [cell_id for cell_id, source in released.items()
            if submitted.get(cell_id) != source]


def main(assignment):
    release = Path("release") / assignment
    found = False
    for notebook in sorted(Path("submitted").glob(f"*/{assignment}/*.ipynb")):
        student = notebook.parts[1]
        released = release / notebook.name
        if not released.is_file():
            print(f"{student}: {notebook.name} is not part of the assignment")
            continue
        for cell_id in edited_cells(released, notebook):
            found = True
            print(f"{student}: edited locked cell {cell_id!r} in {notebook.name} "
                  f"(put back to the original before grading)")
    if not found:
        print("No submission edited a locked cell.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ddp_refactor")
