"""The course in JupyterLab, in a real browser: what learners and instructors click.

JupyterLab is started with the commands ``make lab`` and ``make instructor`` run (read from
``make -n``, so a change to the Makefile is tested too) and driven in Debian's Chromium by
Playwright:

- the learner's JupyterLab (``make lab``) serves a workspace of copies of the notebooks and
  of the assessment's release: nothing of assessment/source or tests/, no nbgrader
  instructor panel, the course's own settings (no news prompt, no update check, no
  extension manager);
- notebook 01: the batch-size slider redraws the SGD plot;
- notebook 00: its first ``%%bash torchrun`` cell prints every rank's start-up line and the final
  ``done:`` line, while the GPU dashboard (jupyterlab-nvdashboard) keeps streaming;
- the assessment: the learner's notebook has nbgrader's *Validate* button, and it validates;
  the instructor's JupyterLab (``make instructor``) has the formgrader listing the assignment.

Every step saves a screenshot in ``build/browser-screenshots/`` (CI keeps them); a failing
test saves one of the page as it was. Both servers work on copies in a scratch folder under
``build/`` (the learner's workspace, and the assessment folder the formgrader manages), so
that running the notebooks (and JupyterLab's autosave) never touches the committed ones.

Chromium is Debian's (``apt-get install chromium``; ``.ci/run`` installs it). Without it the
module is skipped, except under CI, where that is a failure.
"""
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from conftest import REPO, free_port

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import sync_playwright
except ImportError:  # the chromium_path fixture skips the tests, or under CI fails them
    PlaywrightTimeoutError = sync_playwright = None

CHROMIUM = Path("/usr/bin/chromium")
# --disable-background-networking and --disable-component-update: without them Chromium
# opens connections to Google's services at start-up, which a closed network refuses.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--headless", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic"]
SCREENSHOTS = REPO / "build" / "browser-screenshots"
VIEWPORT = {"width": 1400, "height": 900}
# Generous: on a busy 2-core CI machine a kernel takes 10-20 s to start, a torchrun cell
# 30-60 s.
SERVER_START_S = 120
KERNEL_START_S = 120
CELL_S = 300
# Without the course's settings JupyterLab's news prompt appears 1-2 s after the page has
# loaded; waiting this long and seeing none shows the settings work.
NEWS_PROMPT_WAIT_S = 6
# nbgrader's parts for instructors, which the learner's JupyterLab must not have.
INSTRUCTOR_PLUGINS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:course-list"]
pytestmark = pytest.mark.slow
# train_ddp's start-up line, one per rank: "[rank 1/2] cpu samples=..." ("cuda:1" on GPUs).
RANK_TAG = re.compile(r"\[rank (\d+)/(\d+)\] \S+ samples=\d+")


@pytest.fixture(scope="module")
def chromium_path():
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"Debian's Chromium at {CHROMIUM} (apt-get install -y chromium)")
    if sync_playwright is None:
        missing.append("playwright-python (`make setup` installs it)")
    if missing:
        reason = f"browser tests need {' and '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(f"under CI, {reason}")
        pytest.skip(reason)
    return CHROMIUM


class Screenshots:
    """Numbered screenshots in build/browser-screenshots, with an index of what each shows."""

    def __init__(self, folder):
        self.folder, self.count = folder, 0
        shutil.rmtree(folder, ignore_errors=True)  # screenshots of an earlier run mislead
        folder.mkdir(parents=True)

    def take(self, page, name, description):
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
        page.screenshot(path=str(path))
        with open(self.folder / "index.txt", "a") as index:
            index.write(f"{path.name}: {description}\n")
        return path


@pytest.fixture(scope="module")
def screenshots(chromium_path):
    return Screenshots(SCREENSHOTS)


