"""The learner's progress: every verdict of the day, recorded where the learner works, and
reported to the class server's progress service where there is one.

The record file
    ``$DDP_WORKSHOP_PROGRESS`` if set, else ``~/.ddp-workshop/progress.jsonl``: one JSON
    object a line, appended, never rewritten (the folder is made 0700, the file 0600)::

        {"id": "<uuid4 hex>", "kind": "exercise" | "assessment" | "survey",
         "key": "<exercise key (labs.EXERCISES)>" | "ddp_refactor" | "survey",
         "notebook": "<the notebook's stem, e.g. 02_from_one_gpu_to_many>",
         "ok": true | false, "reason": "<the verdict's reason: first line, <= 200 chars>",
         "time": "2026-12-02T09:41:07Z" (UTC, seconds),
         "attempt": <1 + the records of the same key before it>,
         "details": {<the verdict's details, JSON-safe (numbers, strings, bools, None,
                     lists and dicts of them; paths as strings; the rest dropped), small>}}

    ``labs.check`` records each verdict; the assessment's result cell the learner's result
    (kind "assessment", key "ddp_refactor": ddp_checks.report, never while nbgrader
    autogrades); ``survey.send_survey`` the closing survey (kind "survey", key "survey", ok
    true, details ``{"ratings": {name: 1..5}, "comments": {name: text}, "ballot": hex}``).
    Readers skip a line that is not a whole JSON object: a write cut short loses that record
    only.

The class server
    Where ``CLASS_PROGRESS_URL`` (the progress service's base URL, which the class server
    sets in every learner's environment) and ``JUPYTERHUB_API_TOKEN`` (the learner's own,
    which their kernels inherit) are both set, every new record is also sent: POST
    ``CLASS_PROGRESS_URL + "api/records"`` with ``Authorization: token
    $JUPYTERHUB_API_TOKEN`` (only to a listener of ``$CLASS_PROGRESS_OWNER``'s or root's
    where that is set: ``listeners``) and the body ``{"records": [record, ...]}``; it answers
    200 ``{"stored": n}`` and keeps one copy of each id. The ids it acknowledged are
    appended to ``<record file>.acked`` (``progress.jsonl.acked``): every record not listed
    there is pending, and goes with the next report (``report_pending``, which every new
    record triggers, or ``python -m workshop_lib.labs progress --send``). A report runs in
    a daemon thread, each request given up after TIMEOUT_S, so a cell never waits for it,
    and a service that is down or slow loses nothing. Without both (a workstation) nothing
    is ever sent.

``record(kind, key, notebook, ok, reason, details=None)`` returns the record or raises;
``record_quietly`` and ``record_verdict(exercise, verdict)`` never raise (one printed line
at worst). Standard library only: the assessment's kernel imports this module too.
"""
import atexit
import json
import math
import numbers
import os
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from workshop_lib import listeners

PATH_ENV = "DDP_WORKSHOP_PROGRESS"
DEFAULT_PATH = "~/.ddp-workshop/progress.jsonl"
URL_ENV = "CLASS_PROGRESS_URL"
TOKEN_ENV = "JUPYTERHUB_API_TOKEN"
OWNER_ENV = "CLASS_PROGRESS_OWNER"  # the service's account, where the class server runs one
KINDS = ("exercise", "assessment", "survey")
TIMEOUT_S = 3.0  # per request to the service: a report gives up after this and retries later
BATCH = 200  # records per request
REASON_CHARS = 200
TEXT_CHARS = 1000  # a string inside details (a survey's comment, say)
ITEMS = 50  # entries of a list or dict inside details
DEPTH = 4
DETAILS_BYTES = 8000  # a record's details as JSON: past it the largest entries are dropped
SURVEY_NOTEBOOK = "08_looking_back"
_DROP = object()


def record_path():
    return Path(os.environ.get(PATH_ENV) or DEFAULT_PATH).expanduser()


def acked_path(path):
    """The ids the class server acknowledged, one a line, next to the record file."""
    return Path(f"{path}.acked")


def _now():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def first_line(text, limit=REASON_CHARS):
    """The first line of ``text``; past ``limit`` characters, cut at a word, with "…"."""
    line = (str(text).strip().splitlines() or [""])[0]
    if len(line) <= limit:
        return line
    head = line[:limit - 1]  # room for the "…"
    cut = head.rsplit(" ", 1)[0] if " " in head else head
    return cut.rstrip(" ,;:") + "…"


