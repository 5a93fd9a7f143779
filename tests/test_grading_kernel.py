"""The assessment's autograde runs each submission's kernel on private Unix sockets: over
TCP on 127.0.0.1 any local account could subscribe to its IOPub and read every cell it runs
(the hidden tests among them) while a submission is graded. nbgrader_config.py puts
autograde_guard.ExecuteOverPrivateSockets where nbgrader's Execute was; a notebook executed
by it asks its own kernel which transport it speaks."""
import os

import nbformat
import pytest
from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute
from traitlets.config.loader import PyFileConfigLoader

from conftest import REPO
from workshop_lib.kernels import IpcKernelManager

ASSESSMENT = REPO / "assessment"


def configured_autograde():
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ASSESSMENT)).load_config()
    return config.Autograde.autograde_preprocessors


def test_the_config_puts_the_private_kernel_where_nbgraders_execute_was():
    configured = [p.__name__ for p in configured_autograde()]
    default = [p.__name__ for p in Autograde.class_traits()["autograde_preprocessors"].default()]
    assert configured == ["ExecuteOverPrivateSockets" if n == "Execute" else n for n in default]


@pytest.mark.slow
def test_the_grading_kernel_speaks_over_private_unix_sockets(tmp_path):
    [execute] = [p for p in configured_autograde() if issubclass(p, Execute)]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from ipykernel.connect import get_connection_info\n"
        "info = get_connection_info(unpack=True)\n"
        "print(info['transport'], info['ip'])")])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    executor = execute(timeout=120)
    assert executor.kernel_manager_class is IpcKernelManager
    executed, _ = executor.preprocess(notebook, {"metadata": {"path": str(tmp_path)}})
    transport, socket_base = executed.cells[0].outputs[0]["text"].split()
    assert transport == "ipc"
    folder = os.path.dirname(socket_base)
    assert not os.path.exists(folder), "the kernel's private folder goes with the kernel"
