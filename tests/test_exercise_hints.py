"""Notebook 02's conversion exercise names every step its reference answer takes on GPUs.

A learner on a GPU machine who follows the hints must not miss a GPU-only step: without
``torch.device("cuda", LOCAL_RANK)``, ``torch.cuda.set_device`` and ``device_ids`` every
rank lands on GPU 0 and NCCL refuses the job, a failure a CPU machine never shows. The
steps are read from the answer (``labs/files/conversion_solution.py``): what it does under
``if torch.cuda.is_available():`` and the GPU-only arguments of its DDP wrap.
"""
import ast
import json

from conftest import REPO

SOLUTION = REPO / "workshop_lib/labs/files/conversion_solution.py"
NOTEBOOK = REPO / "notebooks/02_from_one_gpu_to_many.ipynb"


def gpu_only_steps():
    """The calls the answer makes only on GPUs, as ``ast.unparse`` writes their function
    (``torch.device``, ``torch.cuda.set_device``, ...), and the DDP keywords it passes
    only for GPUs (``device_ids``)."""
    steps = set()
    for node in ast.walk(ast.parse(SOLUTION.read_text())):
        if isinstance(node, ast.If) and "cuda.is_available" in ast.unparse(node.test):
            steps |= {ast.unparse(n.func) for statement in node.body
                      for n in ast.walk(statement) if isinstance(n, ast.Call)}
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "DDP":
            steps |= {k.arg for k in node.keywords if "cuda" in ast.unparse(k.value)}
    return steps


def exercise_hints():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    [intro] = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
               and "".join(c["source"]).startswith("## 1 · Exercise: make it a DDP job")]
    return intro


def test_the_hints_name_every_gpu_only_step_of_the_answer():
    steps = gpu_only_steps()
    assert {"torch.device", "torch.cuda.set_device", "device_ids"} <= steps
    hints = exercise_hints()
    # The answer calls dist.init_process_group; the hints name it without the alias.
    missing = [s for s in steps if s not in hints and s.removeprefix("dist.") not in hints]
    assert not missing, f"notebook 02's exercise hints never mention {missing}"
    assert 'torch.device("cuda", local_rank)' in hints  # the device is the local rank's
