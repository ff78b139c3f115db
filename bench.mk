# SPDX-License-Identifier: LGPL-2.1-or-later
# vmmrt-bench: the A/B benchmark of libvmmrt and its man page (its smoke
# test is tests.mk's).

bin_PROGRAMS += tools/vmmrt-bench
tools_vmmrt_bench_SOURCES = \
	tools/vmmrt-bench.c \
	tools/bench/bench.h \
	tools/bench/model.h \
	tools/bench/options.c \
	tools/bench/modes.c \
	tools/bench/iterate.c \
	tools/bench/metrics.c \
	tools/bench/output.c \
	tools/bench/trace.c \
	tools/bench/trace-file.c \
	tools/bench/sweep.c \
	tools/model/synth.c \
	tools/model/synth.h
# A client of the public API only: it links the installed shared library, and
# its include path is the public header's directory and tools/ (for the
# synthetic model, tools/model/synth.h), not AM_CPPFLAGS (which adds src/),
# so an internal header does not compile here.
tools_vmmrt_bench_CPPFLAGS = -I$(top_srcdir)/include -I$(top_srcdir)/tools
tools_vmmrt_bench_LDADD = libvmmrt.la -lpthread -lm

dist_man_MANS += man/man1/vmmrt-bench.1