def json_safe(value, depth=0):
    """``value`` as JSON holds it (numbers, strings, bools, None, lists and dicts of them;
    a path as its string), cut to size; ``_DROP`` for what JSON cannot hold."""
    if value is None or isinstance(value, (bool, str)):
        return value[:TEXT_CHARS] if isinstance(value, str) else value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else _DROP
    if isinstance(value, os.PathLike):
        return os.fspath(value)[:TEXT_CHARS]
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return json_safe(value.item(), depth)  # a numpy scalar, a 0-d tensor
    if depth >= DEPTH:
        return _DROP
    if isinstance(value, Mapping):
        pairs = ((key, json_safe(item, depth + 1)) for key, item in list(value.items())[:ITEMS]
                 if isinstance(key, (str, int, float)))
        return {str(key): item for key, item in pairs if item is not _DROP}
    if isinstance(value, (list, tuple)):
        items = (json_safe(item, depth + 1) for item in value[:ITEMS])
        return [item for item in items if item is not _DROP]
    return _DROP


def small_details(details):
    """The verdict's details, JSON-safe, its largest entries dropped until it is small."""
    safe = json_safe(details) if isinstance(details, Mapping) else {}
    while safe and len(json.dumps(safe)) > DETAILS_BYTES:
        del safe[max(safe, key=lambda name: len(json.dumps(safe[name])))]
    return safe


def append_lines(path, lines):
    """Append whole lines to ``path`` (made 0600, its new folder 0700), after a newline if
    the file ends in a line cut short: the new lines stay whole."""
    path = Path(path)
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
    data = "".join(line + "\n" for line in lines).encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def records(path=None):
    """Every record in the record file (``path``, else the learner's), oldest first; [] when
    there is none. A line that is not a whole JSON object is skipped."""
    try:
        text = Path(path or record_path()).read_text(errors="replace")
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "key" in entry:
            found.append(entry)
    return found


