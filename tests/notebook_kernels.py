"""Notebooks executed by the tests in kernels that cannot lose a port race: papermill with
``workshop_lib.kernels.IpcKernelManager`` (its docstring says why: a kernel beside a gloo
job can lose a TCP port it was given, "Kernel died before replying to kernel_info").

Run as a script, it is papermill's command line with this kernel manager (the side-by-side
runs of tests/conftest.py start one such process per notebook):

    python tests/notebook_kernels.py IN.ipynb OUT.ipynb --cwd DIR \\
        --parameters '{"profile": "cpu"}' --execution-timeout 900
"""
import argparse
import json
import sys

from workshop_lib.kernels import IpcKernelManager


def execute(input_path, output_path, parameters, cwd, execution_timeout):
    """``papermill.execute_notebook`` in the python3 kernel, over ipc."""
    import papermill

    papermill.execute_notebook(
        str(input_path), str(output_path), parameters=parameters, kernel_name="python3",
        cwd=str(cwd), execution_timeout=execution_timeout, progress_bar=False,
        kernel_manager_class=IpcKernelManager)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python tests/notebook_kernels.py")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--parameters", default="{}", type=json.loads)
    parser.add_argument("--execution-timeout", type=float, required=True)
    args = parser.parse_args(argv)
    execute(args.input, args.output, args.parameters, args.cwd, args.execution_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
