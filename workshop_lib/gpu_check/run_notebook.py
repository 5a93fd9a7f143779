"""Execute one notebook with papermill, in a process of its own (``make gpu-check`` runs it
under the notebook's time limit), recording the failing cell's exception as JSON:

    python -m workshop_lib.gpu_check.run_notebook IN.ipynb OUT.ipynb --cwd DIR \\
        --parameters '{"profile": "gpu"}' --cell-timeout 600 --error-json ERR.json

papermill's ``PapermillExecutionError`` carries the cell's ``ename``, ``evalue`` and
index; the check reads them, and the cell's own output, from ERR.json and OUT.ipynb.
"""
import json
import sys

from workshop_lib import cli
from workshop_lib.gpu_check import failures


def main(argv=None):
    parser = cli.ArgumentParser(prog="python -m workshop_lib.gpu_check.run_notebook")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--parameters", default="{}", type=json.loads)
    parser.add_argument("--cell-timeout", type=float, required=True)
    parser.add_argument("--error-json", required=True)
    args = parser.parse_args(argv)
    try:
        import papermill
    except ImportError:
        print("error: papermill is not installed here (`make setup` installs it)",
              file=sys.stderr)
        return 2
    from workshop_lib.kernels import IpcKernelManager  # no TCP port for a NCCL job to take

    try:
        papermill.execute_notebook(args.input, args.output, parameters=args.parameters,
                                   kernel_name="python3", progress_bar=False, cwd=args.cwd,
                                   execution_timeout=args.cell_timeout,
                                   kernel_manager_class=IpcKernelManager)
    except Exception as error:  # the cell's error (or a timeout), recorded for the report
        with open(args.error_json, "w") as f:
            json.dump(failures.exception_info(error), f)
        print(f"error: {failures.describe_exception(error).line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
