"""The course's Jupyter server settings. `make setup` installs this file into the
environment (.venv/etc/jupyter/), never into a learner's home; `jupyter lab` from that
environment reads it wherever it is started.
"""
c = get_config()  # noqa: F821 - Jupyter defines get_config when it loads this file

# JupyterLab asks jupyter.org for news and for newer releases at start-up. The course
# environment is pinned and workshop machines are often offline: never ask.
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
# The PyPI extension manager queries pypi.org; "readonly" lists what is installed only.
c.LabApp.extension_manager = "readonly"
