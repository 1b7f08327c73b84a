#!/usr/bin/env sh
# libfaketime for the clock-skew tests (tests/integration/test_gc_clock.py, test_run_clock.py):
# they run `embedline gc` and `embedline run` with their clock 20 minutes ahead and behind (a
# run also puts this directory first on PYTHONPATH: its sitecustomize.py works around
# libfaketime's time.sleep failing with EINVAL). Debian's package `faketime`;
# installed with apt-get as root (or through sudo), once. Prints the library's path.
set -eu
exec "$(dirname "$0")/../apt_package.sh" faketime '/usr/lib/*/faketime/libfaketime.so.1' /usr/lib/faketime/libfaketime.so.1
