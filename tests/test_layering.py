"""The package's layers, read from every import statement, those inside functions too.

The ground (the parts a training run is made of) and the two training scripts never import
anything above them: the launchers, the measurements, the demos, the notebooks' helpers.
And no module imports itself back through others: a circle makes the order of imports
decide what works, and it hides a demo inside a training part. An import-time probe would
miss both when the import sits inside a function, so this test reads the source.
"""
import ast

import pytest

from conftest import REPO

PACKAGE = REPO / "workshop_lib"

# What a training run is made of. Everything else in the package stands above these.
GROUND = {"errors", "files", "gloo_exit", "hardware", "distributed", "models", "optim",
          "scaling", "precision", "memory", "metrics", "checkpoint", "faults", "runlog",
          "data", "shards", "cli", "ddp_compat",
          # the measuring tools, in their own low room: every timer and cost model uses them
          "stopwatch", "allreduce_model"}
TRAINING = {"train", "train_ddp"}


def module_name(path):
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(name):
    """The module (or package) a dotted ``workshop_lib...`` name refers to."""
    while name and not ((REPO / (name.replace(".", "/") + ".py")).is_file()
                        or (REPO / name.replace(".", "/") / "__init__.py").is_file()):
        name = name.rpartition(".")[0]
    return name


def imports_of(path, source=None):
    """Every workshop_lib module ``path`` imports, at any depth of the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {resolve(n) for n in names if n.startswith("workshop_lib")}
    return found - {me, ""}


def graph():
    sources = [p for p in PACKAGE.rglob("*.py") if "files" not in p.relative_to(PACKAGE).parts]
    return {module_name(p): imports_of(p) for p in sources}


def short(name):
    return name.removeprefix("workshop_lib.").split(".")[0]


@pytest.mark.parametrize("layer", ["ground", "training"])
def test_the_ground_and_the_training_scripts_import_nothing_above_them(layer):
    members = GROUND if layer == "ground" else TRAINING
    wrong = sorted(f"{module} imports {dep}" for module, deps in graph().items()
                   if short(module) in members and module != "workshop_lib"
                   for dep in deps if dep != "workshop_lib" and short(dep) not in GROUND)
    assert not wrong, "; ".join(wrong)


def test_no_module_imports_itself_back_through_others():
    edges = {m: {d for d in deps
                 # a package's __init__ gathering its own modules is not a way back up
                 if not (d.startswith(m + ".") and m != "workshop_lib")}
             for m, deps in graph().items()}
    done, circles = set(), []

    def visit(node, path):
        if node in path:
            circles.append(" -> ".join([*path[path.index(node):], node]))
            return
        if node in done:
            return
        for dep in sorted(edges.get(node, ())):
            if dep != "workshop_lib":
                visit(dep, [*path, node])
        done.add(node)

    for module in sorted(edges):
        visit(module, [])
    assert not circles, "import circles: " + "; ".join(sorted(set(circles))[:10])


def test_the_reader_sees_imports_inside_functions_and_relative_ones():
    source = "def f():\n    from workshop_lib import bench\n    from . import findings\n"
    assert imports_of(PACKAGE / "data.py", source) == {"workshop_lib.bench",
                                                        "workshop_lib.findings"}


def test_every_timer_reads_the_clock_through_the_stopwatch():
    """A function that synchronises a device and reads the clock itself is a timer written
    again: the bench, the trace and notebook 07 once had four, and they drifted."""
    written_again = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "stopwatch.py" or "files" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = {getattr(c.func, "attr", getattr(c.func, "id", None))
                     for c in ast.walk(node) if isinstance(c, ast.Call)}
            if {"perf_counter", "synchronize"} <= calls:
                written_again.append(f"{path.relative_to(REPO)}:{node.name}")
    assert not written_again, "use stopwatch.Stopwatch: " + ", ".join(written_again)
