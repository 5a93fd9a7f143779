"""Write the grades from gradebook.db to a CSV file: one row per learner, a column per
requirement, the total and whether it reaches the pass mark.

    python export_grades.py ddp_refactor grades.csv

(`make grades` runs it.) nbgrader's own `export` has no pass/fail column. A requirement
counts as met when its test cell has all its points, after any manual adjustment made in
the formgrader; the pass mark is the one the learners' notebooks print,
`ddp_checks.passes` of source/<assignment>/ddp_checks.py.
"""
import csv
import importlib.util
import sys
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

HERE = Path(__file__).resolve().parent


def load_checks(assignment):
    """The assignment's ddp_checks module (standard library only), from source/."""
    path = HERE / "source" / assignment / "ddp_checks.py"
    spec = importlib.util.spec_from_file_location(f"{assignment}_ddp_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def grade_rows(gradebook, assignment, checks):
    """One dict per learner in the gradebook, in the order of the CSV's columns."""
    requirements = list(checks.REQUIREMENTS)
    for student in sorted(gradebook.students, key=lambda s: s.id):
        row = {"student_id": student.id, "last_name": student.last_name or "",
               "first_name": student.first_name or "", "timestamp": "",
               **dict.fromkeys(requirements, ""), "score": 0.0,
               "max_score": float(sum(checks.REQUIREMENTS.values())), "passed": "no"}
        try:
            submission = gradebook.find_submission(assignment, student.id)
        except MissingEntry:
            yield row
            continue
        scores = {grade.name: (grade.score, grade.max_score)
                  for notebook in submission.notebooks for grade in notebook.grades}
        met = {name for name, (score, max_score) in scores.items() if score >= max_score}
        row.update({name: scores[name][0] for name in requirements if name in scores},
                   timestamp=submission.timestamp or "", score=submission.score,
                   max_score=submission.max_score,
                   passed="yes" if checks.passes(met & set(requirements)) else "no")
        yield row


def main(assignment, output):
    checks = load_checks(assignment)
    with Gradebook("sqlite:///gradebook.db") as gradebook:
        rows = list(grade_rows(gradebook, assignment, checks))
    with open(output, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["student_id"])
        writer.writeheader()
        writer.writerows(rows)
    passed = sum(row["passed"] == "yes" for row in rows)
    print(f"{output}: {len(rows)} learners, {passed} passed ({checks.pass_rule()}).")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python export_grades.py ASSIGNMENT OUTPUT.csv")
    main(*sys.argv[1:])
