"""Start a hub service on a port no learner can take: bind it as root, become the service's
account, and run the service on that socket.

    python listen.py --user ACCOUNT --url http://127.0.0.1:PORT -- COMMAND [ARGS...]

The hub runs this as root (jupyterhub_config.py: the formgrader and the progress service).
A port below the host's ``net.ipv4.ip_unprivileged_port_start`` (1024 unless lowered) needs
root to bind, so no learner's process can hold it while the hub restarts, nor answer there
in the service's place and collect the tokens sent to it. The service never gets that right
itself: the socket is bound before this process becomes ACCOUNT, and is handed to COMMAND as
an open file descriptor, its number in ``$CLASSROOM_LISTEN_FD`` (progress/service.py and
grader/formgrader.py serve on it).
"""
import argparse
import os
import pwd
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

FD_ENV = "CLASSROOM_LISTEN_FD"
UNPRIVILEGED_START = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")


def unprivileged_start():
    """The lowest port any account may bind on this host (1024 where the file is absent)."""
    try:
        return int(UNPRIVILEGED_START.read_text())
    except (OSError, ValueError):
        return 1024


def bind(url):
    """A listening socket on ``url``'s address and port (bound as the caller: root)."""
    address = urlparse(url)
    family = socket.AF_INET6 if ":" in (address.hostname or "") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address.hostname, address.port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def become(user):
    """Drop root for good: ``user``'s groups, group and user, and its home."""
    entry = pwd.getpwnam(user)
    os.initgroups(user, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    if 0 in (os.getuid(), os.geteuid(), os.getgid(), os.getegid()):
        raise RuntimeError(f"still root after becoming {user}")
    os.environ.update(HOME=entry.pw_dir, USER=user, LOGNAME=user, SHELL=entry.pw_shell)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user", required=True, help="the service's account")
    parser.add_argument("--url", required=True, help="http://ADDRESS:PORT to listen on")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the service's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the service's command after --")
    port = urlparse(args.url).port
    if port is None or port >= unprivileged_start():
        sys.exit(f"listen: port {port} of {args.url} can be bound by any account on this host "
                 f"(ports from {unprivileged_start()} can): give the service a port below it")
    try:
        sock = bind(args.url)
    except OSError as error:
        sys.exit(f"listen: cannot listen on {args.url}: {error.strerror} (another process "
                 f"holds it? `ss -ltnp 'sport = :{port}'` names it)")
    become(args.user)
    os.environ[FD_ENV] = str(sock.fileno())
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