def record(kind, key, notebook, ok, reason, details=None):
    """Append a record to the learner's record file, start its report to the class server
    (where there is one), and return it. Raises ValueError for an unknown kind, OSError
    when the file cannot be written."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    path = record_path()
    entry = {"id": uuid.uuid4().hex, "kind": kind, "key": str(key),
             "notebook": str(notebook or ""), "ok": bool(ok), "reason": first_line(reason),
             "time": _now(),
             "attempt": 1 + sum(earlier.get("key") == str(key) for earlier in records(path)),
             "details": small_details(details)}
    append_lines(path, [json.dumps(entry)])
    report_pending()
    return entry


def record_quietly(kind, key, notebook, ok, reason, details=None):
    """``record``, but never raising: a record that cannot be written prints one line, and
    whatever called it goes on. The record, or None."""
    try:
        return record(kind, key, notebook, ok, reason, details)
    except Exception as error:  # noqa: BLE001 - recording must never break the learner's cell
        print(f"(your progress was not recorded: {first_line(error) or type(error).__name__})")
        return None


def record_verdict(exercise, verdict):
    """Record what ``labs.check`` found for ``exercise``; never raises."""
    return record_quietly("exercise", exercise.key, exercise.notebook, verdict.ok,
                          verdict.reason, verdict.details)


# -- what the learner sees ------------------------------------------------------------------

def summary(entries):
    """``{key: {"kind", "notebook", "ok", "reason", "time", "attempts", "first_pass"}}``: per
    exercise (and the assessment) its latest verdict and time, how many verdicts it had, and
    the time of its first PASS (None before one), in the order first tried. Surveys are
    not verdicts and are left out."""
    found = {}
    for entry in entries:
        if entry.get("kind") == "survey":
            continue
        key = entry["key"]
        seen = found.setdefault(key, {"attempts": 0, "first_pass": None})
        seen.update(kind=entry.get("kind"), notebook=entry.get("notebook", ""),
                    ok=bool(entry.get("ok")), reason=entry.get("reason", ""),
                    time=entry.get("time"), attempts=seen["attempts"] + 1)
        if seen["ok"] and seen["first_pass"] is None:
            seen["first_pass"] = entry.get("time")
    return found


def progress_line(notebook=None, exercises=None, path=None):
    """One line: the exercises whose latest verdict is PASS, of all the course's; with
    ``notebook`` (a stem) this notebook's too; and the keys whose latest verdict is NOT YET
    (this notebook's, where it has exercises). ``exercises`` is ``{key: notebook stem}`` of
    the whole course (``labs.catalogue()``: this module sits below ``labs`` and does not
    import it); without it, the exercises the records name."""
    latest = summary(records(path))
    if exercises is None:
        exercises = {key: seen["notebook"] for key, seen in latest.items()
                     if seen["kind"] == "exercise"}
    passed = {key for key in exercises if latest.get(key, {}).get("ok")}
    here = [key for key, stem in exercises.items() if stem == notebook] if notebook else []
    parts = [f"this notebook: {len(passed.intersection(here))} of {len(here)}"] if here else []
    not_yet = [key for key in (here or exercises) if key in latest and not latest[key]["ok"]]
    if not_yet:
        parts.append(f"NOT YET: {', '.join(not_yet)}")
    return (f"Your progress: {len(passed)} of {len(exercises)} exercises passed"
            + (f" ({'; '.join(parts)})" if parts else ""))


# -- reporting to the class server ----------------------------------------------------------

def class_server():
    """``(endpoint, token)`` where both variables are set; None on a workstation."""
    url, token = os.environ.get(URL_ENV, "").strip(), os.environ.get(TOKEN_ENV, "").strip()
    return (url.rstrip("/") + "/api/records", token) if url and token else None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect would carry the learner's token elsewhere: it is an error instead."""

    def redirect_request(self, request, fp, code, msg, headers, newurl):
        return None


# No proxy either: the token goes to the class server and nowhere else.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects)


def _acked(path):
    try:
        return set(acked_path(path).read_text(errors="replace").split())
    except FileNotFoundError:
        return set()


def acknowledged(entry_id, path=None):
    """Whether the class server acknowledged the record ``entry_id``."""
    return entry_id in _acked(path or record_path())


def last_error():
    """Why the last report did not reach the class server (None: it did)."""
    return _last_error


def pending(path=None):
    """The records the class server has not acknowledged yet."""
    path = path or record_path()
    acked = _acked(path)
    return [entry for entry in records(path)
            if entry.get("id") not in acked and entry.get("kind") in KINDS]


@dataclass(frozen=True)
class Sent:
    sent: int
    pending: int
    error: str | None = None


def _post(endpoint, token, batch):
    if os.environ.get(OWNER_ENV):  # the token goes to the service's own listener only
        listeners.check(endpoint, os.environ[OWNER_ENV])
    request = urllib.request.Request(
        endpoint, data=json.dumps({"records": batch}).encode(), method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with _OPENER.open(request, timeout=TIMEOUT_S) as response:
        answer = json.loads(response.read(65536) or b"null")
    if not isinstance(answer, dict) or "stored" not in answer:
        raise ValueError(f"the service answered {str(answer)[:80]!r}, not {{'stored': n}}")


def _describe(error):
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return f"cannot reach it: {error.reason}"
    return first_line(error, 120) or type(error).__name__


_send_lock = threading.Lock()  # one send at a time in this process: none sent twice
_last_error = None


def send_pending(path=None):
    """Send every pending record now, waiting for the answers: a ``Sent`` (how many went,
    how many are still pending, why)."""
    global _last_error
    path = path or record_path()
    server = class_server()
    if server is None:
        return Sent(0, len(pending(path)), f"no class server ({URL_ENV} and {TOKEN_ENV} are "
                                           f"not both set)")
    with _send_lock:
        waiting, sent = pending(path), 0
        for start in range(0, len(waiting), BATCH):
            batch = waiting[start:start + BATCH]
            try:
                _post(*server, batch)
            except Exception as error:  # noqa: BLE001 - kept pending, sent with the next report
                _last_error = _describe(error)
                return Sent(sent, len(waiting) - sent, _last_error)
            append_lines(acked_path(path), [entry["id"] for entry in batch])
            sent += len(batch)
        _last_error = None
        return Sent(sent, 0)


_worker_lock = threading.Lock()
_worker = None
_again = None  # a record file whose report was asked for while the worker was busy


def report_pending():
    """Send the pending records in a daemon thread (one at a time: asked while one runs,
    it runs once more after); returns at once. The thread, or None without a class server."""
    global _worker, _again
    if class_server() is None:
        return None
    path = record_path()
    with _worker_lock:
        if _worker is not None:
            _again = path
            return _worker
        _worker = threading.Thread(target=_report, args=(path,), daemon=True,
                                   name="progress-report")
        _worker.start()
        return _worker


def _report(path):
    global _worker, _again
    while True:
        try:
            result = send_pending(path)
        except Exception as error:  # noqa: BLE001 - a thread of the learner's kernel: never raise
            result = Sent(0, 0, _describe(error))
        with _worker_lock:
            if _again is None or result.error:
                _worker, _again = None, None
                return
            path, _again = _again, None


def wait_for_reports(timeout=None):
    """Wait for the report in flight (at most ``timeout`` s); True when none is left."""
    worker = _worker
    if worker is not None:
        worker.join(timeout)
    return _worker is None or not _worker.is_alive()


# A kernel that is shut down right after a verdict (nbgrader's Validate, a papermill run)
# gets the time of one request to send it; what is still unsent then stays pending.
atexit.register(wait_for_reports, TIMEOUT_S)
