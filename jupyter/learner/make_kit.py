"""The learner kit: what a learner's machine or image gets, and nothing of the instructor's.

    make learner-kit KIT=DIR        (python jupyter/learner/make_kit.py DIR)

A learner who has the repository has the assessment's solution on disk, whatever `make lab`
serves: assessment/source/ and the gradebook hold it with the graded run's settings,
tests/assessment_submissions/ holds complete alternative solutions, and the git history
holds every past version of them. The kit is the repository's tracked files (`git
ls-files`) less those INSTRUCTOR_ONLY names, copied from the working tree, without .git:
the notebooks, workshop_lib (the labs' reference solutions included: learners may read
those), the assessment's release, and the set-up (pyproject.toml, environment.yml, the
Makefile, jupyter/, the READMEs, deploy/). Two files are written for it:

- assessment/nbgrader_config.py: only the settings of the instructor's file that nbgrader's
  Validate uses (its time limits), so that a learner's Validate button works as in the
  repository, without the grading guards or anything else of grading;
- LEARNER_KIT.md: what the kit is, the commit it was built from, and where to start.

From the kit alone, `make lab` sets up and serves the learner's workspace, every notebook
runs, `python -m workshop_lib.labs check` judges the exercises, and the assessment's
visible tests run (tests/test_learner_kit.py checks it). The Makefile's instructor targets
(test, instructor, gpu-check, learner-kit) say in the kit that they need the repository.
"""
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What stays with the instructor: a path that is, or lies under, one of these (a folder ends
# in "/") is left out of the kit, unless it lies under one of HANDED_OUT.
INSTRUCTOR_ONLY = {
    "assessment/": "the instructor's kit: the solution and the hidden tests (source/), the "
                   "grading settings, guards and tools, the README that states the graded run",
    "tests/": "the graded submissions (assessment_submissions/) and the tests that read the "
              "solution",
    ".ci/": "the repository's continuous integration",
    "jupyter/learner/make_kit.py": "this builder, which works on the repository",
}
HANDED_OUT = ("assessment/release/",)
# Written into the kit, not copied (see the module's docstring).
KIT_README = "LEARNER_KIT.md"
VALIDATE_CONFIG = "assessment/nbgrader_config.py"
# The configurables nbgrader's Validator reads: itself and the preprocessors it runs
# (nbgrader/validator.py). Everything else in the instructor's settings is for grading.
VALIDATE_SECTIONS = ("Validator", "CheckCellMetadata", "ClearOutput", "Execute")


class KitError(Exception):
    """A reason the kit cannot be built, in one line."""


def under(path, prefix):
    return path.startswith(prefix) if prefix.endswith("/") else path == prefix


def in_kit(path):
    """Whether a repository path (relative, with "/") goes into the learner kit."""
    if any(under(path, kept) for kept in HANDED_OUT):
        return True
    return not any(under(path, left_out) for left_out in INSTRUCTOR_ONLY)


def tracked_files(repo=REPO):
    """The repository's tracked files that exist in the working tree, relative paths."""
    try:
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], check=True,
                                capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise KitError(f"{repo} is not a git checkout ({error}): the kit is made of the "
                       f"repository's tracked files; run this in a clone") from None
    return [path for path in listed.split("\0")
            if path and ((repo / path).is_file() or (repo / path).is_symlink())]


def kit_files(tracked):
    """The paths of the kit, in order: the tracked files less the instructor's."""
    return sorted(path for path in tracked if in_kit(path))


def validate_config(course=REPO / "assessment"):
    """assessment/nbgrader_config.py for the kit: the instructor's VALIDATE_SECTIONS."""
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    lines = ['"""nbgrader\'s settings for the assessment in the learner kit, written by the',
             "instructor's `make learner-kit` from the course's assessment/nbgrader_config.py:",
             'only those that nbgrader\'s Validate uses (its time limits)."""',
             "c = get_config()  # noqa: F821 - nbgrader defines get_config when it loads this "
             "file"]
    for section in VALIDATE_SECTIONS:
        for name, value in sorted(config[section].items()) if section in config else ():
            if type(value) not in (bool, int, float, str, list, tuple, dict, type(None)):
                raise KitError(f"{course / 'nbgrader_config.py'}: c.{section}.{name} = "
                               f"{value!r} cannot be written as a literal into the kit")
            lines.append(f"c.{section}.{name} = {value!r}")
    return "\n".join(lines) + "\n"


def kit_readme(repo=REPO):
    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                              text=True).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no")
    left_out = "\n".join(f"- `{path}`: {why}" for path, why in INSTRUCTOR_ONLY.items())
    return f"""# The learner kit of the DDP workshop

Built by `make learner-kit` from commit {commit}{" with local changes" if changed else ""}.
Everything a learner needs: `make lab` sets up the environment (the first time) and opens
the course in JupyterLab, on a workspace of copies of `notebooks/` and of the assessment
(`workspace/ddp_refactor/`). `README.md` describes the whole course repository; this kit
is that repository without what stays with the instructor:

{left_out}

(the assessment's release, `assessment/release/`, is here.) `make test`, `make instructor`,
`make gpu-check` and `make learner-kit` need the repository and say so here.
"""


def make_kit(kit, repo=REPO):
    """Build the kit in ``kit`` (a new or empty folder); return its files, relative."""
    kit = Path(kit)
    if kit.exists() and (not kit.is_dir() or any(kit.iterdir())):
        raise KitError(f"{kit} exists and is not an empty folder: give a new folder (remove "
                       f"an old kit first)")
    files = kit_files(tracked_files(repo))
    written = {VALIDATE_CONFIG: validate_config(repo / "assessment"), KIT_README: kit_readme(repo)}
    clash = set(files) & set(written)
    if clash:
        raise KitError(f"{', '.join(sorted(clash))}: tracked, and written by the kit builder too")
    for path in files:
        target = kit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        # A link is copied as a link: never the content of what it points to, which may be
        # the instructor's.
        shutil.copy2(repo / path, target, follow_symlinks=False)
    for path, text in written.items():
        (kit / path).parent.mkdir(parents=True, exist_ok=True)
        (kit / path).write_text(text)
    return sorted([*files, *written])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python jupyter/learner/make_kit.py KIT (a new or empty folder)")
    try:
        made = make_kit(sys.argv[1])
    except KitError as error:
        sys.exit(f"make_kit: {error}")
    print(f"{sys.argv[1]}: the learner kit, {len(made)} files; left out: "
          f"{', '.join(INSTRUCTOR_ONLY)} (but {', '.join(HANDED_OUT)}). Learners start "
          f"there with `make lab`.")
