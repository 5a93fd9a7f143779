"""Who listens on a TCP port of this machine: the accounts that own the listening sockets
that a connection to ``host:port`` could reach, read from Linux's ``/proc/net/tcp`` and
``/proc/net/tcp6`` (every account may read them).

``progress`` asks before it sends a learner's token to the class server's progress service
on the loopback interface: a token goes only to a listener of the service's account (or
root's), never to a process some other account left on that port. The service asks who is
at the other end of each connection (``connections``) to cap each account's.

Standard library only (the assessment's kernel imports ``progress``).
"""
import ipaddress
import pwd
import socket
from pathlib import Path
from urllib.parse import urlparse

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN = "0A"  # the state column's code for a listening socket (include/net/tcp_states.h)


class ListenerError(Exception):
    """The token must not go there: one line saying why."""


def _address(hex_address):
    """``/proc/net/tcp``'s address (32 or 128 bits in host-order 32-bit words) as an
    ``ipaddress`` object."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listening(port, texts=None):
    """``[(address, uid), ...]``: every socket listening on ``port``. ``texts`` stands for
    the tables' contents (tests); by default they are read."""
    if texts is None:
        texts = [table.read_text() for table in TABLES if table.exists()]
    found = []
    for text in texts:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8 or fields[3] != LISTEN:
                continue
            hex_address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port:
                found.append((_address(hex_address), int(fields[7])))
    return found


def connections(texts=None):
    """``{(local port, remote port): uid}`` of every connected socket in the tables: a
    server finds who is at the other end of a connection from this machine by its peer's
    port (progress service's guard)."""
    if texts is None:
        texts = [table.read_text() for table in TABLES if table.exists()]
    found = {}
    for text in texts:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[3] != LISTEN:
                local, remote = fields[1].split(":")[1], fields[2].split(":")[1]
                found[(int(local, 16), int(remote, 16))] = int(fields[7])
    return found


def reaches(listener, host):
    """Whether a connection to ``host`` can land on a socket listening on ``listener``:
    the same address, a wildcard, or IPv4 through an IPv6 socket's mapped form."""
    if listener.is_unspecified:
        return True
    mapped = getattr(listener, "ipv4_mapped", None)
    return listener == host or mapped == host


def owners(host, port, texts=None):
    """The uids of the sockets a connection to ``host:port`` could reach."""
    host = ipaddress.ip_address(socket.gethostbyname(host) if host == "localhost" else host)
    return {uid for address, uid in listening(port, texts) if reaches(address, host)}


def check(url, account, texts=None):
    """Raise ``ListenerError`` unless everything listening at ``url`` (on this machine's
    loopback interface) belongs to ``account`` or to root. Addresses elsewhere are not
    checked (another machine's sockets are not in this one's tables)."""
    address = urlparse(url)
    host, port = address.hostname or "", address.port or (443 if address.scheme == "https"
                                                          else 80)
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        return
    try:
        allowed = {0, pwd.getpwnam(account).pw_uid}
    except KeyError:
        raise ListenerError(f"the service's account {account!r} does not exist here") from None
    try:
        found = owners(host, port, texts)
    except OSError as error:
        raise ListenerError(f"cannot tell who listens on port {port}: {error}") from None
    strangers = found - allowed
    if strangers:
        names = ", ".join(_name(uid) for uid in sorted(strangers))
        raise ListenerError(f"port {port} is held by {names}, not by {account}: your token "
                            f"was not sent (tell the instructor)")


def _name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
