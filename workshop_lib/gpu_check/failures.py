"""A failed step's own error, in one line, and the lines around it.

From a command's output (the exception a rank raised, not torchrun's ``ChildFailedError``
around it, and not a bare exit status), from an exception (papermill's
``PapermillExecutionError`` carries the failing cell's ``ename`` and ``evalue``; a
``CalledProcessError`` its command's output), and from an executed notebook (the failing
cell's error, and for a ``%%bash`` cell, whose error is only "returned non-zero exit
status", what the cell wrote).
"""
import re
import subprocess
from dataclasses import dataclass, field

TAIL_LINES = 15
LINE_CHARS = 400
# "ValueError: ...", "torch.OutOfMemoryError: ...", "[rank0]: RuntimeError: ...", also
# indented as in torchrun's root-cause summary; a bare "KeyboardInterrupt" too.
EXCEPTION_LINE = re.compile(
    r"^\s*(?:\[(?:default)?rank\d+\]:\s*)?"
    r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Expired|Warning)"
    r"(?::.*)?)$")
COURSE_ERROR_LINE = re.compile(r"^\s*(?:\[(?:default)?rank\d+\]:\s*)?(error: .+)$")
WRAPPERS = ("ChildFailedError", "CalledProcessError")  # name an inner error, not the cause
EXIT_STATUS = re.compile(r"exit status (-?\d+)")


@dataclass
class Failure:
    """``line``: the error itself; ``where``: the command or cell; ``tail``: last lines."""

    line: str
    where: str = ""
    tail: list = field(default_factory=list)

    def as_dict(self):
        return {"line": self.line, "where": self.where, "tail": self.tail}


def _clip(text):
    text = text.strip()
    return text if len(text) <= LINE_CHARS else text[:LINE_CHARS - 3] + "..."


def last_lines(text, n=TAIL_LINES):
    return [line.rstrip() for line in (text or "").splitlines() if line.strip()][-n:]


def error_line(text):
    """The line of ``text`` that says what went wrong: the last exception raised (a wrapper
    such as ``ChildFailedError`` only when nothing else is there; a warning never), else
    the last ``error: ...`` line of a course command, else the last line; None for no
    output."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return None
    found = [m.group(1) for m in map(EXCEPTION_LINE.match, lines) if m]
    found = [line for line in found if not line.split(":")[0].endswith("Warning")]
    causes = [line for line in found if not line.split(":")[0].endswith(WRAPPERS)]
    course = [m.group(1) for m in map(COURSE_ERROR_LINE.match, lines) if m]
    for candidates in (causes, course, found):
        if candidates:
            return _clip(candidates[-1])
    return _clip(lines[-1])


def _text(value):
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


def describe_exception(error):
    """A Failure for an exception raised in this process (or recorded by the notebook
    runner): papermill's cell error, a command's own error, or the exception's line."""
    if getattr(error, "ename", None) is not None:  # PapermillExecutionError
        info = exception_info(error)
        return Failure(_clip(f"{info['ename']}: {info['evalue']}".splitlines()[0]),
                       where=_cell_name(info.get("cell_index"), info.get("exec_count")),
                       tail=[_clip(line) for line in info.get("traceback", [])][-TAIL_LINES:])
    if isinstance(error, subprocess.TimeoutExpired):
        return Failure(f"timed out after {error.timeout:.0f} s", where=_command(error.cmd),
                       tail=last_lines(_text(error.stderr) or _text(error.output)))
    if isinstance(error, subprocess.CalledProcessError):
        output = _text(error.stderr) or _text(error.output)
        line = error_line(output)
        status = f"exited with status {error.returncode}"
        return Failure(f"{line} ({status})" if line else f"the command {status}, with no output",
                       where=_command(error.cmd), tail=last_lines(output))
    message = str(error).strip()
    first = message.splitlines()[0] if message else ""
    return Failure(_clip(f"{type(error).__name__}: {first}" if first else type(error).__name__))


