"""The formgrader: JupyterHub's single-user server as the grader account, serving on the
socket listen.py bound for it as root (``$CLASSROOM_LISTEN_FD``), on a port no learner's
process can take (../listen.py says why).

    python formgrader.py [jupyterhub-singleuser options]

jupyter_server binds its port itself (``ServerApp._find_http_port`` and
``_bind_http_server_tcp``, jupyter_server 2): here both take the socket already bound
instead, so the grader account never binds, and never needs the right to.
"""
import os
import socket
import sys

from jupyter_server.serverapp import ServerApp
from jupyterhub.singleuser import main

FD_ENV = "CLASSROOM_LISTEN_FD"


def serve_on(sock):
    """Make every ServerApp of this process serve on ``sock``, bound already."""
    sock.setblocking(False)

    def find_port(app):
        app.port = sock.getsockname()[1]

    def bind(app):
        app.http_server.add_sockets([sock])
        return True

    ServerApp._find_http_port = find_port
    ServerApp._bind_http_server_tcp = bind


if __name__ == "__main__":
    if FD_ENV not in os.environ:
        sys.exit(f"formgrader: no socket to serve on (${FD_ENV}): the hub starts it through "
                 f"listen.py (jupyterhub_config.py)")
    serve_on(socket.socket(fileno=int(os.environ.pop(FD_ENV))))
    sys.exit(main())
