"""``python -m workshop_lib doctor``: check this machine before the workshop starts."""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["doctor"]:
        print("usage: python -m workshop_lib doctor [--data-dir DIR]", file=sys.stderr)
        return 2
    from workshop_lib import doctor

    return doctor.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
