#!/usr/bin/env sh
# Chromium for the rendering test of the Prefect UI's artifacts
# (tests/integration/test_artifacts_in_browser.py): the progress and summary artifacts as
# Prefect's UI shows them, headless. Debian's package `chromium`, installed with apt-get as
# root (or through sudo), once; never a browser a test tool downloads itself.
# Prints the binary's path.
set -eu
find_bin() {
    for bin in /usr/bin/chromium /usr/bin/chromium-browser; do
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
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
find_bin
