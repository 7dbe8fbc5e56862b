#!/usr/bin/env bash
# Installs Debian's chromium for the headless browser test of the live work board
# (cmd/bandplane/board_integration_test.go), if it is missing:
#
#   deploy/local/chromium.sh install   # idempotent; starts nothing
#   deploy/local/chromium.sh path      # prints the binary
set -euo pipefail

say() { echo "chromium: $*" >&2; }
die() { say "$*"; exit 1; }

find_chromium() {
  command -v chromium || command -v chromium-browser || command -v google-chrome || return 1
}

install() {
  if find_chromium >/dev/null; then return 0; fi
  command -v apt-get >/dev/null || die "chromium not found and apt-get is unavailable; install chromium by hand"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "chromium not found; run as root or install sudo"
    sudo=(sudo)
  fi
  say "installing Debian package chromium ..."
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then "${sudo[@]}" apt-get update -q; fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium \
    || { "${sudo[@]}" apt-get update -q &&
         "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; } \
    || die "apt-get install chromium failed"
  find_chromium >/dev/null || die "chromium still not found after installing the package"
}

case "${1:-}" in
  install) install ;;
  path) find_chromium || die "chromium is not installed (deploy/local/chromium.sh install)" ;;
  *) echo "usage: $0 install|path" >&2; exit 2 ;;
esac
