#!/usr/bin/env sh
# Install Debian package PACKAGE with apt-get (as root, or through sudo) unless one of the
# PATHs exists; print the first PATH that exists. Used by the test servers' install.sh scripts
# (make test runs them, one at a time: dpkg has one lock).
# Usage: apt_package.sh PACKAGE PATH [PATH ...]   (a PATH may be a shell glob)
set -eu
package=$1
shift
find_path() {
    for pattern in "$@"; do
        for path in $pattern; do
            if [ -e "$path" ]; then
                echo "$path"
                return 0
            fi
        done
    done
    return 1
}
if ! find_path "$@" >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        SUDO=
    else
        SUDO=sudo
    fi
    # One index download serves every install script of the run (make test runs four):
    # the first downloads it and leaves a stamp, the others find it under an hour old.
    stamp=/tmp/.embedline-apt-updated
    if ! find "$stamp" -mmin -60 2>/dev/null | grep -q .; then
        $SUDO apt-get update -qq
        touch "$stamp"
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$package" >/dev/null
fi
find_path "$@"
