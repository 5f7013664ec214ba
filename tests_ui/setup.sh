#!/usr/bin/env bash
# What `make test-ui` needs beyond the project's venv: Debian's chromium (apt-get, as root)
# and playwright (requirements-ui.lock, into .venv). Each missing piece is installed where
# possible; otherwise one line says what to do.
set -uo pipefail
cd "$(dirname "$0")/.."
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test-ui: installing Debian's chromium (apt-get install chromium)"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/tmp/darel-test-ui-apt.log 2>&1; then
            echo "test-ui: apt-get install chromium failed (log: /tmp/darel-test-ui-apt.log); install it, or set CHROMIUM=/path/to/chromium" >&2
            exit 1
        fi
    else
        echo "test-ui: needs Debian's chromium at $CHROMIUM: as root run apt-get install chromium (or set CHROMIUM=/path/to/chromium)" >&2
        exit 1
    fi
    if [ ! -x "$CHROMIUM" ]; then
        echo "test-ui: chromium is installed but not at $CHROMIUM; set CHROMIUM=/path/to/chromium" >&2
        exit 1
    fi
fi
if ! .venv/bin/python -c "import playwright" 2>/dev/null; then
    if ! .venv/bin/python -m pip install -q -r requirements-ui.lock >/tmp/darel-test-ui-pip.log 2>&1; then
        echo "test-ui: could not install playwright (pip install -r requirements-ui.lock; log: /tmp/darel-test-ui-pip.log)" >&2
        exit 1
    fi
fi
