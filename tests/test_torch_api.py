"""Every ``torch.…`` name the course uses exists in the installed torch.

Code paths that only run on GPUs never run in CI, so a call to an API that this torch
does not have (``torch.nn.SyncBatchNorm.revert_sync_batchnorm`` was one) would first fail
on a learner's GPU machine. This test reads the library, the notebooks' code cells (and
the scripts their ``%%writefile`` cells write) and the assessment's sources with ``ast``,
resolves each import alias (``import torch.distributed as dist``, ``from torch.nn.parallel
import DistributedDataParallel as DDP``, ...), and looks every attribute chain rooted in
torch up in the installed torch, attribute by attribute, importing submodules where an
attribute is one (``torch.distributed.elastic`` is not imported by ``import torch``).

A name is not enough: ``DDP(model, forward_sync_buffers=False)`` resolves on every torch
and raises a TypeError before 2.13. So every keyword argument the course passes to a torch
callable is looked up in the installed signature too (for functions written in C, the
signature their docstring documents). A keyword that differs between the torch versions
the course supports is chosen at run time from the installed signature
(``workshop_lib.ddp_compat``), never written into a call.
"""
import ast
import importlib
import inspect
import json
import re

import pytest

from conftest import REPO

# Chains that exist only at run time, each with the reason: {chain: why}. None so far;
# an entry must be used and must not resolve here (test_the_allowlist_stays_needed).
ALLOWED_DYNAMIC = {}

MAGIC = re.compile(r"^\s*[%!]")  # IPython line magics and shell escapes: not Python


def python_sources():
    """``(where, source)`` for every piece of Python the course ships."""
    for path in sorted((REPO / "workshop_lib").rglob("*.py")):
        yield str(path.relative_to(REPO)), path.read_text()
    for path in sorted((REPO / "assessment/source").rglob("*.py")):
        yield str(path.relative_to(REPO)), path.read_text()
    notebooks = [*sorted((REPO / "notebooks").glob("*.ipynb")),
                 *sorted((REPO / "assessment/source").rglob("*.ipynb"))]
    for path in notebooks:
        where = str(path.relative_to(REPO))
        kernel = []  # the cells the kernel runs share one namespace: one module
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            if source.startswith("%%writefile ") and source.split()[1].endswith(".py"):
                first, body = source.split("\n", 1)
                yield f"{where}: {first}", body
            elif source and not source.startswith("%%"):
                kernel.append("\n".join("" if MAGIC.match(line) else line
                                        for line in source.splitlines()))
        yield where, "\n".join(kernel)


def torch_aliases(tree):
    """Names bound to torch or anything under it: ``{"dist": "torch.distributed", ...}``,
    and the chains the imports themselves name."""
    aliases, imported = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                if name.name.split(".")[0] == "torch":
                    imported.append(name.name)
                    if name.asname:
                        aliases[name.asname] = name.name
                    else:
                        aliases["torch"] = "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "torch":
            for name in node.names:
                if name.name != "*":
                    chain = f"{node.module}.{name.name}"
                    imported.append(chain)
                    aliases[name.asname or name.name] = chain
    return aliases, imported


def attribute_chains(tree, aliases):
    """Each outermost ``alias.a.b…`` chain, expanded to its full torch name."""
    chains = []

    def dotted(node):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in aliases:
            return ".".join([aliases[node.id], *reversed(parts)])
        return None

    def visit(node, inside_chain=False):
        if isinstance(node, ast.Attribute) and not inside_chain:
            chain = dotted(node)
            if chain:
                chains.append(chain)
        for child in ast.iter_child_nodes(node):
            visit(child, inside_chain=isinstance(node, ast.Attribute)
                  and isinstance(child, ast.Attribute) and child is node.value)

    visit(tree)
    return chains


MISSING = object()


def lookup(chain):
    """What ``torch.a.b…`` names in the installed torch, or MISSING."""
    parts = chain.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=2):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:  # a submodule that its package does not import by itself
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            return MISSING
    return obj


def resolves(chain):
    """Whether ``torch.a.b…`` names something in the installed torch."""
    return lookup(chain) is not MISSING


