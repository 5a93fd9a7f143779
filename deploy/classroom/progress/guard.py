"""The progress service's HTTP server, guarded against one learner stalling it for everyone.

Learners' kernels connect to the service directly, on the loopback interface, so a learner
could open thousands of connections and send nothing (a slow-loris) until the service runs
out of file descriptors and every report and the board time out. Here:

- a connection that has sent no request within ``IDLE_S`` (headers included) is closed,
  and a request body must arrive within ``BODY_S``;
- at most ``PER_ACCOUNT`` connections are open at once from one account: the owner of a
  connection's other end is asked of the kernel (``workshop_lib.listeners.peer_uid``: the
  same loopback interface), and one past the cap is closed at once, as is one whose other
  end has gone already.
  Root's connections (the hub's proxy, which every browser's request comes through) are
  not capped;
- the service raises its own file limit to the hard one, so the cap, not the limit, is
  what a flood meets.
"""
import resource

from tornado.httpserver import HTTPServer

from workshop_lib import listeners

IDLE_S = 10
BODY_S = 30
PER_ACCOUNT = 64


def raise_file_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class GuardedServer(HTTPServer):
    def initialize(self, *args, per_account=PER_ACCOUNT, **kwargs):
        kwargs.setdefault("idle_connection_timeout", IDLE_S)
        kwargs.setdefault("body_timeout", BODY_S)
        super().initialize(*args, **kwargs)
        self.per_account = per_account
        self.open = {}  # uid -> connections open
        self.owner_of = {}  # id(stream) -> uid

    def handle_stream(self, stream, address):
        uid = listeners.peer_uid(address, stream.socket.getsockname()) if address else None
        if uid is None or (uid != 0 and self.open.get(uid, 0) >= self.per_account):
            stream.close()
            return
        self.open[uid] = self.open.get(uid, 0) + 1
        self.owner_of[id(stream)] = uid
        super().handle_stream(stream, address)

    def on_close(self, server_conn):
        uid = self.owner_of.pop(id(server_conn.stream), None)
        if uid in self.open:
            self.open[uid] -= 1
        super().on_close(server_conn)
