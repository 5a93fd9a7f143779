"""workshop_lib.listeners: who owns the socket a token would go to. Recorded /proc/net/tcp
tables (a listener of root's, a learner's on the same port, IPv6 wildcards and mapped
addresses), then real listeners of this machine, one of another account's; and
workshop_lib.progress keeping a learner's records, token unsent, when a stranger holds the
progress service's port."""
import getpass
import os
import pwd
import socket
import subprocess
import sys

import pytest

from workshop_lib import listeners, progress

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
          "timeout inode\n")


def row(number, local, remote, state, uid):
    """A line of /proc/net/tcp or tcp6, as the kernel writes it."""
    return (f"{number:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 "
            f"{uid:5d}        0 {10 + number}\n")


ANY4, ANY6 = "00000000:0000", "0" * 32 + ":0000"
# 127.0.0.1:884 (root), 0.0.0.0:8000 (uid 1001), and a connection to 127.0.0.1:884 (state 01,
# uid 1001: not a listener).
TCP = HEADER + (row(0, "0100007F:0374", ANY4, "0A", 0) + row(1, "00000000:1F40", ANY4, "0A", 1001)
                + row(2, "0100007F:0374", "0100007F:9C40", "01", 1001))
# [::]:8001 (uid 1002) and [::ffff:127.0.0.1]:884 (uid 1003).
TCP6 = HEADER + (row(0, "0" * 32 + ":1F41", ANY6, "0A", 1002)
                 + row(1, "0000000000000000FFFF00000100007F:0374", ANY6, "0A", 1003))


def test_the_recorded_tables_name_each_listeners_owner():
    assert listeners.owners("127.0.0.1", 884, [TCP]) == {0}
    assert listeners.owners("127.0.0.1", 8000, [TCP]) == {1001}  # a wildcard reaches it
    assert listeners.owners("127.0.0.1", 8001, [TCP, TCP6]) == {1002}
    assert listeners.owners("127.0.0.1", 884, [TCP, TCP6]) == {0, 1003}
    assert listeners.owners("127.0.0.2", 884, [TCP]) == set()


def test_a_token_goes_only_to_the_services_or_roots_listener():
    me = getpass.getuser()
    listeners.check("http://127.0.0.1:884/services/progress/", me, [TCP])
    with pytest.raises(listeners.ListenerError, match="port 8000 is held by .*not by"):
        listeners.check("http://127.0.0.1:8000/", me, [TCP])
    with pytest.raises(listeners.ListenerError, match="port 884 is held"):
        listeners.check("http://127.0.0.1:884/", me, [TCP, TCP6])  # a mapped IPv6 squatter
    listeners.check("http://10.1.2.3:884/", me, [TCP, TCP6])  # another machine: not asked
    with pytest.raises(listeners.ListenerError, match="does not exist"):
        listeners.check("http://127.0.0.1:884/", "no-such-account-here", [TCP])


# The account the checks below expect: not root, and not the stranger's.
EXPECTED = "daemon" if os.geteuid() == 0 else "root"
# A Python every account can run (the test's own may live in root's closed home).
STRANGER_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def stranger_listening():
    """``(process, port)``: a listener on the loopback interface of an account that is
    neither root nor EXPECTED (``nobody`` when this test is root, else this account)."""
    preexec = None
    if os.geteuid() == 0:
        owner = pwd.getpwnam("nobody")
        preexec = lambda: (os.setgid(owner.pw_gid), os.setuid(owner.pw_uid))  # noqa: E731
    code = ("import socket, sys, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(120)\n")
    process = subprocess.Popen([STRANGER_PYTHON, "-S", "-c", code], stdout=subprocess.PIPE,
                               text=True, preexec_fn=preexec, cwd="/")
    return process, int(process.stdout.readline())


def test_a_real_listener_of_another_account_is_refused():
    mine = socket.socket()
    mine.bind(("127.0.0.1", 0))
    mine.listen()
    try:
        listeners.check(f"http://127.0.0.1:{mine.getsockname()[1]}/", getpass.getuser())
    finally:
        mine.close()
    process, port = stranger_listening()
    try:
        with pytest.raises(listeners.ListenerError, match=f"port {port} is held by .*, not "
                                                          f"by {EXPECTED}"):
            listeners.check(f"http://127.0.0.1:{port}/", EXPECTED)
    finally:
        process.kill()
        process.wait()


def test_the_kernel_names_the_owner_at_the_other_end_of_a_connection(monkeypatch):
    """peer_uid: a stranger's connection (nobody's when this test is root) to a server of
    ours is theirs, ours is ours, IPv6 too, a peer that has gone is None; and the tables,
    where sock_diag is missing, say the same."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    preexec = None
    stranger = os.getuid()
    if os.geteuid() == 0:
        owner = pwd.getpwnam("nobody")
        stranger = owner.pw_uid
        preexec = lambda: (os.setgid(owner.pw_gid), os.setuid(owner.pw_uid))  # noqa: E731
    code = ("import socket, sys, time\n"
            f"s = socket.socket(); s.connect(('127.0.0.1', {port}))\n"
            "print('IN', flush=True); sys.stdin.readline()\n")
    process = subprocess.Popen([STRANGER_PYTHON, "-S", "-c", code], stdout=subprocess.PIPE,
                               stdin=subprocess.PIPE, text=True, preexec_fn=preexec, cwd="/")
    six = socket.create_server(("::1", 0), family=socket.AF_INET6)
    try:
        assert process.stdout.readline().strip() == "IN"
        theirs, their_end = server.accept()
        own = socket.create_connection(("127.0.0.1", port))
        ours, our_end = server.accept()
        own6 = socket.create_connection(("::1", six.getsockname()[1]))
        ours6, our_end6 = six.accept()
        for lookup in ("sock_diag", "tables"):
            if lookup == "tables":
                monkeypatch.setattr(listeners, "_diag_uid", lambda *a: (_ for _ in ()).throw(
                    OSError("no sock_diag")))
            assert listeners.peer_uid(their_end, theirs.getsockname()) == stranger, lookup
            assert listeners.peer_uid(our_end, ours.getsockname()) == os.getuid(), lookup
            assert listeners.peer_uid(our_end6, ours6.getsockname()) == os.getuid(), lookup
            assert listeners.peer_uid(("127.0.0.1", 1), ours.getsockname()) is None, lookup
        for connection in (theirs, own, ours, own6, ours6):
            connection.close()
    finally:
        process.stdin.close()
        process.wait(10)
        server.close()
        six.close()


def test_progress_keeps_its_records_when_a_stranger_holds_the_port(tmp_path, monkeypatch):
    process, port = stranger_listening()
    monkeypatch.setenv(progress.PATH_ENV, str(tmp_path / "progress.jsonl"))
    monkeypatch.setenv(progress.URL_ENV, f"http://127.0.0.1:{port}/services/progress/")
    monkeypatch.setenv(progress.TOKEN_ENV, "a-learners-token")
    monkeypatch.setenv(progress.OWNER_ENV, EXPECTED)
    try:
        progress.record("exercise", "sampler", "02_from_one_gpu_to_many", True, "all match")
        assert progress.wait_for_reports(30)
        sent = progress.send_pending()
        assert sent.sent == 0 and sent.pending == 1
        assert f"port {port} is held by" in sent.error and "token was not sent" in sent.error
    finally:
        process.kill()
        process.wait()
