"""The check's report: ``report.json`` and ``report.md``, one row per step.

Each step: ``pass``, ``fail`` (with its own error line) or ``skipped`` (with the reason),
its seconds against its time limit (and, for ``make gpu-check``, against its budget), and
its key figures. Then, per failed step, the command or cell and the last lines it wrote.
"""
import json
import time
from dataclasses import asdict, dataclass, field

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"


@dataclass
class Outcome:
    name: str
    status: str
    reason: str = ""     # fail: the error's own line; skipped: why; pass: a note, if any
    seconds: float = 0.0
    limit_s: float | None = None
    budget_s: float | None = None   # make gpu-check: the estimate the step is held to
    figures: list = field(default_factory=list)   # "what: value" lines
    values: dict = field(default_factory=dict)    # the same figures as numbers, for JSON
    where: str = ""      # the command, or the notebook cell, that failed
    tail: list = field(default_factory=list)      # its last output lines
    logs: list = field(default_factory=list)      # files holding its whole output


def result_text(outcome):
    if outcome.status == PASS:
        return "pass" + (f" ({outcome.reason})" if outcome.reason else "")
    label = "FAIL" if outcome.status == FAIL else "skipped"
    return f"{label}: {outcome.reason}" if outcome.reason else label


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _seconds(value):
    return "" if value is None else f"{value:.0f}"


def build(title, machine, outcomes, wall_s, notes=(), totals=()):
    """The report as a dict (what report.json holds)."""
    return {"title": title, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": list(machine), "notes": list(notes), "totals": list(totals),
            "wall_s": wall_s, "ok": all(o.status != FAIL for o in outcomes),
            "counts": {s: sum(o.status == s for o in outcomes) for s in (PASS, FAIL, SKIPPED)},
            "steps": [asdict(o) for o in outcomes]}


def markdown(report):
    with_budget = any(s["budget_s"] is not None for s in report["steps"])
    head = "| step | result | seconds | limit s |" + (" budget s |" if with_budget else "")
    rule = "|---|---|---:|---:|" + ("---:|" if with_budget else "")
    lines = [f"# {report['title']}", "", report["date"], "", "## Machine", "",
             *[f"- {line}" for line in report["machine"]], ""]
    if report["notes"]:
        lines += ["## Notes", "", *[f"- {note}" for note in report["notes"]], ""]
    counts = report["counts"]
    lines += ["## Steps", "",
              f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped; "
              f"{report['wall_s']:.0f} s in all.", "", head, rule]
    for s in report["steps"]:
        row = (f"| {_cell(s['name'])} | {_cell(result_text(Outcome(**s)))} | "
               f"{s['seconds']:.1f} | {_seconds(s['limit_s'])} |")
        lines.append(row + (f" {_seconds(s['budget_s'])} |" if with_budget else ""))
    lines.append("")
    lines += [*report["totals"], ""] if report["totals"] else []
    figures = [s for s in report["steps"] if s["figures"]]
    if figures:
        lines += ["## Key figures", ""]
        for s in figures:
            lines += [f"### {s['name']}", "", *[f"- {f}" for f in s["figures"]], ""]
    failed = [s for s in report["steps"] if s["status"] == FAIL]
    if failed:
        lines += ["## Failures", ""]
        for s in failed:
            lines += [f"### {s['name']}", "", f"{s['reason']}", ""]
            if s["where"]:
                lines += [f"in: `{s['where']}`", ""]
            if s["tail"]:
                lines += ["```", *s["tail"], "```", ""]
            if s["logs"]:
                lines += ["whole output: " + ", ".join(s["logs"]), ""]
    return "\n".join(lines)


def write(out, report):
    """Write report.json and report.md in ``out``; return the Markdown."""
    text = markdown(report)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(text)
    return text
