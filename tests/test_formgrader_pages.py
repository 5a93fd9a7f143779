"""The formgrader renders submissions with nbconvert's HTMLExporter under the course's
configuration (nbgrader's formgrader builds ``HTMLExporter(config=...)`` from it, with its
``formgrade`` template); on the class server that page is on the hub's origin, where a
script would act with the instructor's login. assessment/nbgrader_config.py sanitizes its
outputs. (Its markdown is the instructor's: grading keeps the assignment's own cells only,
locked ones restored from the gradebook, autograde_guard.KeepAssignmentCellsOnly; the
formgrade template renders markdown without nbconvert's sanitizer.)"""
import nbformat
from nbconvert.exporters import HTMLExporter
from nbgrader.server_extensions.formgrader import handlers
from traitlets.config.loader import PyFileConfigLoader

from conftest import REPO

PLANTED = "document.title='planted'"


def planted_notebook():
    code = nbformat.v4.new_code_cell("print('hi')", outputs=[
        nbformat.v4.new_output("display_data", data={
            "text/html": f"<b onmouseover=\"{PLANTED}\">bold</b><script>{PLANTED}</script>",
            "application/javascript": PLANTED, "text/plain": "bold"})])
    return nbformat.v4.new_notebook(cells=[code])


def formgrade_page(config):
    exporter = HTMLExporter(config=config, template_name="formgrade",
                            extra_template_basedirs=[handlers.template_path])
    # What nbgrader's SubmissionHandler passes (handlers.py), for one submission.
    resources = {"assignment_id": "ddp_refactor", "notebook_id": "ddp_refactor",
                 "submission_id": "s1", "index": 0, "total": 1, "base_url": "",
                 "student": "learner01", "last_name": None, "first_name": None,
                 "notebook_path": "/formgrader/submitted/learner01/ddp_refactor"}
    return exporter.from_notebook_node(planted_notebook(), resources=resources)[0]


def test_the_formgrader_page_of_a_submission_carries_no_planted_script():
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPO / "assessment")).load_config()
    page = formgrade_page(config)
    assert "bold" in page, "the output itself is still shown"
    assert PLANTED not in page, "a script or event handler of the submission reached the page"


def test_without_the_setting_the_same_notebook_plants_its_script():
    """The probe: nbconvert's default would render the planted script."""
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPO / "assessment")).load_config()
    config.HTMLExporter.sanitize_html = False
    assert PLANTED in formgrade_page(config)
