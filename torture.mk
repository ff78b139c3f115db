# SPDX-License-Identifier: LGPL-2.1-or-later
# vmmrt-torture and its man page, `make torture` (the long run) and `make fuzz`
# (the libFuzzer API fuzzer, built with clang). The torture runs of `make
# check` and the fuzzer's replay are tests.mk's.

# Built in the tree, not installed: it injects faults through the library's
# test switches (src/testing.h), which the installed libvmmrt.so does not have.
noinst_PROGRAMS += tools/vmmrt-torture
tools_vmmrt_torture_SOURCES = \
	tools/torture/main.c \
	tools/torture/faults.c \
	tools/torture/scenario.c \
	tools/torture/settings.c \
	tools/torture/verify.c \
	tools/torture/capture.c \
	tools/torture/teardown.c \
	tools/torture/illegal.c \
	tools/torture/edges.c \
	tools/torture/slots.c \
	tools/torture/pages.c \
	tools/torture/stacks.c \
	tools/torture/torture.h \
	tools/torture/scenario.h \
	tools/model/synth.c \
	tools/model/synth.h
tools_vmmrt_torture_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/tools
# It sets the fault hook and reads the live-object counts (internal headers),
# so it links the convenience library, not libvmmrt.la (public API only).
tools_vmmrt_torture_LDADD = libvmmrt-testing.la $(URCU_LIBS) $(CK_LIBS) -lpthread -lm
# -export-dynamic (-rdynamic): the stacks of a hang or crash name the
# executable's global functions (the library's included) through dladdr().
tools_vmmrt_torture_LDFLAGS = $(AM_LDFLAGS) -export-dynamic

# Its page ships in the tarball and is read in the tree: man ./man/man1/vmmrt-torture.1
EXTRA_DIST += man/man1/vmmrt-torture.1

# ---- make torture: the long run (TORTURE_DURATION, default 10 minutes).
TORTURE_DURATION = 10m
TORTURE_THREADS = 2
TORTURE_FLAGS =
torture: tools/vmmrt-torture$(EXEEXT)
	./tools/vmmrt-torture$(EXEEXT) --duration=$(TORTURE_DURATION) --threads=$(TORTURE_THREADS) $(TORTURE_FLAGS)
.PHONY: torture

# ---- make fuzz: the libFuzzer target, built by clang straight from the
# library's sources (so the gcc build needs no clang at all), run for
# FUZZ_TIME seconds on a copy of the seed corpus. New crashes land in
# tests/fuzz/findings/ (crash-*, leak-*): fix, then add the input to
# tests/regression/fuzz/ so `make check` replays it.
FUZZ_CC = clang
FUZZ_TIME = 300
FUZZ_SANITIZE = -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS = -g -O1 -std=gnu11 -fno-omit-frame-pointer
FUZZ_FLAGS = -timeout=60 -rss_limit_mb=4096 -max_len=1024
fuzz_target = tests/fuzz/vmmrt-fuzz
fuzz_sources = tests/fuzz/fuzz-api.c $(libvmmrt_base_la_SOURCES) $(libvmmrt_testing_la_SOURCES)

$(fuzz_target): $(fuzz_sources) $(nodist_libvmmrt_base_la_SOURCES) config.h
	$(AM_V_GEN)$(MKDIR_P) tests/fuzz && \
	srcs=; for f in $(fuzz_sources); do \
	  case $$f in *.c) srcs="$$srcs $(srcdir)/$$f";; esac; done; \
	for f in $(nodist_libvmmrt_base_la_SOURCES) ''; do \
	  case $$f in *.c) srcs="$$srcs $$f";; esac; done; \
	$(FUZZ_CC) $(FUZZ_SANITIZE) $(FUZZ_CFLAGS) -DHAVE_CONFIG_H -I$(top_builddir) \
	  -DVMMRT__TESTING -I$(top_srcdir)/include -I$(top_srcdir)/src $(URCU_CFLAGS) $(CK_CFLAGS) $(CUDA_CPPFLAGS) \
	  $$srcs -o $@ $(URCU_LIBS) $(CK_LIBS) $(LIBS) -lpthread -lm

fuzz: $(fuzz_target)
	rm -rf tests/fuzz/work && $(MKDIR_P) tests/fuzz/work tests/fuzz/findings && \
	cp $(srcdir)/tests/fuzz/corpus/* tests/fuzz/work/ && \
	ASAN_OPTIONS="detect_leaks=1 $${ASAN_OPTIONS:-}" ./$(fuzz_target) $(FUZZ_FLAGS) \
	  -max_total_time=$(FUZZ_TIME) \
	  -artifact_prefix=tests/fuzz/findings/ -print_final_stats=1 tests/fuzz/work
.PHONY: fuzz

CLEANFILES += $(fuzz_target)
clean-local: clean-fuzz
clean-fuzz:
	rm -rf tests/fuzz/work tests/fuzz/findings fuzz-*.log
.PHONY: clean-fuzz
