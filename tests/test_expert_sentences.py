"""Sentences an expert corrected (teaching round 4): none of them comes back, and each
correction stands, in the notebooks, the assessment and the exercises' messages."""
import nbformat
import pytest

from conftest import REPO

NOTEBOOKS = {path.name: path for path in [*(REPO / "notebooks").glob("*.ipynb"),
                                          REPO / "assessment" / "source" / "ddp_refactor"
                                          / "ddp_refactor.ipynb"]}


def markdown(name):
    notebook = nbformat.read(NOTEBOOKS[name], as_version=4)
    return " ".join(" ".join(cell.source.split()) for cell in notebook.cells
                    if cell.cell_type == "markdown")


def code(relative):
    return " ".join((REPO / relative).read_text().split())


# (where, the wrong words, words of the correction)
CORRECTED = [
    ("02_from_one_gpu_to_many.ipynb", "moves at least `2(N-1)/N",
     "(NVLink SHARP and in-network reduction, where NCCL has them, do better)"),
    ("04_when_things_go_wrong.ipynb", "which rank failed to join",
     "its absence is named by the store's or the rendezvous's timeout"),
    ("04_when_things_go_wrong.ipynb", "non-deterministic cuDNN and NCCL kernels",
     "NCCL's results are the same run to run for the same ranks, sizes and algorithm"),
    ("06_beyond_one_machine.ipynb", "`DistributedSampler(drop_last=True)` does the same",
     "padding with repeats by default"),
    ("ddp_refactor.ipynb", "The global batch is `WORLD_SIZE` times `--batch-size`,",
     "`WORLD_SIZE` x `--batch-size` x `--accumulate`"),
    ("00_welcome.ipynb", "exactly as every later notebook does",
     "`launch.run` in 04, `nodes.run` in 06"),
    ("workshop_lib/labs/worked_example.py", "the throughput floor",
     "(BatchNorm normalises each micro-batch "),
    ("workshop_lib/labs/keeping_accuracy_at_scale.py",
     "At this base \" f\"rate the linear rule's k-times step is too large",
     "The linear rule's run did not hold the target at this base rate"),
]


@pytest.mark.parametrize("where, wrong, right", CORRECTED,
                         ids=[wrong[:30] for _, wrong, _ in CORRECTED])
def test_the_corrected_sentence_is_gone_and_its_correction_stands(where, wrong, right):
    text = markdown(where) if where.endswith(".ipynb") else code(where)
    assert wrong not in text
    assert right in text
