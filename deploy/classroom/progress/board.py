"""What the instructor's board shows, computed from the records' summary
(``store.Store.summary``, which SQLite sums up, so that the board's cost does not grow with
one learner's records):

- the grid: learners x exercises, each cell the latest verdict and how many were sent;
- who is stuck: NOT YET ``stuck_after`` times in a row on one exercise, or no verdict for
  ``quiet_minutes`` since a NOT YET (the learner's latest verdict);
- per exercise, the most common NOT YET reasons, with how many learners got each (numbers
  and quoted values folded, so "you said 3" and "you said 4" count as one reason);
- the survey: each learner's latest answers, per rating the count, mean and distribution,
  and the comments; with ``anonymous`` nothing says who answered what.

Plain data in, plain data out (the service serves it as JSON, the page draws it), and the
two CSV files an instructor downloads.
"""
import csv
import datetime
import io
import re
from collections import defaultdict

STUCK_AFTER = 3
QUIET_MINUTES = 10
TOP_REASONS = 3
# An anonymous survey is shown from this many answers on: with one or two, the board
# changing as a learner answers would say whose they are.
MIN_ANONYMOUS = 3
# A spreadsheet runs a cell that starts with one of these as a formula: learners write the
# reasons' quoted values and the comments.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def fold(reason):
    """A reason with its particulars folded: quoted values, then numbers."""
    folded = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", reason)
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", folded)


def _when(text):
    return datetime.datetime.fromisoformat(text)


def _exercises(first, catalogue=()):
    """Every exercise of the day in the course's order (``catalogue``: ``[{"key",
    "notebook", "kind"}]``, as the notebooks come, the assessment last), whether anybody
    reported it or not; then any other exercise reported (``first``: each key's first
    report), by notebook (NN_slug), then as first reported."""
    listed = [{"key": item["key"], "notebook": item["notebook"],
               "kind": item.get("kind", "exercise")} for item in catalogue]
    known = {item["key"] for item in listed}
    others = sorted((item for item in first if item["key"] not in known),
                    key=lambda item: (item["notebook"], item["order"]))
    return listed + [{"key": item["key"], "notebook": item["notebook"], "kind": item["kind"]}
                     for item in others]


