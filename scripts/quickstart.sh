#!/usr/bin/env bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# Quick start for a fresh Debian or Ubuntu machine, from the project's root:
# installs what is missing (with apt-get), configures, builds, runs the
# smallest example and then the main program, vmmrt-bench (about 10 s without
# a GPU, a minute on one).
#
# It installs what `make check` needs to run every test that needs no GPU:
# the C build and test tools, python3 with venv, and Debian's CPU-only
# PyTorch, pytest and libabigail (for the Python package's tests and the ABI
# check: about 950 MB installed, 300 packages with their dependencies).
# `--minimal` leaves those three out: make check then skips the Python
# tests and the ABI check.
# `--no-run` stops after the build (this is what CI uses).
# Extra arguments after `--` go to ./configure.
set -euo pipefail
cd "$(dirname "$0")/.."

run=yes
minimal=no
configure_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-run) run=no ;;
    --minimal) minimal=yes ;;
    --) shift; configure_args=("$@"); break ;;
    *) echo "usage: $0 [--no-run] [--minimal] [-- configure-args...]" >&2; exit 2 ;;
  esac
  shift
done

pkgs="build-essential autoconf automake libtool pkg-config liburcu-dev libck-dev libcmocka-dev mandoc python3 python3-venv"
[ "$minimal" = yes ] || pkgs="$pkgs python3-torch python3-pytest abigail-tools"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "quickstart: installing$missing"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure "${configure_args[@]}"
make -j"$(nproc)"

if [ "$run" = yes ]; then
  ./examples/vmmrt-example
  echo
  ./tools/vmmrt-bench --quiet
  echo
fi

# The last line: what a PyTorch user runs next. Debian's own python3 refuses
# pip (it is managed by apt), so without a venv of theirs, one that still
# sees Debian's python3-torch.
if [ -n "${VIRTUAL_ENV:-}" ]; then
  echo "quickstart: done. For PyTorch, install the vmmrt package into your venv: $VIRTUAL_ENV/bin/python -m pip install ./python"
else
  echo "quickstart: done. For PyTorch, install the vmmrt package for the python you train with (PYTHON -m pip install ./python), or into a new venv: python3 -m venv --system-site-packages ~/venv && ~/venv/bin/python -m pip install ./python"
fi
