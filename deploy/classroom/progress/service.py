"""The progress service, as the hub runs it (jupyterhub_config.py: a managed service, as the
grader account, in its own data folder):

    python -m progress.service --data DIR [--learners FILE] [--anonymous-survey] ...

Under its prefix (/services/progress/):

- ``api/records`` (POST, a hub token in ``Authorization: token ...``): a learner's kernel
  sends ``{"records": [...]}``; the records are kept as the token owner's (never a name in
  the body), once per id; the answer is ``{"stored": n, "rejected": [...]}``. The token is
  the learner's server token (JUPYTERHUB_API_TOKEN, which their kernels inherit) or one of
  their own; it needs ``access:services!service=progress`` (the learners' role gives it);
- the board (``/``), ``board.json``, ``board.csv`` and ``survey.csv``: the instructors'
  only, through the scope ``custom:progress:board`` of their role (a browser logs in with
  the hub's OAuth; a script may send an instructor's token).

Who a request comes from is the hub's answer (jupyterhub.services.auth), never the
request's word.
"""
import argparse
import asyncio
import html
import json
import logging
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from progress import board, guard, store

BOARD_SCOPE = "custom:progress:board"
PAGE = Path(__file__).resolve().parent / "page"
MAX_BODY_BYTES = 2 * 2**20
FD_ENV = "CLASSROOM_LISTEN_FD"  # listen.py's socket
log = logging.getLogger("progress")


class Handler(HubOAuthenticated, web.RequestHandler):
    def initialize(self, service):
        self.service = service

    def set_default_headers(self):
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")

    def write_json(self, status, body):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class RecordsHandler(Handler):
    """A learner's kernel reports here, with a token (never a browser's cookie: a page
    under the hub's origin could otherwise send records in a visitor's name)."""

    @property
    def hub_scopes(self):
        return self.hub_auth.access_scopes  # access:services!service=<this service>

    def check_xsrf_cookie(self):
        """Token-authenticated only (below): no cookie, so no cross-site request."""

    def post(self):
        user = self.current_user
        if not (user and getattr(self, "_token_authenticated", False)
                and user.get("kind") == "user"):
            self.write_json(403, {"error": "send a learner's hub token (Authorization: token "
                                           "$JUPYTERHUB_API_TOKEN) with access to this service"})
            return
        try:
            body = json.loads(self.request.body or b"null")
            if not isinstance(body, dict) or "records" not in body:
                raise store.RecordError('the body is {"records": [...]}')
            stored, rejected = self.service.store.add(user["name"], body["records"])
        except ValueError as error:  # RecordError, or JSON that does not parse
            self.write_json(400, {"error": str(error).splitlines()[0][:300]})
            return
        log.info("%s: %d stored, %d rejected", user["name"], stored, len(rejected))
        self.write_json(200, {"stored": stored, "rejected": rejected})


class InstructorsHandler(Handler):
    """The instructors' group only: the hub gives its role the board's scope."""

    hub_scopes = {BOARD_SCOPE}

    def board(self):
        return board.build(self.service.store.summary(), self.service.learners(),
                           stuck_after=self.service.stuck_after,
                           quiet_minutes=self.service.quiet_minutes,
                           anonymous=self.service.anonymous, ballots=self.service.ballots(),
                           catalogue=self.service.catalogue)


    def write_error(self, status_code, **kwargs):
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        if status_code == 403:
            self.finish("403: the class's progress board is the instructors' only (log in "
                        "at the hub with an instructor's name).\n")
        else:
            self.finish(f"{status_code}: {self._reason}\n")


class PageHandler(InstructorsHandler):
    @web.authenticated
    def get(self):
        # Scripts from this service only: the reasons and comments on the page are learners'
        # words, drawn as text, and no script of theirs could run even if one slipped in.
        self.set_header("Content-Security-Policy", "default-src 'self'; script-src 'self'; "
                        "style-src 'self'; img-src 'self'; frame-ancestors 'self'")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        page = (PAGE / "board.html").read_text()
        # The page's own fetches of board.json carry this token: the hub's OAuth accepts a
        # cookie on a script's request only with it (a page elsewhere cannot read it).
        page = page.replace("{{xsrf}}", html.escape(self.xsrf_token.decode()))
        self.finish(page.replace("{{formgrader}}", html.escape(self.service.formgrader)))


class BoardJSONHandler(InstructorsHandler):
    @web.authenticated
    def get(self):
        self.write_json(200, self.board())