@pytest.fixture(scope="module")
def scratch():
    """A scratch folder in the git-ignored build/: the learner's workspace (``make lab``
    fills it) and a copy of the assessment course folder (the instructor's files, which
    the formgrader manages)."""
    (REPO / "build").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="browser-tests-", dir=REPO / "build"))
    shutil.copytree(REPO / "assessment", folder / "assessment", ignore=shutil.ignore_patterns(
        "gradebook.db", "submitted", "autograded", "feedback", "grades.csv", "*.log",
        "runs", "grading_run", "train_digits*.py", "__pycache__", ".ipynb_checkpoints"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def make_commands(target, port, lab_args, **variables):
    """The commands of ``make TARGET``'s own recipe (not its set-up prerequisite), for
    this Python's environment, as ``make -n`` prints them."""
    dry_run = subprocess.run(
        ["make", "--no-print-directory", "-n", "-s", target, f"VENV={sys.prefix}",
         f"PORT={port}", f"LAB_ARGS={shlex.join(lab_args)}",
         *(f"{name}={value}" for name, value in variables.items())],
        cwd=REPO, capture_output=True, text=True, check=True).stdout
    commands = dry_run.replace("\\\n", " ").splitlines()
    server = next(i for i, command in enumerate(commands) if "/jupyter lab " in command)
    prepare = [c for c in commands[:server] if "make_workspace.py" in c]
    return prepare, commands[server]


def http_get(url, token):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def http(method, url, token):
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10):
        pass


class JupyterLab:
    def __init__(self, url, token, process, log_path):
        self.url, self.token, self.process, self.log_path = url, token, process, log_path

    def log(self):
        return self.log_path.read_text(errors="replace")

    def api(self, path):
        return http_get(f"{self.url}/{path}", self.token)

    def stop(self):
        """Shut the kernels down, then the server; kill what is left."""
        try:
            for session in self.api("api/sessions"):
                http("DELETE", f"{self.url}/api/sessions/{session['id']}", self.token)
            http("POST", f"{self.url}/api/shutdown", self.token)
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.process.poll() is not None:
                break
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass


def start_jupyter_lab(target, home, env, **variables):
    """JupyterLab as ``make TARGET`` starts it, on a free port of 127.0.0.1, with a token;
    its recipe's preparation (the learner's workspace) run first."""
    port, token = free_port(), secrets.token_hex(16)
    prepare, command = make_commands(target, port, [
        "--no-browser", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
        # window.jupyterapp: the tests run JupyterLab's own commands (run a cell...).
        "--LabApp.expose_app_in_browser=True"], **variables)
    for step in prepare:
        subprocess.run(["bash", "-c", step], cwd=REPO, env=env, check=True,
                       capture_output=True, timeout=120)
    log_path = home / f"jupyter-{target}.log"
    start = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(["bash", "-c", command], cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    lab = JupyterLab(f"http://127.0.0.1:{port}", token, process, log_path)
    while True:
        if process.poll() is not None:
            pytest.fail(f"JupyterLab exited ({process.returncode}):\n{lab.log()[-3000:]}")
        if time.monotonic() - start > SERVER_START_S:
            lab.stop()
            pytest.fail(f"JupyterLab not ready after {SERVER_START_S} s:\n{lab.log()[-3000:]}")
        try:
            lab.api("api/status")
            break
        except OSError:
            time.sleep(0.25)
    lab.ready_s = time.monotonic() - start
    print(f"\nJupyterLab (make {target}) ready after {lab.ready_s:.1f} s: {command}")
    return lab


@pytest.fixture(scope="module")
def jupyter_home(tmp_path_factory):
    """The user's own Jupyter folders replaced by empty ones (settings, workspaces, kernel
    connection files), so that only the course's configuration applies and nothing is
    written to the home folder."""
    home = tmp_path_factory.mktemp("jupyter-home")
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython")}
    env.pop("WORKSHOP_ASSESSMENT_DIR", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    return home, env


@pytest.fixture(scope="module")
def jupyter_lab(chromium_path, scratch, jupyter_home):
    """The learner's JupyterLab (``make lab``), serving a workspace in the scratch folder."""
    home, env = jupyter_home
    lab = start_jupyter_lab("lab", home, env, WORKSPACE=scratch / "workspace")
    lab.workspace = scratch / "workspace"
    yield lab
    lab.stop()
    print(f"JupyterLab's log (make lab):\n{lab.log()[-2000:]}")


@pytest.fixture(scope="module")
def instructor_lab(chromium_path, scratch, jupyter_home):
    """The instructor's JupyterLab (``make instructor``); its formgrader manages the copy of
    assessment/ in the scratch folder."""
    home, env = jupyter_home
    env = {**env, "WORKSHOP_ASSESSMENT_DIR": str(scratch / "assessment")}
    lab = start_jupyter_lab("instructor", home, env)
    yield lab
    lab.stop()
    print(f"JupyterLab's log (make instructor):\n{lab.log()[-2000:]}")


@pytest.fixture(scope="module")
def browser(chromium_path):
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(chromium_path),
                                              args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def new_page(browser, lab, screenshots, request):
    """A fresh browser page on ``lab``; its console errors are printed, and a screenshot is
    saved if the test fails."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    failed_before = request.session.testsfailed
    yield LabPage(page, lab, workspace=request.node.name)
    if request.session.testsfailed > failed_before:
        screenshots.take(page, f"FAILED-{request.node.name}", f"{request.node.name} failed here")
    if console_errors:
        print("browser console errors:\n" + "\n".join(console_errors[-20:]))
    context.close()


@pytest.fixture
def lab_page(browser, jupyter_lab, screenshots, request):
    """A page of the learner's JupyterLab."""
    yield from new_page(browser, jupyter_lab, screenshots, request)


@pytest.fixture
def instructor_page(browser, instructor_lab, screenshots, request):
    """A page of the instructor's JupyterLab."""
    yield from new_page(browser, instructor_lab, screenshots, request)


class LabPage:
    """One JupyterLab page and the few things the tests do in it, through JupyterLab's own
    commands and the page's elements."""

    def __init__(self, page, lab, workspace):
        self.page, self.lab, self.workspace = page, lab, workspace
        # The notebook panel with a given id, for the scripts below: tests keep the id of
        # the notebook they opened, since other tabs (a dashboard) may become current.
        page.add_init_script("""window.panelById = (id) =>
            Array.from(window.jupyterapp.shell.widgets("main")).find((w) => w.id === id);""")

    def goto(self, tree_path=""):
        """Open JupyterLab (on ``tree_path``) in a workspace of its own: no tabs restored
        from another test."""
        path = f"/tree/{tree_path}" if tree_path else ""
        self.page.goto(f"{self.lab.url}/lab/workspaces/{self.workspace}{path}"
                       f"?token={self.lab.token}")
        self.page.wait_for_function("window.jupyterapp && window.jupyterapp.commands"
                                    " && document.querySelector('#jp-main-dock-panel')",
                                    timeout=KERNEL_START_S * 1000)

    def open_notebook(self, path):
        """Open a notebook as a learner would (its URL); wait until its kernel is idle."""
        start = time.monotonic()
        self.goto(path)
        self.page.wait_for_function(
            """(name) => {
                const panel = window.jupyterapp.shell.currentWidget;
                const kernel = panel && panel.sessionContext && panel.context.path.endsWith(name)
                    && panel.sessionContext.session && panel.sessionContext.session.kernel;
                return kernel && kernel.status === "idle";
            }""", arg=Path(path).name, timeout=KERNEL_START_S * 1000)
        print(f"{path}: open with an idle kernel after {time.monotonic() - start:.1f} s")
        return self.page.evaluate("window.jupyterapp.shell.currentWidget.id")

    def run_cells(self, panel_id, indices):
        """Run cells of the notebook panel, in order, as its Run button on each would; does
        not wait for them to finish."""
        self.page.evaluate(
            """([panelId, indices]) => {
                const app = window.jupyterapp;
                const panel = window.panelById(panelId);
                app.shell.activateById(panelId);
                (async () => {
                    for (const index of indices) {
                        panel.content.activeCellIndex = index;
                        await app.commands.execute("notebook:run-cell");
                    }
                })();
            }""", [panel_id, list(indices)])

    def cell_output_text(self, panel_id, index):
        return self.page.evaluate(
            """([panelId, index]) => {
                const panel = window.panelById(panelId);
                const cell = panel.content.widgets[index].node;
                const area = cell.querySelector(".jp-Cell-outputArea");
                return area ? area.textContent : "";
            }""", [panel_id, index])

    def wait_for_output(self, panel_id, index, pattern, timeout_s=CELL_S):
        """Wait until the cell's output, as shown in the page, matches the regex."""
        try:
            self.page.wait_for_function(
                """([panelId, index, pattern]) => {
                    const panel = window.panelById(panelId);
                    const area = panel.content.widgets[index].node
                        .querySelector(".jp-Cell-outputArea");
                    return area && new RegExp(pattern, "m").test(area.textContent);
                }""", arg=[panel_id, index, pattern], timeout=timeout_s * 1000)
        except PlaywrightTimeoutError:
            pytest.fail(f"cell {index} shows no /{pattern}/ after {timeout_s} s; its output:\n"
                        f"{self.cell_output_text(panel_id, index)[-3000:]}")
        return self.cell_output_text(panel_id, index)

    def wait_for_kernel(self, panel_id, status, timeout_s=CELL_S):
        self.page.wait_for_function(
            """([panelId, status]) => {
                const panel = window.panelById(panelId);
                return panel.sessionContext.session.kernel.status === status;
            }""", arg=[panel_id, status], timeout=timeout_s * 1000)

    def scroll_to_cell(self, panel_id, index):
        self.page.evaluate(
            """([panelId, index]) => {
                const panel = window.panelById(panelId);
                panel.content.widgets[index].node.scrollIntoView({block: "start"});
            }""", [panel_id, index])


def cell_index(notebook_path, predicate):
    cells = nbformat.read(notebook_path, as_version=4).cells
    return next(i for i, cell in enumerate(cells) if predicate(cell))


def is_parameters(cell):
    return "parameters" in cell.metadata.get("tags", [])


def calls_setup(cell):
    return "notebook.setup(" in cell.source


def test_course_opens_with_its_settings_and_no_first_run_noise(lab_page, screenshots):
    page = lab_page.page
    start = time.monotonic()
    page.goto(f"{lab_page.lab.url}/?token={lab_page.lab.token}")
    page.get_by_text("00_welcome.ipynb").wait_for(timeout=KERNEL_START_S * 1000)
    print(f"JupyterLab page ready (file browser listing notebooks/) "
          f"{time.monotonic() - start:.1f} s after opening its address; the server took "
          f"{lab_page.lab.ready_s:.1f} s to start")
    assert page.url.endswith("/lab/tree/notebooks"), "make lab opens on the notebooks"

    # Server side (jupyter_server_config.py): no news feed, no update check, and an
    # extension manager that lists but never installs.
    config = json.loads(page.locator("#jupyter-config-data").text_content())
    assert config["news"] == {"disabled": True}
    assert config["extensionManager"]["name"] == "read-only"
    assert not config["extensionManager"]["can_install"]
    # Front end (overrides.json5): the settings' defaults are the course's.
    defaults = page.evaluate("""async () => {
        const settings = window.jupyterapp.serviceManager.settings;
        const notification = await settings.fetch("@jupyterlab/apputils-extension:notification");
        const extensions = await settings.fetch("@jupyterlab/extensionmanager-extension:plugin");
        return {fetchNews: notification.schema.properties.fetchNews.default,
                checkForUpdates: notification.schema.properties.checkForUpdates.default,
                extensionManager: extensions.schema.properties.enabled.default};
    }""")
    assert defaults == {"fetchNews": "false", "checkForUpdates": False,
                        "extensionManager": False}

    page.wait_for_timeout(NEWS_PROMPT_WAIT_S * 1000)
    toasts = page.locator(".Toastify__toast").all_inner_texts()
    assert toasts == [], f"first-run pop-ups: {toasts}"
    screenshots.take(page, "course-opens", "make lab's JupyterLab: the file browser on "
                     "notebooks/, no news prompt or other pop-up; the GPU Dashboards in "
                     "the side bar, no nbgrader instructor panel")


def test_learner_sees_learner_material_only(lab_page, screenshots):
    """The workspace holds the notebooks and the assessment's release; the repository's
    assessment/ (source, gradebook), tests/ and the rest are out of the server's reach, and
    nbgrader's instructor panels are off."""
    page = lab_page.page
    lab_page.goto()
    page.evaluate("window.jupyterapp.commands.execute('filebrowser:go-to-path', {path: '/'})")
    listing = page.locator(".jp-DirListing-content .jp-DirListing-itemName")
    page.wait_for_function("() => Array.from(document.querySelectorAll("
                           "'.jp-DirListing-content .jp-DirListing-itemName'))"
                           ".some((e) => e.textContent.trim() === 'ddp_refactor')",
                           timeout=60_000)
    shown = sorted(name.strip() for name in listing.all_inner_texts())
    assert "assessment" not in shown and "tests" not in shown, shown
    assert {"notebooks", "ddp_refactor"} <= set(shown), shown
    assignment = {item["name"] for item in lab_page.lab.api("api/contents/ddp_refactor")[
        "content"]}
    assert assignment == {p.name for p in (REPO / "assessment" / "release" / "ddp_refactor")
                          .iterdir() if p.suffix in (".py", ".ipynb")
                          and not p.name.startswith("train_digits")}
    for path in ("api/contents/assessment/source", "api/contents/tests", "formgrader"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            lab_page.lab.api(path)
        assert refused.value.code == 404, path
    plugins = page.evaluate("(ids) => ids.filter((id) => window.jupyterapp.hasPlugin(id))",
                            INSTRUCTOR_PLUGINS)
    assert plugins == []
    assert not page.evaluate("window.jupyterapp.commands.hasCommand("
                             "'nbgrader:open-formgrader')")
    assert page.evaluate("window.jupyterapp.hasPlugin('@jupyter/nbgrader:validate-assignment')")
    screenshots.take(page, "learner-workspace", "make lab's file browser at the top of the "
                     "learner's workspace: the notebooks and the assessment (ddp_refactor), "
                     "nothing of the instructor's kit")


def test_batch_size_slider_redraws_the_sgd_plot(lab_page, scratch, screenshots):
    notebook = scratch / "workspace" / "notebooks" / "01_sgd_and_batch_size.ipynb"
    widget_cell = cell_index(notebook, lambda cell: "widgets.BatchSizeExplorer(" in cell.source)
    page = lab_page.page
    panel_id = lab_page.open_notebook(notebook.relative_to(scratch / "workspace").as_posix())
    # Every cell up to the widget's, as a learner who reads down to it.
    lab_page.run_cells(panel_id, range(widget_cell + 1))

    explorer = page.locator(f"[id='{panel_id}'] .jp-OutputArea-output .widget-vbox").first
    image = explorer.locator(".widget-image")
    image.wait_for(timeout=CELL_S * 1000)
    # The plots above the widget are matplotlib figures shown inline.
    assert page.locator(f"[id='{panel_id}'] .jp-RenderedImage img").count() >= 1
    slider = explorer.locator(".widget-slider", has_text="batch size")
    readout, summary = slider.locator(".widget-readout"), explorer.locator(".widget-html")
    before = {"batch": readout.inner_text(), "summary": summary.inner_text(),
              "image_src": image.get_attribute("src"), "png": image_sha256(page, image)}
    lab_page.scroll_to_cell(panel_id, widget_cell)
    screenshots.take(page, "slider-before", f"notebook 01's batch-size explorer as first drawn "
                     f"(batch size {before['batch']}): sliders, summary, SGD paths and losses")

    # Drag the batch-size handle three quarters of the way along its track, as a learner
    # would (the slider reports its value when released).
    handle, track = slider.locator(".noUi-handle"), slider.locator(".noUi-base")
    handle_box, track_box = handle.bounding_box(), track.bounding_box()
    y = handle_box["y"] + handle_box["height"] / 2
    page.mouse.move(handle_box["x"] + handle_box["width"] / 2, y)
    page.mouse.down()
    page.mouse.move(track_box["x"] + 0.75 * track_box["width"], y, steps=8)
    page.mouse.up()
    after_batch = readout.inner_text()
    assert after_batch != before["batch"], "the drag moved the slider"

    # The kernel reruns the toy and sends a new plot: the image element gets new content.
    try:
        page.wait_for_function("([image, old]) => image.src && image.src !== old",
                               arg=[image.element_handle(), before["image_src"]],
                               timeout=60_000)
    except PlaywrightTimeoutError:
        pytest.fail(f"no new plot within 60 s of moving the slider to {after_batch}")
    after_summary = summary.inner_text()
    assert after_summary != before["summary"]
    assert re.search(rf"\bbatch {after_batch}\b|full batch \({after_batch}\)", after_summary), (
        f"the summary describes the chosen batch size {after_batch}: {after_summary}")
    assert image_sha256(page, image) != before["png"], "the plot's pixels changed"
    screenshots.take(page, "slider-after", f"the same explorer after dragging the batch-size "
                     f"slider to {after_batch}: the kernel redrew the plot and the summary")


def image_sha256(page, image):
    """SHA-256 of the image the element shows (ipywidgets serves it as a blob: URL)."""
    return page.evaluate("""async (image) => {
        const bytes = await (await fetch(image.src)).arrayBuffer();
        const digest = await crypto.subtle.digest("SHA-256", bytes);
        return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
    }""", image.element_handle())


def open_dashboard_beside(lab_page, panel_id, chart):
    """Open one of jupyterlab-nvdashboard's charts from its side panel, as notebook 00 tells
    learners to, and put it to the right of the notebook."""
    page = lab_page.page
    page.locator(".jp-SideBar .lm-TabBar-tab[title='GPU Dashboards']").click()
    page.get_by_role("button", name=chart, exact=True).click()
    page.wait_for_function("(title) => window.jupyterapp.shell.currentWidget.title.label === title",
                           arg=chart, timeout=30_000)
    page.evaluate("""(panelId) => {
        const shell = window.jupyterapp.shell;
        shell.add(shell.currentWidget, "main", {mode: "split-right", ref: panelId});
        shell.collapseLeft();
    }""", panel_id)


def test_torchrun_cell_shows_every_rank_while_the_dashboard_streams(lab_page, scratch,
                                                                    screenshots):
    # Notebook 00's first launch: the course's own train_ddp (notebook 02's launch runs the
    # learner's script, which prints what the learner wrote).
    notebook = scratch / "workspace" / "notebooks" / "00_welcome.ipynb"
    first_cells = [cell_index(notebook, is_parameters), cell_index(notebook, calls_setup)]
    torchrun_cell = cell_index(notebook, lambda cell: cell.source.startswith("%%bash")
                               and "torchrun" in cell.source and "workshop_lib.train_ddp"
                               in cell.source)
    page = lab_page.page
    dashboard_updates = []  # the nvdashboard stream of each message the page received
    page.on("websocket", lambda socket: socket.on(
        "framereceived", lambda _: dashboard_updates.append(socket.url.rsplit("/", 1)[-1]))
        if "/nvdashboard/" in socket.url else None)

    panel_id = lab_page.open_notebook(notebook.relative_to(scratch / "workspace").as_posix())
    # The GPU view loads with or without GPUs; with none, its CPU chart stands in.
    gpus = lab_page.lab.api("nvdashboard/accelerators/check")["ngpus"]
    chart, stream = (("GPU Utilization", "gpu_utilization") if gpus
                     else ("Machine Resources", "cpu_resource"))
    print(f"jupyterlab-nvdashboard sees {gpus} GPU(s); watching {chart}")
    open_dashboard_beside(lab_page, panel_id, chart)

    lab_page.run_cells(panel_id, first_cells)
    lab_page.wait_for_output(panel_id, first_cells[-1], r"^profile ")
    lab_page.wait_for_kernel(panel_id, "idle")
    lab_page.run_cells(panel_id, [torchrun_cell])
    start = time.monotonic()
    lab_page.wait_for_kernel(panel_id, "busy", timeout_s=30)
    updates_at_start = dashboard_updates.count(stream)
    lab_page.wait_for_output(panel_id, torchrun_cell, r"\[rank 0/\d+\]")
    lab_page.scroll_to_cell(panel_id, torchrun_cell)
    screenshots.take(page, "torchrun-running", f"notebook 00's torchrun cell while it runs "
                     f"(kernel busy), the nvdashboard {chart} chart updating beside it")
    output = lab_page.wait_for_output(panel_id, torchrun_cell, r"^done: ")
    lab_page.wait_for_kernel(panel_id, "idle", timeout_s=60)
    print(f"torchrun cell: {time.monotonic() - start:.1f} s")
    updates_during = dashboard_updates.count(stream) - updates_at_start

    tags = RANK_TAG.findall(output)
    world_sizes = {int(size) for _, size in tags}
    assert len(world_sizes) == 1, f"one world size in the rank tags: {tags}"
    assert sorted(int(rank) for rank, _ in tags) == list(range(world_sizes.pop())), (
        f"one start-up line per rank:\n{output}")
    assert re.search(r"^done: \d+ epochs done; val_acc=", output, re.M), output
    assert "CalledProcessError" not in output
    assert updates_during >= 5, (
        f"the {chart} chart kept updating while the cell ran: {updates_during} updates")
    lab_page.scroll_to_cell(panel_id, torchrun_cell)
    page.wait_for_timeout(500)
    screenshots.take(page, "torchrun-done", f"the torchrun cell finished: one [rank r/N] "
                     f"line per process, the per-epoch table, the final done: line; "
                     f"{updates_during} dashboard updates arrived while it ran")


def test_learner_validates_the_assessment_in_the_workspace(lab_page, scratch, screenshots):
    """The release's notebook, as a learner opens it: nbgrader's Validate button runs it
    (with the course's time limits) and reports the tests it fails, the untouched
    release's NotImplementedError."""
    panel_id = lab_page.open_notebook("ddp_refactor/ddp_refactor.ipynb")
    page = lab_page.page
    validate = page.locator(f"[id='{panel_id}'] .jp-Toolbar .validate-button")
    validate.wait_for(timeout=30_000)
    assert validate.inner_text().strip() == "Validate"
    assert validate.is_enabled()
    # The instructions' folded parts render as closed <details> (JupyterLab's sanitizer
    # keeps them), each showing its summary: "How grading works" first.
    summaries = page.locator(f"[id='{panel_id}'] .jp-RenderedMarkdown details > summary")
    summaries.first.wait_for(timeout=30_000)
    assert "How grading works" in summaries.first.inner_text()
    assert not page.locator(f"[id='{panel_id}'] .jp-RenderedMarkdown details[open]").count()
    screenshots.take(page, "learner-validate", "the assessment notebook as a learner opens "
                     "it (the workspace's copy of the release): nbgrader's Validate button")
    validate.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=CELL_S * 1000)
    page.wait_for_function(
        "() => /NotImplementedError|failed/i.test(document.querySelector('.jp-Dialog')"
        ".textContent) && !/Validating/i.test(document.querySelector('.jp-Dialog')"
        ".textContent.slice(0, 40))", timeout=CELL_S * 1000)
    text = dialog.inner_text()
    screenshots.take(page, "learner-validate-result", "Validate on the untouched release: "
                     "the tests fail, each saying the script still needs the learner's code")
    assert "NotImplementedError" in text, text[:2000]


def test_instructor_opens_the_formgrader(instructor_page, scratch, screenshots):
    course = scratch / "assessment"
    # Without the course's nbgrader settings the formgrader would take the repository for
    # its course folder and write a gradebook.db into it.
    assert (Path(sys.prefix) / "etc" / "jupyter" / "nbgrader_config.py").exists(), (
        "the course's nbgrader settings are not installed in this environment: make setup")
    repo_gradebook = REPO / "assessment" / "gradebook.db"
    repo_gradebook_before = repo_gradebook.stat().st_mtime if repo_gradebook.exists() else None
    page = instructor_page.page
    page.goto(f"{instructor_page.lab.url}/?token={instructor_page.lab.token}")
    page.get_by_text("nbgrader_config.py").first.wait_for(timeout=KERNEL_START_S * 1000)
    assert page.url.endswith("/lab/tree/assessment"), "make instructor opens on assessment/"
    instructor_page.goto()
    page.wait_for_function("window.jupyterapp.commands.hasCommand('nbgrader:open-formgrader')",
                           timeout=60_000)
    # The Nbgrader > Formgrader menu entry runs this command.
    page.evaluate("window.jupyterapp.commands.execute('nbgrader:open-formgrader')")
    formgrader = page.frame_locator("iframe[src*='formgrader']")
    formgrader.get_by_role("heading", name="Manage Assignments").wait_for(timeout=60_000)
    assignments = sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    for name in assignments:
        formgrader.get_by_role("link", name=name, exact=True).wait_for(timeout=60_000)
    screenshots.take(page, "instructor-formgrader", f"make instructor: the formgrader "
                     f"(Nbgrader > Formgrader) lists {', '.join(assignments)}")
    # It manages the course folder the course's nbgrader settings name: the copy here.
    assert (course / "gradebook.db").exists()
    repo_gradebook_after = repo_gradebook.stat().st_mtime if repo_gradebook.exists() else None
    assert repo_gradebook_after == repo_gradebook_before, "the repository's assessment/ untouched"
