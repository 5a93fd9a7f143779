"""`classroom.py env`: the class environment, DIR/env (Debian's Python holding the course
environment's packages as hard links, workshop_lib as a copy, and JupyterHub's pins), and
configurable-http-proxy in DIR/proxy.
"""
import json
import re
import shutil
from pathlib import Path

import tomllib
from kit import KIT, REPO, KitError, ensure_reachable, run

DEFAULT_PYTHON = "/usr/bin/python3.11"
# Entries of the course environment that the class environment makes its own: the
# development-mode install of workshop_lib points into the repository, which learners'
# accounts may not be able to read.
NOT_LINKED = re.compile(r"^(__editable__.*|workshop_lib-.*\.dist-info|__pycache__)$")
# Run by the class environment's Python: the installed distributions whose Requires-Python
# excludes it.
UNSUPPORTED_DISTRIBUTIONS = """
import importlib.metadata, sys
from packaging.specifiers import SpecifierSet
version = "%d.%d.%d" % sys.version_info[:3]
for dist in importlib.metadata.distributions():
    needs = dist.metadata.get("Requires-Python")
    if needs and not SpecifierSet(needs).contains(version, prereleases=True):
        print(dist.metadata["Name"])
"""


def classroom_pins():
    """The exact versions of JupyterHub and its parts: pyproject.toml's `classroom` group."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    return project["project"]["optional-dependencies"]["classroom"]


def python_version(python):
    return run(python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").strip()


def link_tree(source, target):
    """``target`` as a copy of ``source`` made of hard links (no space, instant); a copy
    where they are on different file systems."""
    if target.exists():
        shutil.rmtree(target)
    try:
        run("cp", "-a", "--link", source, target)
    except KitError:
        shutil.rmtree(target, ignore_errors=True)
        run("cp", "-a", source, target)


def rewrite_script(source, target, old_bins, new_python):
    """A console script of the course environment (its first line runs a Python of one of
    ``old_bins``), for the class environment's Python; False for any other file. Written
    as a new file: ``source`` may share its inode with the course's."""
    data = source.read_bytes()
    first, _, rest = data.partition(b"\n")
    interpreter = first[2:].decode(errors="replace").strip()
    if first.startswith(b"#!") and str(Path(interpreter).parent) in old_bins \
            and Path(interpreter).name.startswith("python"):
        target.write_bytes(b"#!" + str(new_python).encode() + b"\n" + rest)
        target.chmod(0o755)
        return True
    return False


def build_env(state, course_env, python):
    """DIR/env: a virtual environment of ``python`` (Debian's, readable by every account)
    holding the course environment's packages as hard links, workshop_lib as a plain copy,
    and the classroom pins installed with pip."""
    given_bin = str(Path(course_env).absolute() / "bin")
    course_env = Path(course_env).resolve()
    if not (course_env / "pyvenv.cfg").exists():
        raise KitError(f"{course_env} is not the course's environment: run `make setup` first")
    if not Path(python).exists():
        raise KitError(f"{python} not found: apt-get install python3.11 (the class "
                       f"environment needs a Python that every account can run)")
    course_python = course_env / "bin" / "python"
    version = python_version(course_python)
    if python_version(python) != version:
        raise KitError(f"{python} is Python {python_version(python)}, the course environment "
                       f"{version}: pass --python with a Python {version} outside /root")
    env = state / "env"
    site = f"lib/python{version}/site-packages"
    # Built again only when the course environment, the pins or the Python change.
    built_from = json.dumps({"course_env": str(course_env), "python": str(python),
                             "packages": sorted(p.name for p in (course_env / site).iterdir()),
                             "pins": classroom_pins()})
    stamp = env / ".built-from"
    if stamp.exists() and stamp.read_text() == built_from:
        return None
    if env.exists():
        shutil.rmtree(env)
    run(python, "-m", "venv", "--without-pip", env)
    for entry in sorted((course_env / site).iterdir()):
        if not NOT_LINKED.match(entry.name):
            link_tree(entry, env / site / entry.name)
    shutil.copytree(REPO / "workshop_lib", env / site / "workshop_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    link_tree(course_env / "share", env / "share")
    # etc/ is small and the class changes it: a copy. The course's nbgrader_config.py
    # finds a course folder through the repository; the class names its own.
    shutil.copytree(course_env / "etc", env / "etc")
    (env / "etc" / "jupyter" / "nbgrader_config.py").unlink(missing_ok=True)
    for script in sorted((course_env / "bin").iterdir()):
        target = env / "bin" / script.name
        if target.exists() or target.is_symlink() or script.name.startswith("activate"):
            continue
        if not rewrite_script(script, target, {given_bin, str(course_env / "bin")},
                              env / "bin" / "python"):
            link_tree(script, target)
    # A linked package may not support this Python: pip chose it for the course
    # environment's (Debian 12's 3.11.2 and soupsieve 4.1.3, which needs 3.11.5 and fails on
    # every CSS selector, so nbgrader's feedback). pip picks those again, for this Python.
    python_bin = env / "bin" / "python"
    unsupported = run(python_bin, "-c", UNSUPPORTED_DISTRIBUTIONS).split()
    if unsupported:
        run(python_bin, "-m", "pip", "uninstall", "--quiet", "--yes", *unsupported)
    run(python_bin, "-m", "pip", "install", "--quiet", "--no-warn-script-location",
        *classroom_pins(), *unsupported)
    still = run(python_bin, "-c", UNSUPPORTED_DISTRIBUTIONS).split()
    if still:
        raise KitError(f"no version of {', '.join(still)} supports {python}: pass --python "
                       f"with a newer Python {version}")
    run(python_bin, "-m", "pip", "check")
    # Readable by every account (linked files share their modes with the course's: this
    # only ever adds read permission).
    run("chmod", "-R", "a+rX", env)
    stamp.write_text(built_from)
    return unsupported


def install_proxy(state):
    """configurable-http-proxy, at the version package-lock.json pins, in DIR/proxy."""
    if not shutil.which("npm") or not shutil.which("node"):
        raise KitError("npm not found: install Node.js 20 or newer with npm (JupyterHub's "
                       "proxy, configurable-http-proxy, is a Node program)")
    node = run("node", "--version").strip()
    if int(node.lstrip("v").split(".")[0]) < 20:
        raise KitError(f"Node.js {node}: configurable-http-proxy 5.3.0 needs 20 or newer")
    proxy = state / "proxy"
    proxy.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(KIT / name, proxy / name)
    wanted = json.loads((KIT / "package.json").read_text())["dependencies"]
    installed = proxy / "node_modules" / "configurable-http-proxy" / "package.json"
    if not (installed.exists() and json.loads(installed.read_text())["version"]
            == wanted["configurable-http-proxy"]):
        run("npm", "ci", "--omit=dev", "--no-audit", "--no-fund", "--prefix", proxy)


def command_env(args):
    state = args.state
    ensure_reachable(state)
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)
    reinstalled = build_env(state, args.course_env, args.python)
    install_proxy(state)
    if reinstalled is None:
        print(f"{state / 'env'}: the class environment is up to date")
    else:
        print(f"{state / 'env'}: the class environment ({' '.join(classroom_pins())}"
              + (f"; reinstalled for {args.python}: {', '.join(reinstalled)}"
                 if reinstalled else "") + ")")
    print(f"{state / 'proxy'}: configurable-http-proxy")
