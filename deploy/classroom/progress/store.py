"""The records the learners' kernels send, in SQLite: checked one by one, kept once each.

A record is what `workshop_lib.progress` writes for a verdict or a survey::

    {"id": uuid4 hex, "kind": "exercise" | "assessment" | "survey", "key": str,
     "notebook": str, "ok": bool, "reason": str, "time": ISO-8601, "attempt": int,
     "details": {...}}

The learner a record belongs to is never a field of it: the service passes the owner of the
token that sent it. A record is kept once per learner and id, so a client that sends its
pending records again (it could not tell whether they arrived) stores nothing twice, and
nobody can take another learner's id first.

An anonymous survey (``Store(anonymous=True)``) is not a record: its answers go to the
``ballots`` table under the SHA-256 of the random ``ballot`` secret the learner's kernel
keeps in their home (``details["ballot"]``), with no name and no time; the ``voters`` table
lists who answered, apart, so each learner counts once. A learner's new answers replace
their ballot (they hold its secret); a second ballot from a learner who answered is
refused. Nobody who reads the database, the service's account included, can tell which
ballot is whose: the two tables are keyed and ordered by their keys (no row ids), and the
log that SQLite keeps of the write is emptied after it.
"""
import datetime
import hashlib
import json
import re
import sqlite3

from progress.board import fold

KINDS = ("exercise", "assessment", "survey")
NAME = re.compile(r"[A-Za-z0-9_.-]{1,80}")  # keys, notebooks, rating names: shown as they are
NOTEBOOK = re.compile(r"[A-Za-z0-9_.-]{0,80}")  # empty: a verdict given outside a notebook
ID = re.compile(r"[0-9a-f]{32}")
REASON_CHARS = 200
DETAILS_BYTES = 16384  # workshop_lib.progress keeps a record's details under 8000
COMMENT_CHARS = 2000
# Enough for a day of retries (16 exercises, the assessment, a survey: 50 tries each); past
# it a learner's client could only be filling the instructor's disk and slowing the board,
# whose summary reads every verdict's index entry (30 learners at this cap: 0.5 s a refresh
# on the test machine).
RECORDS_PER_LEARNER = 1000
RECORDS_PER_REQUEST = 500
FIELDS = ("learner", "id", "kind", "key", "notebook", "ok", "reason", "time", "attempt",
          "details", "received")
VERDICTS = "kind IN ('exercise', 'assessment')"
# The board's figures, computed by SQLite from an index that holds every column they read
# (never the records' details), so that their cost in memory does not grow with what one
# learner sends, and their time only with the count of verdicts (RECORDS_PER_LEARNER caps
# it): each cell's count, whether it ever passed and its latest verdict; its NOT YET streak
# (those after its latest PASS); the first report of each exercise; each learner's latest
# verdict; per exercise and folded reason, the learners, the times and the latest words.
ORDER = "time || '|' || received"
CELLS = f"""
WITH v AS (SELECT learner, key, kind, notebook, ok, reason, time,
                  {ORDER} || '|' || printf('%012d', rowid) AS o
           FROM records INDEXED BY records_for_the_board WHERE {VERDICTS}),
     agg AS (SELECT learner, key, count(*) AS attempts, max(ok) AS passed, max(o) AS last,
                    max(CASE WHEN ok THEN o END) AS last_pass FROM v GROUP BY learner, key),
     streaks AS (SELECT v.learner, v.key,
                        sum(NOT v.ok AND (agg.last_pass IS NULL OR v.o > agg.last_pass)) AS n
                 FROM v JOIN agg ON agg.learner = v.learner AND agg.key = v.key
                 GROUP BY v.learner, v.key)
SELECT v.learner, v.key, v.kind, v.notebook, v.ok, v.reason, v.time, agg.attempts,
       agg.passed, streaks.n
FROM agg JOIN v ON v.learner = agg.learner AND v.key = agg.key AND v.o = agg.last
         JOIN streaks ON streaks.learner = agg.learner AND streaks.key = agg.key
"""
BOARD_ROWS = "records INDEXED BY records_for_the_board"
FIRST = f"SELECT key, notebook, kind, min({ORDER}) FROM {BOARD_ROWS} WHERE {VERDICTS} GROUP BY key"
LATEST = (f"SELECT learner, key, notebook, ok, time, max({ORDER} || '|' || "
          f"printf('%012d', rowid)) FROM {BOARD_ROWS} WHERE {VERDICTS} GROUP BY learner")
REASONS = (f"SELECT key, folded, reason, count(DISTINCT learner), count(*), max({ORDER}) "
           f"FROM {BOARD_ROWS} WHERE {VERDICTS} AND NOT ok GROUP BY key, folded")
SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    learner TEXT NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL,
    notebook TEXT NOT NULL, ok INTEGER NOT NULL, reason TEXT NOT NULL, time TEXT NOT NULL,
    attempt INTEGER NOT NULL, details TEXT NOT NULL, received TEXT NOT NULL,
    folded TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (learner, id));
