"""The progress service's parts that need no hub (deploy/classroom/progress/): the records
kept once each and one learner's never another's, bad records refused in one line, the
board's grid, stuck rule, common reasons and survey, and its CSV files. The service itself,
with the hub, the learners' kernels and the instructor's browser: tests/test_classroom.py
(tests/class_progress.py)."""
import csv
import datetime
import io
import sys
import uuid

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "deploy" / "classroom"))
from progress import board, store  # noqa: E402 - the kit's folder is not a package

T0 = datetime.datetime(2026, 12, 2, 9, 0, tzinfo=datetime.UTC)


def record(key="sampler", ok=False, reason="answer every question first", minute=0,
           kind="exercise", notebook="02_from_one_gpu_to_many", attempt=1, details=None,
           record_id=None):
    return {"id": record_id or uuid.uuid4().hex, "kind": kind, "key": key,
            "notebook": notebook, "ok": ok, "reason": reason,
            "time": (T0 + datetime.timedelta(minutes=minute)).isoformat(),
            "attempt": attempt, "details": details or {}}


def survey(ratings, comments=None, minute=60):
    return record(key="survey", kind="survey", ok=True, reason="", notebook="08_closing",
                  minute=minute, details={"ratings": ratings, "comments": comments or {}})


@pytest.fixture
def kept(tmp_path):
    found = store.Store(tmp_path / "progress.sqlite")
    yield found
    found.close()


def test_a_resend_stores_nothing_twice(kept):
    sent = [record(), record(ok=True, reason="all 7 predictions match", minute=1)]
    assert kept.add("learner01", sent) == (2, [])
    assert kept.add("learner01", sent + [record(minute=2)]) == (1, [])
    assert len(kept.rows()) == 3


def test_a_learner_cannot_take_or_overwrite_anothers_record(kept):
    """The same id from another learner is that learner's own record: it neither replaces
    nor blocks the first."""
    mine = record(ok=True, reason="mine")
    assert kept.add("learner01", [mine]) == (1, [])
    assert kept.add("learner02", [{**mine, "ok": False, "reason": "forged"}]) == (1, [])
    rows = {row["learner"]: row for row in kept.rows()}
    assert rows["learner01"]["ok"] is True and rows["learner01"]["reason"] == "mine"
    assert rows["learner02"]["reason"] == "forged"


def test_a_learner_field_in_the_body_is_not_who_wrote_it(kept):
    kept.add("learner01", [{**record(), "learner": "learner02"}])
    assert [row["learner"] for row in kept.rows()] == ["learner01"]


@pytest.mark.parametrize(("change", "words"), [
    ({"id": "../x"}, "32 lower-case hex"),
    ({"kind": "grade"}, "kind must be one of"),
    ({"key": "<script>"}, "key must be letters"),
    ({"ok": "yes"}, "ok must be true or false"),
    ({"time": "yesterday"}, "not an ISO-8601 time"),
    ({"attempt": -1}, "attempt must be a whole number"),
    ({"details": {"x": "y" * 17000}}, "over 16384 bytes"),
    ({"kind": "survey", "details": {"ratings": {"pace": 6}}}, "from 1 to 5"),
    ({"kind": "survey", "details": {"ratings": {"pace": True}}}, "from 1 to 5"),
])
def test_a_bad_record_is_refused_in_one_line_and_the_rest_kept(kept, change, words):
    bad = {**record(), **change}
    stored, rejected = kept.add("learner01", [bad, record()])
    assert stored == 1
    assert len(rejected) == 1 and words in rejected[0]["reason"], rejected
    assert "\n" not in rejected[0]["reason"]


def test_a_body_that_is_not_a_list_is_refused(kept):
    with pytest.raises(store.RecordError, match="records"):
        kept.add("learner01", {"id": "x"})


def test_a_long_reason_is_cut_and_times_are_kept_in_utc(kept):
    late = {**record(reason="x" * 500), "time": "2026-12-02T10:30:00+01:00"}
    kept.add("learner01", [late])
    (row,) = kept.rows()
    assert len(row["reason"]) == store.REASON_CHARS
    assert row["time"] == "2026-12-02T09:30:00.000000+00:00"


def test_a_learner_cannot_fill_the_disk(kept, monkeypatch):
    monkeypatch.setattr(store, "RECORDS_PER_LEARNER", 3)
    stored, rejected = kept.add("learner01", [record() for _ in range(5)])
    assert stored == 3 and len(rejected) == 2 and "already has 3" in rejected[0]["reason"]
    assert kept.add("learner02", [record()]) == (1, [])


def the_board(kept, now_minute=30, **options):
    return board.build(kept.rows(), learners=["learner01", "learner02", "learner03"],
                       now=T0 + datetime.timedelta(minutes=now_minute), **options)


def test_each_cell_is_the_latest_verdict_and_its_count(kept):
    kept.add("learner01", [record(minute=1), record(minute=3, ok=True, reason="all match")])
    kept.add("learner02", [record(key="sgd", notebook="01_sgd_and_batch_size", minute=2)])
    shown = the_board(kept)
    assert shown["learners"] == ["learner01", "learner02", "learner03"]
    assert [e["key"] for e in shown["exercises"]] == ["sgd", "sampler"]  # the course's order
    assert shown["cells"]["learner01"]["sampler"] == {
        "ok": True, "attempts": 2, "reason": "all match", "passed": True,
        "time": "2026-12-02T09:03:00.000000+00:00"}
    assert shown["cells"]["learner02"]["sgd"]["ok"] is False
    assert "learner03" not in shown["cells"]