def _since_last_check(latest, now):
    """``{learner: whole minutes since their latest verdict}``."""
    return {row["learner"]: int((now - _when(row["time"])).total_seconds() // 60)
            for row in sorted(latest, key=lambda row: row["learner"])}


def _cells(summary):
    cells = defaultdict(dict)
    for cell in summary["cells"]:
        cells[cell["learner"]][cell["key"]] = cell
    return cells


def _stuck(latest, cells, now, stuck_after, quiet_minutes):
    found = defaultdict(list)
    for learner, row in sorted(cells.items()):
        for key, cell in row.items():
            if cell["streak"] >= stuck_after:
                found[learner].append(f"NOT YET {cell['streak']} times in a row on {key}")
    for row in sorted(latest, key=lambda row: row["learner"]):
        quiet = (now - _when(row["time"])).total_seconds() / 60
        if not row["ok"] and quiet >= quiet_minutes:
            found[row["learner"]].append(f"no verdict for {int(quiet)} min since NOT YET on "
                                         f"{row['key']} ({row['notebook']})")
    return [{"learner": learner, "why": whys} for learner, whys in sorted(found.items())]


def _reasons(groups, top):
    by_key = defaultdict(list)
    for group in groups:
        by_key[group["key"]].append(group)
    return {key: [{"reason": g["reason"], "learners": g["learners"], "times": g["times"]}
                  for g in sorted(found, key=lambda g: (-g["learners"], -g["times"],
                                                        g["reason"]))[:top]]
            for key, found in by_key.items()}


def _answers(rows, ballots):
    """``{learner or ballot number: details}``: each learner's latest answers, or the
    anonymous survey's ballots (``store.Store.ballots``) where they are given."""
    if ballots is not None:
        return dict(enumerate(ballots)) if len(ballots) >= MIN_ANONYMOUS else {}
    answers = {}
    for row in rows:
        if row["kind"] == "survey":
            answers[row["learner"]] = row["details"]  # the latest counts
    return answers


def _survey(rows, anonymous, ballots=None):
    answers = _answers(rows, ballots)
    ratings = defaultdict(list)
    comments = defaultdict(list)
    for learner, details in sorted(answers.items()):
        for name, value in details.get("ratings", {}).items():
            ratings[name].append(value)
        for name, text in details.get("comments", {}).items():
            if text.strip():
                comments[name].append(text.strip() if anonymous
                                      else {"learner": learner, "text": text.strip()})
    summary = {name: {"count": len(values), "mean": round(sum(values) / len(values), 2),
                      "distribution": {str(k): values.count(k) for k in range(1, 6)}}
               for name, values in sorted(ratings.items())}
    listed = {name: sorted(texts) if anonymous else texts
              for name, texts in sorted(comments.items())}
    return {"answered": len(ballots) if ballots is not None else len(answers),
            "anonymous": anonymous, "ratings": summary, "comments": listed,
            "learners": [] if anonymous else sorted(answers),
            "withheld": ballots is not None and len(ballots) < MIN_ANONYMOUS}


def build(summary, learners=(), now=None, stuck_after=STUCK_AFTER,
          quiet_minutes=QUIET_MINUTES, anonymous=False, top=TOP_REASONS, ballots=None,
          catalogue=()):
    """The board from the records' summary (``store.Store.summary``) and the class's
    learners (those who sent nothing yet have a row too); every exercise of ``catalogue`` a
    column; an anonymous survey from its ``ballots``."""
    now = now or datetime.datetime.now(datetime.UTC)
    cells = _cells(summary)
    everyone = sorted(set(learners) | set(cells))
    return {
        "generated": now.isoformat(timespec="seconds"),
        "thresholds": {"stuck_after": stuck_after, "quiet_minutes": quiet_minutes},
        "learners": everyone,
        "exercises": _exercises(summary["first"], catalogue),
        "since_last_check": _since_last_check(summary["latest"], now),
        "cells": {learner: {key: {k: cell[k] for k in ("ok", "attempts", "reason", "time",
                                                        "passed")}
                            for key, cell in row.items()}
                  for learner, row in cells.items()},
        "stuck": _stuck(summary["latest"], cells, now, stuck_after, quiet_minutes),
        "reasons": _reasons(summary["reasons"], top),
        "survey": _survey(summary["surveys"], anonymous, ballots),
    }


def _safe(value):
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def _csv(header, rows):
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows([[_safe(value) for value in row] for row in rows])
    return out.getvalue()


def grid_csv(board):
    """board.csv: one line per learner and exercise they reported."""
    stuck = {entry["learner"] for entry in board["stuck"]}
    lines = []
    for learner in board["learners"]:
        for exercise in board["exercises"]:
            cell = board["cells"].get(learner, {}).get(exercise["key"])
            if cell:
                lines.append([learner, exercise["notebook"], exercise["key"],
                              "PASS" if cell["ok"] else "NOT YET", cell["attempts"],
                              "yes" if cell["passed"] else "no", cell["time"], cell["reason"],
                              "yes" if learner in stuck else "no"])
    return _csv(["learner", "notebook", "exercise", "latest", "attempts", "passed_once",
                 "time", "reason", "stuck"], lines)


def survey_csv(rows, anonymous, ballots=None):
    """survey.csv: one line per learner's latest answers; with ``anonymous`` no learner
    column, and the lines in the order of their answers, not of the learners."""
    answers = _answers(rows, ballots)
    ratings = sorted({name for d in answers.values() for name in d.get("ratings", {})})
    comments = sorted({name for d in answers.values() for name in d.get("comments", {})})
    lines = [[*([] if anonymous else [learner]),
              *(details.get("ratings", {}).get(name, "") for name in ratings),
              *(details.get("comments", {}).get(name, "") for name in comments)]
             for learner, details in sorted(answers.items())]
    if anonymous:
        lines.sort(key=lambda line: [str(value) for value in line])
    return _csv([*([] if anonymous else ["learner"]), *ratings, *comments], lines)
