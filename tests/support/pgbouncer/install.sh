#!/usr/bin/env sh
# PgBouncer for the pooler tests (tests/integration/test_pg_pgbouncer.py): the sink loads,
# builds its index and searches through PgBouncer in transaction mode in front of the
# embedded PostgreSQL. Debian's package `pgbouncer`; installed with apt-get as root (or
# through sudo), once. The tests start their own on a free port, whatever the package's
# service does.
# Prints the binary's path.
set -eu
find_bin() {
    for bin in /usr/sbin/pgbouncer /usr/bin/pgbouncer; do
        if [ -x "$bin" ]; then
            echo "$bin"
            return 0
        fi
    done
    return 1
}
if ! find_bin >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        SUDO=
    else
        SUDO=sudo
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq pgbouncer >/dev/null
fi
find_bin
