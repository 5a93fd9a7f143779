"""Who listens on a TCP port of this machine: the accounts that own the listening sockets
that a connection to ``host:port`` could reach, read from Linux's ``/proc/net/tcp`` and
``/proc/net/tcp6`` (every account may read them).

``progress`` asks before it sends a learner's token to the class server's progress service
on the loopback interface: a token goes only to a listener of the service's account (or
root's), never to a process some other account left on that port. The service asks who is
at the other end of each connection (``peer_uid``) to cap each account's: the kernel looks
the peer's socket up by its addresses (sock_diag over netlink, as ``ss`` does), so the
answer is exact and costs one request however many sockets the machine has; where that is
unavailable, the tables.

Standard library only (the assessment's kernel imports ``progress``).
"""
import ipaddress
import pwd
import socket
import struct
from pathlib import Path
from urllib.parse import urlparse

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN = "0A"  # the state column's code for a listening socket (include/net/tcp_states.h)
# sock_diag (include/uapi/linux/sock_diag.h, inet_diag.h, netlink.h): one socket looked up
# by its addresses; the answer's inet_diag_msg holds the owner's uid after the netlink
# header (16 bytes), family/state/timer/retrans (4), the socket's id (48), expires and the
# queues (12).
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLMSG_ERROR = 4, 20, 1, 2
NO_COOKIE = 0xFFFFFFFF
UID_OFFSET = 16 + 4 + 48 + 12


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


def _diag_uid(peer, local):
    family = socket.AF_INET6 if ":" in peer[0] else socket.AF_INET

    def raw(ip):
        return socket.inet_pton(family, ip).ljust(16, b"\0")

    # The peer's socket: its own end is ``peer``, its other end ``local``.
    sockid = (struct.pack("!HH16s16s", peer[1], local[1], raw(peer[0]), raw(local[0]))
              + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE))
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(2)
        diag.send(header + request)
        answer = diag.recv(8192)
    if struct.unpack_from("=IH", answer)[1] == NLMSG_ERROR:
        return None  # no such socket (the peer has gone)
    return struct.unpack_from("=I", answer, UID_OFFSET)[0]


def peer_uid(peer, local):
    """The uid owning the socket at ``peer`` connected to ``local`` (each ``(ip, port)``)
    on this machine, or None where none is found."""
    try:
        return _diag_uid(peer[:2], local[:2])
    except OSError:  # no sock_diag here (an old kernel, a sandbox): the tables
        return connections().get((peer[1], local[1]))


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
