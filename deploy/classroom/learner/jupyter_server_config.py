"""A learner's JupyterLab in the class (the hub names this folder in JUPYTER_CONFIG_PATH):
nbgrader's Assignment List (fetch, submit, feedback) and Validate, none of its instructor
parts. labconfig/page_config.json takes their panels out of JupyterLab too. Kernels talk
over Unix sockets in the server's private runtime folder (first_start.py), not TCP ports
on 127.0.0.1 that any account could connect to (IOPub needs no key to read).
"""
c = get_config()  # noqa: F821 - Jupyter defines get_config when it loads this file

c.ServerApp.jpserver_extensions = {
    "nbgrader.server_extensions.formgrader": False,
    "nbgrader.server_extensions.course_list": False,
    "nbgrader.server_extensions.assignment_list": True,
    "nbgrader.server_extensions.validate_assignment": True,
}

c.KernelManager.transport = "ipc"
