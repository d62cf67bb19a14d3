#!/usr/bin/env bash
# Debian's chromium for the report's screenshot tests (tests/test_report.py,
# tests/test_report_viewer.py), installed with apt-get where it is missing: `make install` runs
# this. The tests fail without it, naming it, so a failed install says so here, with the fix.
set -uo pipefail
[ -x /usr/bin/chromium ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "make install: no apt-get here to install chromium; install a chromium at /usr/bin/chromium for the report's screenshot tests" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; fi
apt_get() { $sudo env DEBIAN_FRONTEND=noninteractive apt-get "$@"; }
if apt_get update -qq && apt_get install -y -qq chromium >/dev/null; then
  echo "make install: installed chromium for the report's screenshot tests"
else
  echo "make install: apt-get could not install chromium (run 'apt-get install chromium' as root); the report's screenshot tests need it" >&2
  exit 1
fi
