"""What the instructor's board shows, computed from the records (``store.Store.rows``):

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
GRADED = ("exercise", "assessment")
# A spreadsheet runs a cell that starts with one of these as a formula: learners write the
# reasons' quoted values and the comments.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def fold(reason):
    """A reason with its particulars folded: quoted values, then numbers."""
    folded = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", reason)
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", folded)


def _when(text):
    return datetime.datetime.fromisoformat(text)


def _exercises(verdicts):
    """The exercises seen, in the course's order: by notebook (NN_slug), then as first
    reported."""
    first = {}
    for row in verdicts:
        first.setdefault(row["key"], (row["notebook"], row["time"], row["kind"]))
    ordered = sorted(first.items(), key=lambda item: item[1][:2])
    return [{"key": key, "notebook": notebook, "kind": kind}
            for key, (notebook, _, kind) in ordered]


def _cells(verdicts):
    cells = defaultdict(dict)
    for row in verdicts:
        cell = cells[row["learner"]].setdefault(row["key"], {"attempts": 0, "passed": False,
                                                             "streak": 0})
        cell["attempts"] += 1
        cell.update(ok=row["ok"], reason=row["reason"], time=row["time"],
                    notebook=row["notebook"])
        cell["passed"] = cell["passed"] or row["ok"]
        cell["streak"] = 0 if row["ok"] else cell["streak"] + 1
    return cells


def _stuck(verdicts, cells, now, stuck_after, quiet_minutes):
    found = defaultdict(list)
    for learner, row in sorted(cells.items()):
        for key, cell in row.items():
            if cell["streak"] >= stuck_after:
                found[learner].append(f"NOT YET {cell['streak']} times in a row on {key}")
    latest = {}
    for row in verdicts:
        latest[row["learner"]] = row
    for learner, row in sorted(latest.items()):
        quiet = (now - _when(row["time"])).total_seconds() / 60
        if not row["ok"] and quiet >= quiet_minutes:
            found[learner].append(f"no verdict for {int(quiet)} min since NOT YET on "
                                  f"{row['key']} ({row['notebook']})")
    return [{"learner": learner, "why": whys} for learner, whys in sorted(found.items())]


def _reasons(verdicts, top):
    groups = defaultdict(lambda: defaultdict(lambda: {"learners": set(), "times": 0}))
    for row in verdicts:
        if not row["ok"]:
            group = groups[row["key"]][fold(row["reason"])]
            group["learners"].add(row["learner"])
            group["times"] += 1
            group["example"] = row["reason"]  # the latest one said
    common = {}
    for key, by_reason in groups.items():
        ranked = sorted(by_reason.values(), key=lambda g: (-len(g["learners"]), -g["times"],
                                                           g["example"]))
        common[key] = [{"reason": g["example"], "learners": len(g["learners"]),
                        "times": g["times"]} for g in ranked[:top]]
    return common


def _survey(rows, anonymous):
    answers = {}
    for row in rows:
        if row["kind"] == "survey":
            answers[row["learner"]] = row["details"]  # the latest counts
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
    return {"answered": len(answers), "anonymous": anonymous, "ratings": summary,
            "comments": listed,
            "learners": [] if anonymous else sorted(answers)}


def build(rows, learners=(), now=None, stuck_after=STUCK_AFTER, quiet_minutes=QUIET_MINUTES,
          anonymous=False, top=TOP_REASONS):
    """The board from every record (oldest first) and the class's learners (those who sent
    nothing yet have a row too)."""
    now = now or datetime.datetime.now(datetime.UTC)
    verdicts = [row for row in rows if row["kind"] in GRADED]
    cells = _cells(verdicts)
    everyone = sorted(set(learners) | set(cells))
    return {
        "generated": now.isoformat(timespec="seconds"),
        "thresholds": {"stuck_after": stuck_after, "quiet_minutes": quiet_minutes},
        "learners": everyone,
        "exercises": _exercises(verdicts),
        "cells": {learner: {key: {k: cell[k] for k in ("ok", "attempts", "reason", "time",
                                                        "passed")}
                            for key, cell in row.items()}
                  for learner, row in cells.items()},
        "stuck": _stuck(verdicts, cells, now, stuck_after, quiet_minutes),
        "reasons": _reasons(verdicts, top),
        "survey": _survey(rows, anonymous),
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


def survey_csv(rows, anonymous):
    """survey.csv: one line per learner's latest answers; with ``anonymous`` no learner
    column, and the lines in the order of their answers, not of the learners."""
    answers = {}
    for row in rows:
        if row["kind"] == "survey":
            answers[row["learner"]] = row["details"]
    ratings = sorted({name for d in answers.values() for name in d.get("ratings", {})})
    comments = sorted({name for d in answers.values() for name in d.get("comments", {})})
    lines = [[*([] if anonymous else [learner]),
              *(details.get("ratings", {}).get(name, "") for name in ratings),
              *(details.get("comments", {}).get(name, "") for name in comments)]
             for learner, details in sorted(answers.items())]
    if anonymous:
        lines.sort(key=lambda line: [str(value) for value in line])
    return _csv([*([] if anonymous else ["learner"]), *ratings, *comments], lines)
