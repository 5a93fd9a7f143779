"""The records the learners' kernels send, in SQLite: checked one by one, kept once each.

A record is what `workshop_lib.progress` writes for a verdict or a survey::

    {"id": uuid4 hex, "kind": "exercise" | "assessment" | "survey", "key": str,
     "notebook": str, "ok": bool, "reason": str, "time": ISO-8601, "attempt": int,
     "details": {...}}

The learner a record belongs to is never a field of it: the service passes the owner of the
token that sent it. A record is kept once per learner and id, so a client that sends its
pending records again (it could not tell whether they arrived) stores nothing twice, and
nobody can take another learner's id first.
"""
import datetime
import json
import re
import sqlite3

KINDS = ("exercise", "assessment", "survey")
NAME = re.compile(r"[A-Za-z0-9_.-]{1,80}")  # keys, notebooks, rating names: shown as they are
NOTEBOOK = re.compile(r"[A-Za-z0-9_.-]{0,80}")  # empty: a verdict given outside a notebook
ID = re.compile(r"[0-9a-f]{32}")
REASON_CHARS = 200
DETAILS_BYTES = 16384  # workshop_lib.progress keeps a record's details under 8000
COMMENT_CHARS = 2000
# Enough for a day of retries (15 exercises, a survey); past it a learner's client could
# only be filling the instructor's disk.
RECORDS_PER_LEARNER = 5000
RECORDS_PER_REQUEST = 500
FIELDS = ("learner", "id", "kind", "key", "notebook", "ok", "reason", "time", "attempt",
          "details", "received")
SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    learner TEXT NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL,
    notebook TEXT NOT NULL, ok INTEGER NOT NULL, reason TEXT NOT NULL, time TEXT NOT NULL,
    attempt INTEGER NOT NULL, details TEXT NOT NULL, received TEXT NOT NULL,
    PRIMARY KEY (learner, id))
"""


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
            "reason": reason[:REASON_CHARS], "time": utc_time(record.get("time")),
            "attempt": attempt, "details": details_text}


class Store:
    """The records of the whole class in one SQLite file (WAL: the board reads while
    kernels write)."""

    def __init__(self, path):
        self.db = sqlite3.connect(str(path), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(SCHEMA)

    def add(self, learner, records):
        """Keep ``records`` as ``learner``'s; ``(stored, rejected)``: how many were new, and
        ``[{"id", "reason"}]`` for those refused."""
        if not isinstance(records, list):
            raise RecordError('the body is {"records": [...]}')
        if len(records) > RECORDS_PER_REQUEST:
            raise RecordError(f"at most {RECORDS_PER_REQUEST} records at a time")
        held = self.db.execute("SELECT count(*) FROM records WHERE learner = ?",
                               (learner,)).fetchone()[0]
        stored, rejected = 0, []
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
                if held >= RECORDS_PER_LEARNER:
                    rejected.append({"id": row["id"], "reason": f"{learner} already has "
                                     f"{RECORDS_PER_LEARNER} records"})
                    continue
                cursor = self.db.execute(
                    "INSERT OR IGNORE INTO records VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (learner, row["id"], row["kind"], row["key"], row["notebook"],
                     int(row["ok"]), row["reason"], row["time"], row["attempt"],
                     row["details"], received))
                stored += cursor.rowcount
                held += cursor.rowcount
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return stored, rejected

    def rows(self):
        """Every record, oldest first (by the learner's time, then by arrival)."""
        cursor = self.db.execute(f"SELECT {', '.join(FIELDS)} FROM records "
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
