# SPDX-License-Identifier: LGPL-2.1-or-later
# vmmrt-bench: the A/B benchmark of libvmmrt, its man page and its smoke test.
# Included from Makefile.am, after bin_PROGRAMS, TESTS, EXTRA_DIST and
# dist_man_MANS are first set:
#   include $(srcdir)/bench.mk

bin_PROGRAMS += tools/vmmrt-bench
tools_vmmrt_bench_SOURCES = \
	tools/vmmrt-bench.c \
	tools/bench/bench.h \
	tools/bench/model.h \
	tools/bench/modes.c \
	tools/bench/iterate.c \
	tools/bench/metrics.c \
	tools/bench/output.c \
	tools/bench/trace.c \
	tools/bench/sweep.c
# It uses internal headers (timing events, the runtime's trace and copy
# streams), so it links the convenience library rather than libvmmrt.la,
# whose exported symbols are the public API only.
tools_vmmrt_bench_LDADD = libvmmrt-core.la $(URCU_LIBS) $(CK_LIBS) -lpthread -lm

dist_man_MANS += man/man1/vmmrt-bench.1

# A TAP script: with man.mk's TEST_EXTENSIONS = .sh it runs through
# SH_LOG_DRIVER (the TAP driver) under $(SHELL); without it, through the
# generic LOG_DRIVER, directly (it is executable).
TESTS += tests/bench-smoke.sh
EXTRA_DIST += tests/bench-smoke.sh
