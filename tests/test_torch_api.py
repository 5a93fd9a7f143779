"""Every ``torch.…`` name the course uses exists in the installed torch.

Code paths that only run on GPUs never run in CI, so a call to an API that this torch
does not have (``torch.nn.SyncBatchNorm.revert_sync_batchnorm`` was one) would first fail
on a learner's GPU machine. This test reads the library, the notebooks' code cells (and
the scripts their ``%%writefile`` cells write) and the assessment's sources with ``ast``,
resolves each import alias (``import torch.distributed as dist``, ``from torch.nn.parallel
import DistributedDataParallel as DDP``, ...), and looks every attribute chain rooted in
torch up in the installed torch, attribute by attribute, importing submodules where an
attribute is one (``torch.distributed.elastic`` is not imported by ``import torch``).
"""
import ast
import importlib
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


def resolves(chain):
    """Whether ``torch.a.b…`` names something in the installed torch."""
    parts = chain.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=2):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:  # a submodule that its package does not import by itself
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            return False
    return True


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