def used_chains():
    """``{chain: [where it is used]}`` over every source."""
    used = {}
    for where, source in python_sources():
        tree = ast.parse(source)
        aliases, imported = torch_aliases(tree)
        for chain in imported + attribute_chains(tree, aliases):
            used.setdefault(chain, []).append(where)
    return used


def test_every_torch_name_the_course_uses_exists_in_the_installed_torch():
    used = used_chains()
    missing = {chain: sorted(set(places)) for chain, places in used.items()
               if chain not in ALLOWED_DYNAMIC and not resolves(chain)}
    assert not missing, "not in the installed torch:\n" + "\n".join(
        f"  {chain}  ({', '.join(places)})" for chain, places in sorted(missing.items()))


def test_the_reader_sees_the_course_through_its_aliases():
    """The chains come through every import form the course uses (else the test above
    would pass by reading nothing)."""
    used = used_chains()
    for chain in ("torch.distributed.all_reduce",       # import torch.distributed as dist
                  "torch.nn.functional.cross_entropy",  # import torch.nn.functional as F
                  "torch.nn.parallel.DistributedDataParallel",  # from ... import ... as DDP
                  "torch.cuda.set_device",              # import torch
                  "torch.nn.SyncBatchNorm.convert_sync_batchnorm"):
        assert chain in used, chain
    assert len(used) > 100
    assert any(where.startswith("notebooks/") for places in used.values() for where in places)
    assert any("%%writefile" in where for places in used.values() for where in places)
    assert any(where.startswith("assessment/") for places in used.values() for where in places)


@pytest.mark.parametrize("source, chain", [
    ("import torch\ntorch.nn.SyncBatchNorm.revert_sync_batchnorm(m)",
     "torch.nn.SyncBatchNorm.revert_sync_batchnorm"),
    ("import torch.distributed as dist\ndist.all_reduce_everything(t)",
     "torch.distributed.all_reduce_everything"),
    ("from torch.nn.parallel import DistributedDataParallel as DDP\nDDP.no_such_thing",
     "torch.nn.parallel.DistributedDataParallel.no_such_thing"),
    ("from torch.cuda import no_such_function", "torch.cuda.no_such_function"),
])
def test_a_name_torch_does_not_have_is_caught(source, chain):
    tree = ast.parse(source)
    aliases, imported = torch_aliases(tree)
    assert chain in imported + attribute_chains(tree, aliases)
    assert not resolves(chain)


def test_submodules_that_torch_does_not_import_by_itself_resolve():
    assert resolves("torch.distributed.elastic.multiprocessing.errors.record")
    assert resolves("torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook")
    assert resolves("torch.nn.SyncBatchNorm.convert_sync_batchnorm")


def test_the_allowlist_stays_needed():
    used = used_chains()
    stale = [chain for chain in ALLOWED_DYNAMIC if chain not in used or resolves(chain)]
    assert not stale, f"allowlisted chains no longer needed: {stale}"


def keyword_calls(tree, aliases):
    """``(chain, keyword, line)`` for each keyword argument of a call to a torch callable
    (``**options`` passes no name to check: it is left out)."""
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        parts, func = [], node.func
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if isinstance(func, ast.Name) and func.id in aliases:
            chain = ".".join([aliases[func.id], *reversed(parts)])
            calls += [(chain, k.arg, node.lineno) for k in node.keywords if k.arg]
    return calls


DOCUMENTED_PARAMETER = re.compile(r"^[\\*\s]*(\w+)")


def documented_keywords(obj):
    """The parameters a C function's docstring documents (``zeros(*size, *, out=None,
    dtype=None, ...) -> Tensor``, one line per overload), or None if it documents none."""
    name = getattr(obj, "__name__", "")
    headers = [line.strip() for line in (obj.__doc__ or "").splitlines()
               if line.strip().startswith(f"{name}(") and ")" in line]
    names = set()
    for header in headers:
        inside = header[len(name) + 1:header.rindex(")")]
        names |= {m.group(1) for part in inside.split(",")
                  if (m := DOCUMENTED_PARAMETER.match(part))}
    return names or None


