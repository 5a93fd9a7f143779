#!/bin/bash
# The network interface this node reaches ADDRESS (a host name or an IPv4 address) by, for
# GLOO_SOCKET_IFNAME: on the node that holds the address (the rendezvous host itself, whose
# route to its own address is the loopback), the interface holding it; on the others, the
# one the route to it leaves by. Without GLOO_SOCKET_IFNAME gloo binds to the address the
# node's own name resolves to: on hosts whose /etc/hosts maps the name to 127.0.1.1 (Debian
# and Ubuntu do), the loopback, which no other node reaches.
#   deploy/interface_for.sh head-node-name    ->  eth0
set -euo pipefail
addr=$(getent ahostsv4 "$1" | awk 'NR == 1 {print $1}') || true
if [ -z "$addr" ]; then
    echo "error: $1 resolves to no IPv4 address here; set GLOO_SOCKET_IFNAME to the interface" \
         "the nodes reach each other by (ip -br addr lists them)" >&2
    exit 1
fi
held=$(ip -o -4 addr show | awk -v a="$addr" 'index($4, a "/") == 1 {print $2; exit}')
if [ -n "$held" ]; then
    echo "$held"
else
    ip -o -4 route get "$addr" | grep -o 'dev [^ ]*' | head -n 1 | cut -d' ' -f2
fi