class CSVHandler(InstructorsHandler):
    def initialize(self, service, which):
        super().initialize(service)
        self.which = which

    @web.authenticated
    def get(self):
        if self.which == "board.csv":
            text = board.grid_csv(self.board())
        else:
            text = board.survey_csv(self.service.store.rows("kind = 'survey'"),
                                    self.service.anonymous,
                                    self.service.ballots())
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="{self.which}"')
        self.finish(text)


class Service:
    def __init__(self, args):
        args.data.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.data = args.data
        self.store = store.Store(args.data / "progress.sqlite", args.anonymous_survey)
        self.learners_file = args.learners
        self.anonymous = args.anonymous_survey
        self.stuck_after, self.quiet_minutes = args.stuck_after, args.quiet_minutes
        self.formgrader = args.formgrader
        # The day's exercises, in the notebooks' order (classroom.py init writes the file).
        self.catalogue = json.loads(args.exercises.read_text()) if args.exercises else []

    def ballots(self):
        return self.store.ballots() if self.anonymous else None

    def learners(self):
        """The class's learners, read again each time (`accounts add` writes the list)."""
        if self.learners_file and self.learners_file.exists():
            return self.learners_file.read_text().split()
        return []


def cookie_secret(data):
    """The key of the board's login cookie, kept in the data folder: an instructor's board
    keeps working when the hub restarts the service."""
    path = data / "cookie_secret"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_bytes(secrets.token_bytes(32))
    return path.read_bytes()


def application(service, prefix):
    # The handlers find this one instance (HubAuthenticated.hub_auth); a token's owner is
    # asked of the hub again after a minute (a revoked token stops working then).
    HubOAuth.instance(cache_max_age=60)
    settings = {"service": service}
    return web.Application([
        (prefix.rstrip("/") + "/?", PageHandler, settings),
        (url_path_join(prefix, "board.json"), BoardJSONHandler, settings),
        (url_path_join(prefix, "board.csv"), CSVHandler, {**settings, "which": "board.csv"}),
        (url_path_join(prefix, "survey.csv"), CSVHandler, {**settings, "which": "survey.csv"}),
        (url_path_join(prefix, "api/records"), RecordsHandler, settings),
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        (url_path_join(prefix, "static/(.*)"), web.StaticFileHandler, {"path": str(PAGE)}),
    ], cookie_secret=cookie_secret(service.data))


def parser():
    main = argparse.ArgumentParser(description="The class's progress service and board.")
    main.add_argument("--data", type=Path, required=True,
                      help="the folder of its database (only the service's account reads it)")
    main.add_argument("--learners", type=Path, help="the class's learners, one a line")
    main.add_argument("--anonymous-survey", action="store_true",
                      help="the board and CSV never say who answered the survey what")
    main.add_argument("--stuck-after", type=int, default=board.STUCK_AFTER,
                      help="NOT YET this many times in a row on an exercise: stuck")
    main.add_argument("--quiet-minutes", type=int, default=board.QUIET_MINUTES,
                      help="no verdict this long since a NOT YET: stuck")
    main.add_argument("--formgrader", default="", help="the formgrader's address, linked")
    main.add_argument("--exercises", type=Path,
                      help='the day\'s exercises, [{"key", "notebook", "kind"}] in order')
    return main


def listen(server):
    """On the socket listen.py bound as root where the hub started it so (a port no learner
    can take), else on JUPYTERHUB_SERVICE_URL's address."""
    if FD_ENV in os.environ:
        sock = socket.socket(fileno=int(os.environ.pop(FD_ENV)))
        sock.setblocking(False)
        server.add_sockets([sock])
    else:
        address = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
        server.listen(address.port, address=address.hostname)


async def serve(args):
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/progress/")
    service = Service(args)
    guard.raise_file_limit()
    listen(guard.GuardedServer(application(service, prefix), max_body_size=MAX_BODY_BYTES))
    log.info("listening on %s%s", os.environ["JUPYTERHUB_SERVICE_URL"], prefix)
    # The hub stops its services with SIGINT (then SIGTERM): stop between two requests.
    stopped = asyncio.Event()
    for stop in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(stop, stopped.set)
    await stopped.wait()
    service.store.close()
    log.info("stopped")


def main(argv=None):
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[progress %(asctime)s] %(message)s")
    if "JUPYTERHUB_SERVICE_URL" not in os.environ:
        sys.exit("progress: the hub starts this service (jupyterhub_config.py); "
                 "JUPYTERHUB_SERVICE_URL is not set")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