CREATE INDEX IF NOT EXISTS records_for_the_board
    ON records (learner, key, time, received, kind, ok, notebook, folded, reason);
CREATE INDEX IF NOT EXISTS records_by_kind ON records (kind);
CREATE TABLE IF NOT EXISTS voters (learner TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ballots (ballot TEXT PRIMARY KEY, details TEXT NOT NULL)
    WITHOUT ROWID;
"""
BALLOT = re.compile(r"[0-9a-f]{32}")


class RecordError(ValueError):
    """Why a record is refused, in one line."""


def now():
    return datetime.datetime.now(datetime.UTC)


def utc_time(text):
    """An ISO-8601 time as UTC, written one way (so that times sort as text); a time without
    a zone is taken as UTC."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise RecordError(f"time {str(text)[:40]!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.astimezone(datetime.UTC).isoformat(timespec="microseconds")


def _name(record, field, pattern=NAME):
    value = record.get(field)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise RecordError(f"{field} must be letters, digits, '_', '.' or '-' (at most 80), "
                          f"not {str(value)[:40]!r}")
    return value


def _survey(details):
    """A survey's details: ``{"ratings": {name: 1..5}, "comments": {name: text}}``."""
    ratings, comments = details.get("ratings", {}), details.get("comments", {})
    if "ballot" in details and not BALLOT.fullmatch(str(details["ballot"])):
        raise RecordError("a survey's ballot is 32 lower-case hex digits")
    if not isinstance(ratings, dict) or not isinstance(comments, dict):
        raise RecordError("a survey's details are {'ratings': {name: 1..5}, "
                          "'comments': {name: text}}")
    for name, value in ratings.items():
        if not NAME.fullmatch(str(name)) or type(value) is not int or not 1 <= value <= 5:
            raise RecordError(f"rating {str(name)[:40]!r}: a whole number from 1 to 5, "
                              f"not {str(value)[:20]!r}")
    for name, text in comments.items():
        if not NAME.fullmatch(str(name)) or not isinstance(text, str):
            raise RecordError(f"comment {str(name)[:40]!r}: a name and a text")
        if len(text) > COMMENT_CHARS:
            raise RecordError(f"comment {name!r} is over {COMMENT_CHARS} characters")


def cut_at_word(text, limit):
    """``text``, past ``limit`` characters cut at a word, with "…" (as the learner's side,
    workshop_lib.progress.first_line, cuts it)."""
    if len(text) <= limit:
        return text
    head = text[:limit - 1]  # room for the "…"
    cut = head.rsplit(" ", 1)[0] if " " in head else head
    return cut.rstrip(" ,;:") + "…"


def validate(record):
    """The record as stored (without its learner), or RecordError saying what is wrong."""
    if not isinstance(record, dict):
        raise RecordError("a record is a JSON object")
    record_id = record.get("id")
    if not isinstance(record_id, str) or not ID.fullmatch(record_id):
        raise RecordError(f"id must be 32 lower-case hex digits (uuid4().hex), not "
                          f"{str(record_id)[:40]!r}")
    kind = record.get("kind")
    if kind not in KINDS:
        raise RecordError(f"kind must be one of {', '.join(KINDS)}, not {str(kind)[:40]!r}")
    if not isinstance(record.get("ok"), bool):
        raise RecordError("ok must be true or false")
    reason = record.get("reason", "")
    if not isinstance(reason, str):
        raise RecordError("reason must be a text")
    attempt = record.get("attempt", 1)
    if type(attempt) is not int or attempt < 0:
        raise RecordError("attempt must be a whole number, 0 or more")
    details = record.get("details", {})
    if not isinstance(details, dict):
        raise RecordError("details must be a JSON object")
    details_text = json.dumps(details, sort_keys=True)
    if len(details_text.encode()) > DETAILS_BYTES:
        raise RecordError(f"details are over {DETAILS_BYTES} bytes")
    if kind == "survey":
        _survey(details)
    return {"id": record_id, "kind": kind, "key": _name(record, "key"),
            "notebook": _name(record, "notebook", NOTEBOOK), "ok": record["ok"],
            "reason": cut_at_word(reason, REASON_CHARS), "time": utc_time(record.get("time")),
            "attempt": attempt, "details": details_text}


class Store:
    """The records of the whole class in one SQLite file (WAL: the board reads while
    kernels write)."""

    def __init__(self, path, anonymous=False):
        self.anonymous = anonymous
        self.db = sqlite3.connect(str(path), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA secure_delete=ON")  # a replaced ballot leaves no trace
        self.db.executescript(SCHEMA)
        if "folded" not in [row[1] for row in self.db.execute("PRAGMA table_info(records)")]:
            self._add_folded()

    def add(self, learner, records):
        """Keep ``records`` as ``learner``'s; ``(stored, rejected)``: how many were new, and
        ``[{"id", "reason"}]`` for those refused."""
        if not isinstance(records, list):
            raise RecordError('the body is {"records": [...]}')
        if len(records) > RECORDS_PER_REQUEST:
            raise RecordError(f"at most {RECORDS_PER_REQUEST} records at a time")
        held = self.db.execute("SELECT count(*) FROM records WHERE learner = ?",
                               (learner,)).fetchone()[0]
        stored, rejected, voted = 0, [], False
        received = now().isoformat(timespec="microseconds")
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for record in records:
                try:
                    row = validate(record)
                except RecordError as error:
                    rejected.append({"id": str(record.get("id", ""))[:40]
                                     if isinstance(record, dict) else "", "reason": str(error)})
                    continue
                if row["kind"] == "survey":
                    details = json.loads(row["details"])
                    ballot = details.pop("ballot", None)
                    if self.anonymous:
                        refused = self._vote(learner, ballot, details)
                        if refused:
                            rejected.append({"id": row["id"], "reason": refused})
                        else:
                            stored += 1
                            voted = True
                        continue
                    row["details"] = json.dumps(details, sort_keys=True)
                if held >= RECORDS_PER_LEARNER:
                    rejected.append({"id": row["id"], "reason": f"{learner} already has "
                                     f"{RECORDS_PER_LEARNER} records"})
                    continue
                cursor = self.db.execute(
                    "INSERT OR IGNORE INTO records VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (learner, row["id"], row["kind"], row["key"], row["notebook"],
                     int(row["ok"]), row["reason"], row["time"], row["attempt"],
                     row["details"], received, fold(row["reason"])))
                stored += cursor.rowcount
                held += cursor.rowcount
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        if voted:  # the write-ahead log would keep the order of the writes: emptied
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return stored, rejected

    def _vote(self, learner, ballot, details):
        """Keep an anonymous survey's answers; None, or why they are refused."""
        if ballot is None:
            return "an anonymous survey needs its ballot (workshop_lib.progress sends it)"
        key = hashlib.sha256(ballot.encode()).hexdigest()
        answered = self.db.execute("SELECT 1 FROM voters WHERE learner = ?",
                                   (learner,)).fetchone()
        known = self.db.execute("SELECT 1 FROM ballots WHERE ballot = ?", (key,)).fetchone()
        if answered and not known:
            return f"{learner} has answered the survey already, with another ballot"
        if not answered and known:
            return "that ballot is another learner's"
        self.db.execute("INSERT OR IGNORE INTO voters VALUES (?)", (learner,))
        self.db.execute("INSERT OR REPLACE INTO ballots VALUES (?, ?)",
                        (key, json.dumps(details, sort_keys=True)))
        return None

    def ballots(self):
        """The anonymous survey's answers, one ``details`` a learner, in no learner's order."""
        return [json.loads(text) for (text,) in
                self.db.execute("SELECT details FROM ballots ORDER BY ballot")]

    def _add_folded(self):
        """A database from before the board's summary: its reasons folded once."""
        self.db.execute("ALTER TABLE records ADD COLUMN folded TEXT NOT NULL DEFAULT ''")
        folded = [(fold(reason), rowid) for rowid, reason in
                  self.db.execute("SELECT rowid, reason FROM records")]
        self.db.executemany("UPDATE records SET folded = ? WHERE rowid = ?", folded)

    def summary(self):
        """What the board shows, summed up by SQLite (board.build reads it)."""
        cells = [dict(zip(("learner", "key", "kind", "notebook", "ok", "reason", "time",
                           "attempts", "passed", "streak"), values, strict=True))
                 for values in self.db.execute(CELLS)]
        for cell in cells:
            cell["ok"], cell["passed"] = bool(cell["ok"]), bool(cell["passed"])
        first = [dict(zip(("key", "notebook", "kind", "order"), values, strict=True))
                 for values in self.db.execute(FIRST)]
        latest = [dict(zip(("learner", "key", "notebook", "ok", "time"), values[:5],
                           strict=True)) for values in self.db.execute(LATEST)]
        reasons = [dict(zip(("key", "folded", "reason", "learners", "times"), values[:5],
                            strict=True)) for values in self.db.execute(REASONS)]
        surveys = [row for row in self.rows("kind = 'survey'")]
        return {"cells": cells, "first": first, "latest": latest, "reasons": reasons,
                "surveys": surveys}

    def rows(self, where="1"):
        """Every record, oldest first (by the learner's time, then by arrival)."""
        cursor = self.db.execute(f"SELECT {', '.join(FIELDS)} FROM records WHERE {where} "
                                 f"ORDER BY time, received, rowid")
        found = []
        for values in cursor:
            row = dict(zip(FIELDS, values, strict=True))
            row["ok"] = bool(row["ok"])
            row["details"] = json.loads(row["details"])
            found.append(row)
        return found

    def close(self):
        self.db.close()
