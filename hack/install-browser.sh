#!/usr/bin/env bash
# Installs Debian's Chromium once per machine: the bundle report's test renders the HTML report in
# it headless (no registry serves a browser build; Debian's packages do). Prints the browser path.
set -euo pipefail
tag=browser
source "$(dirname "$0")/lib.sh"

if ! command -v chromium >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || fail "install chromium" "installing Debian's chromium needs root (or install it yourself: apt-get install chromium)"
  step "installing Debian's chromium (once per machine)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
    || fail "install chromium" "apt-get install chromium failed (is deb.debian.org reachable?)"
fi
command -v chromium
