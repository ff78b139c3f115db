# SPDX-License-Identifier: LGPL-2.1-or-later
# vmmrt-torture, its man page, the torture runs of `make check`, `make torture`
# (the long run) and `make fuzz` (the libFuzzer API fuzzer, built with clang).
# Included at the end of Makefile.am, after bin_PROGRAMS, TESTS, EXTRA_DIST,
# AM_TESTS_ENVIRONMENT and dist_man_MANS are first set:
#   include $(srcdir)/torture.mk

# Built in the tree, not installed: it injects faults through the library's
# test switches (src/testing.h), which the installed libvmmrt.so does not have.
noinst_PROGRAMS += tools/vmmrt-torture
tools_vmmrt_torture_SOURCES = \
	tools/torture/main.c \
	tools/torture/faults.c \
	tools/torture/scenario.c \
	tools/torture/illegal.c \
	tools/torture/stacks.c \
	tools/torture/torture.h \
	tools/torture/scenario.h
# It sets the fault hook and reads the live-object counts (internal headers),
# so it links the convenience library, not libvmmrt.la (public API only).
tools_vmmrt_torture_LDADD = libvmmrt-testing.la libvmmrt-core.la $(URCU_LIBS) $(CK_LIBS) -lpthread -lm
# -export-dynamic (-rdynamic): the stacks of a hang or crash name the
# executable's global functions (the library's included) through dladdr().
tools_vmmrt_torture_LDFLAGS = $(AM_LDFLAGS) -export-dynamic

# Its page ships in the tarball and is read in the tree: man ./man/man1/vmmrt-torture.1
EXTRA_DIST += man/man1/vmmrt-torture.1

# ---- make check: a short clean run, the planted bugs (each must make the run
# fail), the report of a hang (every thread's stack), and the fuzzer's corpus
# and regression inputs replayed by a plain (gcc) build of the fuzz target.
# TAP scripts: run through SH_LOG_DRIVER when TEST_EXTENSIONS has .sh
# (man.mk), else directly (they are executable).
TESTS += \
	tests/torture/short.sh \
	tests/torture/planted.sh \
	tests/torture/hang.sh \
	tests/fuzz/replay.sh
EXTRA_DIST += \
	tests/torture/short.sh \
	tests/torture/planted.sh \
	tests/torture/hang.sh \
	tests/fuzz/replay.sh \
	tests/fuzz/corpus \
	tests/fuzz/regress \
	tests/fuzz/known \
	tests/fuzz/make-corpus.py \
	tests/tsan.supp
# Regression tests of the library bugs the torture found and that were fixed.
check_PROGRAMS += tests/unit/test-remap-order
TESTS += tests/unit/test-remap-order
tests_unit_test_remap_order_SOURCES = tests/unit/test-remap-order.c
tests_unit_test_remap_order_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_remap_order_LDADD = $(TEST_LDADD)

check_PROGRAMS += tests/unit/test-torture-regress
TESTS += tests/unit/test-torture-regress
tests_unit_test_torture_regress_SOURCES = tests/unit/test-torture-regress.c
tests_unit_test_torture_regress_CFLAGS = $(TEST_CFLAGS)
tests_unit_test_torture_regress_LDADD = $(TEST_LDADD)

check_PROGRAMS += tests/fuzz/fuzz-replay
tests_fuzz_fuzz_replay_SOURCES = tests/fuzz/fuzz-api.c tests/fuzz/fuzz-replay.c
tests_fuzz_fuzz_replay_LDADD = libvmmrt-testing.la libvmmrt-core.la $(URCU_LIBS) $(CK_LIBS) -lpthread

AM_TESTS_ENVIRONMENT += \
	TORTURE=$(abs_top_builddir)/tools/vmmrt-torture$(EXEEXT); export TORTURE; \
	FUZZ_REPLAY=$(abs_top_builddir)/tests/fuzz/fuzz-replay$(EXEEXT); export FUZZ_REPLAY; \
	FUZZ_INPUTS=$(abs_top_srcdir)/tests/fuzz; export FUZZ_INPUTS;

# ThreadSanitizer does not see liburcu's and ck's inline-assembly atomics: the
# library annotates its hand-offs (src/tsan.h), and tests/tsan.supp names what
# is left in those libraries, each entry with its reason. handle_segv=0: the
# tests that expect a fault (a read of an unmapped slot) must die of SIGSEGV,
# not of TSan's report of it. die_after_fork=0: those tests fork a child that
# starts threads while liburcu's call_rcu thread runs in the parent.
if SANITIZE_THREAD
AM_TESTS_ENVIRONMENT += \
	TSAN_OPTIONS="suppressions=$(abs_top_srcdir)/tests/tsan.supp handle_segv=0 die_after_fork=0 second_deadlock_stack=1 $${TSAN_OPTIONS:-}"; \
	export TSAN_OPTIONS; TORTURE_SANITIZER=thread; export TORTURE_SANITIZER;
endif

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
# tests/fuzz/regress/ so `make check` replays it.
FUZZ_CC = clang
FUZZ_TIME = 300
FUZZ_SANITIZE = -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS = -g -O1 -std=gnu11 -fno-omit-frame-pointer
FUZZ_FLAGS = -timeout=60 -rss_limit_mb=4096 -max_len=1024
fuzz_target = tests/fuzz/vmmrt-fuzz
fuzz_sources = tests/fuzz/fuzz-api.c $(libvmmrt_core_la_SOURCES) $(libvmmrt_testing_la_SOURCES)

$(fuzz_target): $(fuzz_sources) $(nodist_libvmmrt_core_la_SOURCES) config.h
	$(AM_V_GEN)$(MKDIR_P) tests/fuzz && \
	srcs=; for f in $(fuzz_sources); do \
	  case $$f in *.c) srcs="$$srcs $(srcdir)/$$f";; esac; done; \
	for f in $(nodist_libvmmrt_core_la_SOURCES) ''; do \
	  case $$f in *.c) srcs="$$srcs $$f";; esac; done; \
	$(FUZZ_CC) $(FUZZ_SANITIZE) $(FUZZ_CFLAGS) -DHAVE_CONFIG_H -I$(top_builddir) \
	  -I$(top_srcdir)/include -I$(top_srcdir)/src $(URCU_CFLAGS) $(CK_CFLAGS) $(CUDA_CPPFLAGS) \
	  $$srcs -o $@ $(URCU_LIBS) $(CK_LIBS) $(LIBS) -lpthread -lm

fuzz: $(fuzz_target)
	rm -rf tests/fuzz/work && $(MKDIR_P) tests/fuzz/work tests/fuzz/findings && \
	cp $(srcdir)/tests/fuzz/corpus/* tests/fuzz/work/ && \
	ASAN_OPTIONS="detect_leaks=1 $${ASAN_OPTIONS:-}" ./$(fuzz_target) $(FUZZ_FLAGS) \
	  -max_total_time=$(FUZZ_TIME) \
	  -artifact_prefix=tests/fuzz/findings/ -print_final_stats=1 tests/fuzz/work
.PHONY: fuzz

CLEANFILES = $(fuzz_target)
clean-local: clean-fuzz
clean-fuzz:
	rm -rf tests/fuzz/work tests/fuzz/findings fuzz-*.log
.PHONY: clean-fuzz

# ThreadSanitizer builds see liburcu's atomics as compiler atomics (src/tsan.h).
if SANITIZE_THREAD
AM_CPPFLAGS += -include $(top_srcdir)/src/tsan.h
endif