def _command(cmd):
    return _clip(" ".join(map(str, cmd)) if isinstance(cmd, list | tuple) else str(cmd))


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def exception_info(error):
    """The JSON-able facts of an exception, as the notebook runner records them."""
    return {"type": type(error).__name__,
            "ename": getattr(error, "ename", None),
            "evalue": getattr(error, "evalue", None),
            "cell_index": getattr(error, "cell_index", None),
            "exec_count": getattr(error, "exec_count", None),
            "traceback": [ANSI.sub("", line) for line in getattr(error, "traceback", None) or []],
            "message": _clip(next((line for line in str(error).splitlines()
                                   if line.strip().strip("-")), ""))}


def _cell_name(index, exec_count=None):
    if exec_count:
        return f"In [{exec_count}]"
    return "" if index is None else f"cell {index}"


def _source(cell):
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _stream(cell, name):
    return "".join(_text("".join(o["text"]) if isinstance(o.get("text"), list) else o.get("text"))
                   for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == name)


def failing_cell(notebook, info=None):
    """The index of the cell that failed in an executed notebook: the one holding an
    error output, else the code cell whose execution count the exception names, else the
    one papermill marks as still running (a notebook stopped at its time limit), else the
    exception's own cell index; None if none is found.

    The exception's ``cell_index`` counts the cells papermill ran, and papermill inserts
    cells of its own (the injected parameters, an error banner at the top and an anchor
    before the failing cell), so it is the last resort.
    """
    info = info or {}
    cells = notebook.get("cells", [])
    for i, cell in enumerate(cells):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return i
    count = info.get("exec_count")
    for i, cell in enumerate(cells):
        if count is not None and cell.get("cell_type") == "code" \
                and cell.get("execution_count") == count:
            return i
    for i, cell in enumerate(cells):
        if cell.get("metadata", {}).get("papermill", {}).get("status") == "running":
            return i
    index = info.get("cell_index")
    if isinstance(index, int) and 0 <= index < len(cells):
        return index
    return None


def notebook_failure(notebook, info=None, timed_out_s=None):
    """The failing cell's own error from an executed notebook (a dict, as read from its
    JSON) and the runner's record of the exception (``exception_info``), if any.

    A ``%%bash`` cell fails with ``CalledProcessError`` ("returned non-zero exit
    status 1"), which says nothing: its line is the error in what the cell wrote to
    stderr (or stdout, where a cell prints a log's tail), with the exit status after it.
    """
    info = info or {}
    index = failing_cell(notebook, info)
    if index is None:
        if timed_out_s is not None:
            return Failure(f"timed out after {timed_out_s:.0f} s, before any cell ran")
        line = info.get("message") or "the notebook failed, and no cell holds an error"
        return Failure(_clip(f"{info.get('type')}: {line}" if info.get("type") else line))
    cell = notebook["cells"][index]
    source = _source(cell)
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    first = " ".join(lines[:2]) if lines[:1] and lines[0].startswith("%%") else \
        (lines[0] if lines else "")
    count = cell.get("execution_count") or info.get("exec_count")
    where = f"{_cell_name(index, count)}: {_clip(first)[:80]}"
    error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), {})
    stderr, stdout = _stream(cell, "stderr"), _stream(cell, "stdout")
    tail = last_lines(stderr) or last_lines(stdout)
    if info.get("type") and not info.get("ename"):
        # Not a cell's error: papermill's own, such as its per-cell CellTimeoutError (the
        # cell then shows the KeyboardInterrupt that stopped it, which is not the cause).
        return Failure(_clip(f"{info['type']}: {info.get('message', '')}"), where, tail)
    ename = info.get("ename") or error.get("ename")
    evalue = info.get("evalue") or error.get("evalue") or ""
    if timed_out_s is not None and not ename:
        return Failure(f"timed out after {timed_out_s:.0f} s (the step's limit) in this "
                       f"cell", where, tail)
    if ename == "CalledProcessError" or first.startswith("%%bash"):
        status = EXIT_STATUS.search(evalue)
        said = error_line(stderr) or error_line(stdout)
        suffix = f"%%bash cell exited with status {status.group(1) if status else '?'}"
        line = f"{said} ({suffix})" if said else f"the {suffix} and wrote nothing"
        return Failure(_clip(line), where, tail)
    line = f"{ename}: {evalue}".splitlines()[0] if ename else "the cell failed"
    traceback = [ANSI.sub("", t) for t in error.get("traceback", [])]
    return Failure(_clip(line), where, tail or last_lines("\n".join(traceback)))