def test_stuck_after_three_not_yet_in_a_row_and_not_after_a_pass(kept):
    kept.add("learner01", [record(minute=m) for m in (1, 2, 3)])
    kept.add("learner02", [record(minute=1), record(minute=2),
                           record(minute=3, ok=True, reason="ok"), record(minute=29)])
    stuck = {e["learner"]: e["why"] for e in the_board(kept, now_minute=5)["stuck"]}
    assert stuck == {"learner01": ["NOT YET 3 times in a row on sampler"]}


def test_stuck_when_quiet_since_a_not_yet(kept):
    kept.add("learner01", [record(minute=0, ok=True, reason="ok"),
                           record(key="conversion", minute=5)])
    kept.add("learner02", [record(minute=5, ok=True, reason="ok")])  # quiet after a PASS
    shown = the_board(kept, now_minute=16)
    assert shown["stuck"] == [{"learner": "learner01", "why": [
        "no verdict for 11 min since NOT YET on conversion (02_from_one_gpu_to_many)"]}]
    assert the_board(kept, now_minute=14)["stuck"] == []
    assert the_board(kept, now_minute=14, quiet_minutes=5)["stuck"][0]["learner"] == \
        "learner01"
    assert shown["thresholds"] == {"stuck_after": 3, "quiet_minutes": 10}


def test_the_most_common_reasons_count_learners_with_particulars_folded(kept):
    off = "1 of 7 predictions were off: padding_samples: you said {}, the sampler gives 2"
    kept.add("learner01", [record(reason=off.format(1), minute=1),
                           record(reason=off.format(3), minute=2)])
    kept.add("learner02", [record(reason=off.format(0), minute=1)])
    kept.add("learner03", [record(reason="answer every question first: shard_size", minute=1),
                           record(reason="answer every question first: shard_size", minute=2),
                           record(reason="answer every question first: shard_size", minute=3)])
    reasons = the_board(kept)["reasons"]["sampler"]
    assert [(r["learners"], r["times"]) for r in reasons] == [(2, 3), (1, 3)]
    assert reasons[0]["reason"] == off.format(3)  # the latest one said
    assert board.fold(off.format(1)) == board.fold(off.format(12))


def test_the_survey_counts_each_learners_latest_answers(kept):
    kept.add("learner01", [survey({"pace": 2, "labs": 5}, {"liked": "the hang"}, minute=50),
                           survey({"pace": 4, "labs": 5}, {"liked": "the hang lab"})])
    kept.add("learner02", [survey({"pace": 3}, {"liked": "  ", "missed": "GPUs"})])
    result = the_board(kept)["survey"]
    assert result["answered"] == 2 and result["learners"] == ["learner01", "learner02"]
    assert result["ratings"]["pace"] == {"count": 2, "mean": 3.5, "distribution": {
        "1": 0, "2": 0, "3": 1, "4": 1, "5": 0}}
    assert result["ratings"]["labs"]["count"] == 1
    assert result["comments"] == {"liked": [{"learner": "learner01", "text": "the hang lab"}],
                                  "missed": [{"learner": "learner02", "text": "GPUs"}]}
    assert "survey" not in [e["key"] for e in the_board(kept)["exercises"]]


def test_an_anonymous_survey_never_says_who_answered_what(kept):
    kept.add("learner02", [survey({"pace": 5}, {"liked": "zebra"})])
    kept.add("learner01", [survey({"pace": 1}, {"liked": "aardvark"})])
    shown = the_board(kept, anonymous=True)
    assert shown["survey"]["comments"] == {"liked": ["aardvark", "zebra"]}
    assert shown["survey"]["learners"] == []
    assert "learner0" not in str(shown["survey"])
    text = board.survey_csv(kept.rows(), anonymous=True)
    assert "learner0" not in text
    assert list(csv.reader(io.StringIO(text))) == [["pace", "liked"], ["1", "aardvark"],
                                                   ["5", "zebra"]]
    named = list(csv.DictReader(io.StringIO(board.survey_csv(kept.rows(), anonymous=False))))
    assert {row["learner"]: row["pace"] for row in named} == {"learner01": "1",
                                                               "learner02": "5"}


def test_board_csv_has_a_line_per_learner_and_exercise(kept):
    kept.add("learner01", [record(minute=m) for m in (1, 2, 3)])
    kept.add("learner02", [record(minute=1, ok=True, reason="=HYPERLINK(\"x\")")])
    rows = list(csv.DictReader(io.StringIO(board.grid_csv(the_board(kept, now_minute=4)))))
    assert [(r["learner"], r["exercise"], r["latest"], r["attempts"], r["stuck"])
            for r in rows] == [("learner01", "sampler", "NOT YET", "3", "yes"),
                               ("learner02", "sampler", "PASS", "1", "no")]
    # A learner's words never reach a spreadsheet as a formula.
    assert rows[1]["reason"] == "'=HYPERLINK(\"x\")"


def test_the_records_workshop_lib_writes_are_all_taken(kept, tmp_path, monkeypatch):
    """The learner's side (workshop_lib.progress) and this service agree on the record."""
    from workshop_lib import progress

    monkeypatch.setenv(progress.PATH_ENV, str(tmp_path / "progress.jsonl"))
    monkeypatch.delenv(progress.URL_ENV, raising=False)
    progress.record("exercise", "sampler", "02_from_one_gpu_to_many", False,
                    "2 of 7 predictions were off\nsecond line", {"wrong": ["a", "b"],
                                                                 "path": tmp_path, "x": 1.5})
    progress.record("assessment", "ddp_refactor", "ddp_refactor", True, "all requirements")
    progress.record("survey", "survey", progress.SURVEY_NOTEBOOK, True, "2 rating(s)",
                    {"ratings": {"overall": 4, "pace": 3}, "comments": {"change": "more 03"}})
    written = progress.records()
    assert kept.add("learner01", written) == (3, [])
    assert kept.add("learner01", progress.pending()) == (0, [])
