#!/usr/bin/env sh
# Chromium for the rendering test of the Prefect UI's artifacts
# (tests/integration/test_artifacts_in_browser.py): the progress and summary artifacts as
# Prefect's UI shows them, headless. Debian's package `chromium`, installed with apt-get as
# root (or through sudo), once; never a browser a test tool downloads itself.
# Prints the binary's path.
set -eu
exec "$(dirname "$0")/../apt_package.sh" chromium /usr/bin/chromium /usr/bin/chromium-browser
