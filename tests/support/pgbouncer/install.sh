#!/usr/bin/env sh
# PgBouncer for the pooler tests (tests/integration/test_pg_pgbouncer.py): the sink loads,
# builds its index and searches through PgBouncer in transaction mode in front of the
# embedded PostgreSQL. Debian's package `pgbouncer`; installed with apt-get as root (or
# through sudo), once. The tests start their own on a free port, whatever the package's
# service does.
# Prints the binary's path.
set -eu
exec "$(dirname "$0")/../apt_package.sh" pgbouncer /usr/sbin/pgbouncer /usr/bin/pgbouncer
