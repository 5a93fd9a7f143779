"""``python -m workshop_lib.launch [--nnodes N] [--nproc-per-node N] -m MODULE [flags]``:
the course's torchrun launcher from a shell (one job, or one agent per "node" on this
machine: ``nodes.py``)."""
import sys

from workshop_lib import cli, launch, nodes
from workshop_lib.errors import exit_cleanly_on_course_error


@exit_cleanly_on_course_error
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "-m" not in argv:
        print("usage: python -m workshop_lib.launch [--nnodes N|MIN:MAX] [--nproc-per-node N] "
              "[--max-restarts R] [--timeout S] -m MODULE [flags]", file=sys.stderr)
        return 2
    split = argv.index("-m")
    parser = cli.ArgumentParser(prog="python -m workshop_lib.launch")
    parser.add_argument("--nproc-per-node", default="auto")
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--master-port", type=int, default=None)
    parser.add_argument("--nnodes", default=None,
                        help="N or MIN:MAX: one torchrun agent per node, all on this machine "
                             "(workshop_lib/nodes.py)")
    args = parser.parse_args(argv[:split])
    if args.nnodes is not None:
        result = nodes.run(argv[split:], args.nnodes, args.nproc_per_node, args.max_restarts,
                           args.timeout, port=args.master_port)
    else:
        result = launch.run(argv[split:], args.nproc_per_node, args.max_restarts, args.timeout,
                     master_port=args.master_port)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
