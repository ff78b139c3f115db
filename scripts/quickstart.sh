#!/usr/bin/env bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# Quick start for a fresh Debian or Ubuntu machine, from the project's root:
# installs what is missing (with apt-get), configures, builds, runs the
# smallest example and then the main program, vmmrt-bench (about 10 s without
# a GPU, a minute on one). `--no-run` stops after the build (this is what CI uses).
# Extra arguments after `--` go to ./configure.
set -euo pipefail
cd "$(dirname "$0")/.."

run=yes
configure_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-run) run=no ;;
    --) shift; configure_args=("$@"); break ;;
    *) echo "usage: $0 [--no-run] [-- configure-args...]" >&2; exit 2 ;;
  esac
  shift
done

pkgs="build-essential autoconf automake libtool pkg-config liburcu-dev libck-dev libcmocka-dev mandoc"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "quickstart: installing$missing"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi

[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure "${configure_args[@]}"
make -j"$(nproc)"

if [ "$run" = yes ]; then
  ./examples/vmmrt-example
  echo
  ./tools/vmmrt-bench --quiet
fi
