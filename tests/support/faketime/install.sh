#!/usr/bin/env sh
# libfaketime for the clock-skew tests (tests/integration/test_gc_clock.py, test_run_clock.py):
# they run `embedline gc` and `embedline run` with their clock 20 minutes ahead and behind (a
# run also puts this directory first on PYTHONPATH: its sitecustomize.py works around
# libfaketime's time.sleep failing with EINVAL). Debian's package `faketime`;
# installed with apt-get as root (or through sudo), once. Prints the library's path.
set -eu
find_lib() {
    for lib in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
        if [ -e "$lib" ]; then
            echo "$lib"
            return 0
        fi
    done
    return 1
}
if ! find_lib >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        SUDO=
    else
        SUDO=sudo
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq faketime >/dev/null
fi
find_lib
