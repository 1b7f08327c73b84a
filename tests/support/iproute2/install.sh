#!/usr/bin/env sh
# iproute2's `ip` for the tests that put a Dask scheduler and workers on separate machines as
# far as the network goes (tests/support/netns.py: `ip netns`, veth pairs, a bridge; as root).
# Debian's package `iproute2`; installed with apt-get as root (or through sudo), once. Prints
# the command's path.
set -eu
exec "$(dirname "$0")/../apt_package.sh" iproute2 /usr/sbin/ip /sbin/ip /usr/bin/ip /bin/ip