def accepted_keywords(obj):
    """The keyword names ``obj`` takes; ANY where it takes ``**kwargs``; None if unknown."""
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # written in C: no signature object
        return documented_keywords(obj)
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return ANY
    return {p.name for p in parameters if p.kind is not p.POSITIONAL_ONLY}


ANY = object()


def unknown_keywords(source, where="<probe>"):
    """``(chain, keyword, where:line)`` for each keyword the installed signature lacks, and
    the calls checked."""
    tree = ast.parse(source)
    aliases, _ = torch_aliases(tree)
    unknown, checked = [], []
    for chain, keyword, line in keyword_calls(tree, aliases):
        obj = lookup(chain)
        if obj is MISSING:  # the name test above reports it
            continue
        accepted = accepted_keywords(obj)
        if accepted is None:
            raise AssertionError(f"{chain} ({where}:{line}) has neither a signature nor a "
                                 f"documented one: teach accepted_keywords to read it")
        checked.append((chain, keyword))
        if accepted is not ANY and keyword not in accepted:
            unknown.append((chain, keyword, f"{where}:{line}"))
    return unknown, checked


def test_every_keyword_the_course_passes_to_torch_is_in_the_installed_signature():
    unknown, checked = [], []
    for where, source in python_sources():
        found, calls = unknown_keywords(source, where)
        unknown += found
        checked += calls
    assert not unknown, f"keyword arguments torch {torch_version()} does not take:\n" + \
        "\n".join(f"  {chain}(..., {keyword}=...)  ({where})"
                   for chain, keyword, where in unknown)
    # The reader sees keywords of Python callables, classes and C functions alike.
    assert {("torch.nn.parallel.DistributedDataParallel", "device_ids"),
            ("torch.distributed.all_reduce", "op"), ("torch.zeros", "device"),
            ("torch.utils.data.DataLoader", "num_workers")} <= set(checked)


def torch_version():
    import torch

    return torch.__version__


@pytest.mark.parametrize("source, planted", [
    # DDP's 2.13 keyword in a call, as the course once wrote it, with a name no torch has
    ("from torch.nn.parallel import DistributedDataParallel as DDP\n"
     "DDP(model, device_ids=None, forward_sync_bufers=False)",
     ("torch.nn.parallel.DistributedDataParallel", "forward_sync_bufers")),
    ("import torch.distributed as dist\ndist.all_reduce(t, asynch_op=True)",
     ("torch.distributed.all_reduce", "asynch_op")),
    ("import torch\ntorch.zeros((), devise='cpu')", ("torch.zeros", "devise")),  # C function
    ("import torch.nn as nn\nnn.Conv2d(3, 8, 3, padding=1, bais=False)",
     ("torch.nn.Conv2d", "bais")),
])
def test_a_keyword_torch_does_not_take_is_caught(source, planted):
    unknown, checked = unknown_keywords(source)
    assert [(chain, keyword) for chain, keyword, _ in unknown] == [planted]
    assert len(checked) >= 1


def test_the_ddp_buffer_option_follows_the_installed_signature(monkeypatch):
    """torch 2.11 and 2.12 take ``broadcast_buffers`` only; 2.13 and newer take
    ``forward_sync_buffers`` (and warn on the old name)."""
    from workshop_lib import ddp_compat

    keywords = ddp_compat.ddp_keywords()
    expected = "forward_sync_buffers" if "forward_sync_buffers" in keywords \
        else "broadcast_buffers"
    assert ddp_compat.buffer_sync(False) == {expected: False}
    assert ddp_compat.options(forward_sync_buffers=True, static_graph=True) == \
        {expected: True, "static_graph": True}
    older = keywords - {"forward_sync_buffers"} | {"broadcast_buffers"}
    monkeypatch.setattr(ddp_compat, "ddp_keywords", lambda: older)
    assert ddp_compat.buffer_sync(False) == {"broadcast_buffers": False}
    assert ddp_compat.options(forward_sync_buffers=False, bucket_cap_mb=1) == \
        {"broadcast_buffers": False, "bucket_cap_mb": 1}
