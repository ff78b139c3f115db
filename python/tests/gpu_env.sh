# SPDX-License-Identifier: LGPL-2.1-or-later
# Sourced by gpu_run.sh and ddp_run.sh with $tree set (the built release
# tree or a checkout): the library, its dependencies and the package, for
# python3 on the GPU machine. The library: $VMMRT_LIBRARY, else
# <tree>/.libs/libvmmrt.so.1, else the one on-device.sh built under
# /tmp/build/libvmmrt-*/ (its dependencies, liburcu and ck, in /opt/deps).
if [ -z "${VMMRT_LIBRARY:-}" ]; then
	for cand in "$tree/.libs/libvmmrt.so.1" /tmp/build/libvmmrt-*/.libs/libvmmrt.so.1; do
		if [ -f "$cand" ]; then VMMRT_LIBRARY=$cand; break; fi
	done
fi
export VMMRT_LIBRARY
[ -d /opt/deps/usr/lib/x86_64-linux-gnu ] &&
	export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$tree/python:$tree/python/tests${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1
# The runs choose these themselves; a value exported for the machine would override them.
unset VMMRT_MODE VMMRT_LOOKAHEAD VMMRT_BACKEND VMMRT_TRACE
