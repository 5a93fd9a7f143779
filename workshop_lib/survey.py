"""The closing survey (notebook 08): its questions, and where the learner's answers go.

The answers are always a record of the learner's own (``send_survey``: kind "survey" in
their record file, with the learner's ballot: ``ballot``). On the class server that record
also goes to the progress service, whose board shows the class's answers aggregated
(anonymous or not is the instructor's choice there: an anonymous survey keeps the answers
under the ballot's hash, never the learner's name), and nothing else is written. On a
workstation the answers are also written as ``survey.json`` into the learner's assessment
folder (``ddp_refactor/``, beside ``notebooks/`` in the workspace ``make lab`` serves), so
that nbgrader's submit carries them to the instructor with the assessment: after a collect
they are in ``assessment/submitted/<learner>/ddp_refactor/survey.json``. (A file in a submission is
named by its learner: there the survey is not anonymous.)
"""
import json
import re
import uuid
from collections.abc import Mapping
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
    entry = send_survey(ratings, comments)
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


def send_survey(ratings, comments, notebook=progress.SURVEY_NOTEBOOK):
    """Record the closing survey (``ratings``: ``{question: whole number 1..5}``,
    ``comments``: ``{question: text}``, empty ones left out) and send it to the class
    server, waiting for its answer at most TIMEOUT_S; print one line saying where it went.
    Returns the record."""
    if not isinstance(ratings, Mapping) or not isinstance(comments, Mapping):
        raise ValueError("give the ratings and the comments as dicts: {question: answer}")
    for name in [*ratings, *comments]:  # the class's board shows the names as they are
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,80}", str(name)):
            raise ValueError(f"question {str(name)[:40]!r}: name it with letters, digits, "
                             f"'_', '.' or '-' (at most 80)")
    for name, rating in ratings.items():
        if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 5:
            raise ValueError(f"rating {name!r} is {rating!r}: give each rating as a whole "
                             f"number from 1 to 5")
    texts = {str(name): str(text).strip()[:progress.TEXT_CHARS]
             for name, text in comments.items() if str(text or "").strip()}
    entry = progress.record("survey", "survey", notebook, True,
                   f"{len(ratings)} rating(s), {len(texts)} comment(s)",
                   {"ratings": {str(name): rating for name, rating in ratings.items()},
                    "comments": texts, "ballot": ballot()})
    path = progress.record_path()
    if progress.class_server() is None:
        print(f"Thank you. Your answers are saved in {path}: your instructor collects them.")
    elif (progress.wait_for_reports(progress.TIMEOUT_S + 1)
          and progress.acknowledged(entry["id"], path)):
        print("Thank you. Your answers reached the class's progress service.")
    else:
        print(f"Thank you. Your answers are saved in {path}; the class server did not take "
              f"them yet ({progress.last_error() or 'no answer in time'}): they go with your "
              f"next check, or run `python -m workshop_lib.labs progress --send`.")
    return entry


def ballot():
    """The learner's survey ballot: a random secret kept beside the record file (0600). An
    anonymous survey keeps answers under its hash only, so a learner's new answers replace
    their own and nobody can tell whose they are."""
    path = progress.record_path().with_name("ballot")
    if not path.exists():
        progress.append_lines(path, [uuid.uuid4().hex])
    return path.read_text().split()[0]
