"""No code the course runs calls a collective on some ranks only.

A collective inside ``if rank == 0:`` (or its negation) hangs the job until the collective
timeout: the other ranks never make the matching call. Two forms are caught here by reading
the code: a ``dist.<collective>(...)`` call, and a forward through a DDP wrapper (calling
it, or handing it to a function such as ``evaluate``), which after a training step is a
buffer broadcast (tests/test_torch_claims.py counts it). The read covers the library, the
exercises and their references, every ``%%writefile`` script of the notebooks and the
assessment. Notebook 04's two hanging jobs are the only findings: they are the bugs the
learner finds, and finding them is what shows the guard sees both forms.
"""
import ast
import json
import re

from conftest import REPO

COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "all_to_all", "all_to_all_single", "barrier", "broadcast",
               "broadcast_object_list", "gather", "gather_object", "monitored_barrier",
               "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
               "scatter_object_list"}
RANK_ONLY = re.compile(r"rank\w*(\(\))?\s*[!=]=\s*0|\b0\s*[!=]=\s*\w*rank|\bis_rank_?0\b"
                       r"|\bis_main\w*|\bnot\s+[\w.]*rank\w*")
# What makes a DDP wrapper: its constructor, or train_ddp.wrap, which returns one.
WRAPPER_CALLS = {"DDP", "DistributedDataParallel", "wrap"}
# Notebook 04's jobs, with their bug: (script, the line's code).
THE_BUGS = {
    "workshop_lib/labs/files/debugging_stub.py": "dist.all_reduce(sums)",
    "workshop_lib/labs/files/debugging_excerpt.py": "dist.all_reduce(sums)",
    "04_when_things_go_wrong.ipynb: my_debug_job.py": "dist.all_reduce(sums)",
    "workshop_lib/labs/files/eval_debugging_stub.py": "evaluate(model, val_loader)",
    "04_when_things_go_wrong.ipynb: my_debug_eval_job.py": "evaluate(model, val_loader)",
}


def scripts():
    """{name: source} of every Python file the course runs, and every %%writefile script."""
    found = {str(p.relative_to(REPO)): p.read_text()
             for folder in ("workshop_lib", "assessment", "deploy")
             for p in sorted((REPO / folder).rglob("*.py"))}
    for notebook in [*sorted((REPO / "notebooks").glob("*.ipynb")),
                     *sorted((REPO / "assessment").rglob("*.ipynb"))]:
        for cell in json.loads(notebook.read_text())["cells"]:
            source = "".join(cell["source"])
            first = source.split("\n", 1)[0].split()
            if source.startswith("%%writefile ") and first[1].endswith(".py"):
                found[f"{notebook.name}: {first[1]}"] = source.split("\n", 1)[1]
    return found


def wrappers(tree):
    """Names bound to a call of ``WRAPPER_CALLS``: ``model = DDP(...)``."""
    return {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", getattr(node.value.func, "attr", None))
            in WRAPPER_CALLS
            for target in node.targets if isinstance(target, ast.Name)}


def one_sided(source):
    """[code] of each collective, or forward through a DDP wrapper, in a rank-only block:
    the body of an ``if`` whose test names rank 0 (or not rank 0), or its ``else``."""
    tree = ast.parse(source)
    wrapped, found = wrappers(tree), []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and RANK_ONLY.search(ast.unparse(node.test))):
            continue
        for call in (c for stmt in [*node.body, *node.orelse] for c in ast.walk(stmt)
                     if isinstance(c, ast.Call)):
            func = call.func
            collective = isinstance(func, ast.Attribute) and func.attr in COLLECTIVES \
                and ast.unparse(func.value) in {"dist", "torch.distributed"}
            forward = isinstance(func, ast.Name) and func.id in wrapped or any(
                isinstance(arg, ast.Name) and arg.id in wrapped
                for arg in [*call.args, *(k.value for k in call.keywords)])
            if collective or forward:
                found.append(ast.unparse(call))
    return found


def test_the_only_one_sided_collectives_are_notebook_04s_bugs():
    found = {name: calls for name, source in scripts().items()
             if (calls := one_sided(source))}
    assert found == {name: [code] for name, code in THE_BUGS.items()}


def test_the_guard_reads_every_form_of_the_test_and_of_the_call():
    for test in ("rank == 0", "dist.get_rank() == 0", "local_rank != 0", "0 == rank",
                 "is_main_process", "is_rank0", "not rank", "not dist.get_rank()"):
        assert one_sided(f"if {test}:\n    dist.barrier()\n") == ["dist.barrier()"], test
    assert one_sided("if rank == 0:\n    pass\nelse:\n    dist.barrier()\n") == \
        ["dist.barrier()"], "the else of a rank-only block is rank-only too"
    wrapped = "model = DDP(net)\nif rank == 0:\n    {}\n"
    assert one_sided(wrapped.format("model(x)")) == ["model(x)"]
    assert one_sided(wrapped.format("evaluate(model, loader)")) == ["evaluate(model, loader)"]
    assert one_sided(wrapped.format("evaluate(loader, net=model)")) == [
        "evaluate(loader, net=model)"]
    assert one_sided("model = wrap(net, device)\nif is_rank0:\n    model(x)\n") == ["model(x)"]
    assert one_sided(wrapped.format("evaluate(model.module, loader)")) == []
    assert one_sided(wrapped.format("torch.save(model.module.state_dict(), path)")) == []
    assert one_sided("if epoch == 0:\n    dist.barrier()\n") == []
