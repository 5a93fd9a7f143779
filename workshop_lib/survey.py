"""The closing survey (notebook 08): its questions, and where the learner's answers go.

The answers are always a record of the learner's own (``progress.send_survey``: kind
"survey" in their record file). On the class server that record also goes to the progress
service, whose board shows the class's answers aggregated (anonymous or not is the
instructor's choice there), and nothing else is written. On a workstation the answers are
also written as ``survey.json`` into the learner's assessment folder (``ddp_refactor/``,
beside ``notebooks/`` in the workspace ``make lab`` serves), so that nbgrader's submit
carries them to the instructor with the assessment: after a collect they are in
``assessment/submitted/<learner>/ddp_refactor/survey.json``. (A file in a submission is
named by its learner: there the survey is not anonymous.)
"""
import json
from pathlib import Path

from workshop_lib import progress

RATINGS = {
    "overall": "the day as a whole (1 poor .. 5 excellent)",
    "explanations": "the notebooks' explanations (1 hard to follow .. 5 clear)",
    "exercises": "the exercises and their checks (1 unhelpful .. 5 very helpful)",
    "pace": "the pace (1 far too slow, 3 right, 5 far too fast)",
    "environment": "the machine and its set-up (1 in the way .. 5 no trouble)",
}
COMMENTS = {
    "most_useful": "what helped you most",
    "change": "what should change",
    "other": "anything else",
}
FILE_NAME = "survey.json"


def problem(ratings, comments):
    """Why the answers cannot be sent yet (one line), or None."""
    if not isinstance(ratings, dict) or not isinstance(comments, dict):
        return "my_ratings and my_comments should be the dicts of the cell above"
    unknown = sorted(set(ratings) - set(RATINGS)) + sorted(set(comments) - set(COMMENTS))
    if unknown:
        return f"{', '.join(unknown)} is not a question of the survey: keep the cell's names"
    unrated = [name for name in RATINGS if ratings.get(name) is None]
    if unrated:
        return (f"rate every question first: {', '.join(unrated)} still None "
                f"({RATINGS[unrated[0]]})")
    for name, rating in ratings.items():
        if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 5:
            return f"{name} is {rating!r}: give each rating as a whole number from 1 to 5"
    return None


def submit(ratings, comments, assessment_folder):
    """Send the answers: the learner's record (and the class server, where there is one),
    and on a workstation ``survey.json`` in ``assessment_folder`` when it exists. Prints
    where they went, or why nothing was sent; returns the record, or None."""
    why_not = problem(ratings, comments)
    if why_not:
        print(f"NOT SENT: {why_not}")
        return None
    entry = progress.send_survey(ratings, comments)
    if progress.class_server() is not None:
        return entry
    folder = Path(assessment_folder)
    if not folder.is_dir():
        print(f"No assessment folder at {folder} (a workspace has ddp_refactor/ beside "
              f"notebooks/): only your record file holds the survey.")
        return entry
    answers = {**entry["details"], "time": entry["time"]}
    (folder / FILE_NAME).write_text(json.dumps(answers, indent=1) + "\n")
    print(f"Also written to {folder / FILE_NAME}: submit the assessment (again, if you did "
          f"already) and the instructor's collect brings your survey with it.")
    return entry
