# SPDX-License-Identifier: LGPL-2.1-or-later
# Every test of `make check`: the check programs, the TESTS list, how they
# run (the TAP driver, a time limit each, the environment they read) and the
# targets that run a part of them on a GPU machine (gpu-check, gpu-suite).
#
#  tests/unit        one concept each: options, the host backend, slots
#                    (and their stream-ordered backing), the arena, workers, offload, schedules (1F1B, abort, re-discovery),
#                    streams
#  tests/regression  bugs found and fixed (remap order, the torture's), the
#                    fuzzer's regression inputs, the planted bugs
#  tests/torture     short torture runs, the report of a hang
#  tests/fuzz        the fuzz target and its seed corpus, replayed
#  tests/gpu         the CUDA backend (they skip without a GPU)
#  tests/abi         what a program that links or dlopen()s libvmmrt.so sees
#  tests/install     what a consumer of the install sees (make installcheck)
#  tests/benchmark   micro-benchmarks: built, not run
#  tests/common      what the tests share (helpers, the offload model, the
#                    time limit)
#  tests/*.sh        checks of the tree: SPDX lines, layering, comments that
#                    name what exists, man pages,
#                    the bench's smoke test, the Python package

# The cmocka programs: the internal headers, tests/common, the synthetic
# model (tools/model) and cmocka; the library with its test switches,
# libvmmrt-testing.la (the default LDADD: every other program of the tree
# names its own).
TEST_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/tests/common -I$(top_srcdir)/tools $(CMOCKA_CFLAGS)
LDADD = libvmmrt-testing.la $(CMOCKA_LIBS) $(URCU_LIBS) $(CK_LIBS)
test_model = tests/common/offload-model.c tests/common/offload-model.h tools/model/synth.c tools/model/synth.h tests/common/test-common.h tests/common/check-ok.h tests/common/test-layers.h

# ------------------------------------------------------------ how they run
# Every test speaks TAP, through one driver, under a time limit: a test that
# hangs (a deadlock) fails with a message naming it instead of holding make
# check for ever (tests/common/timeout.sh; TEST_TIMEOUT_S overrides it).
LOG_DRIVER = env AM_TAP_AWK='$(AWK)' $(SHELL) $(top_srcdir)/build-aux/tap-driver.sh
LOG_COMPILER = $(SHELL) $(top_srcdir)/tests/common/timeout.sh
TEST_EXTENSIONS = .sh
SH_LOG_DRIVER = $(LOG_DRIVER)
SH_LOG_COMPILER = $(SHELL) $(top_srcdir)/tests/common/timeout.sh $(SHELL)
if SANITIZE_THREAD
TEST_TIMEOUT = 1800
else
TEST_TIMEOUT = 300
endif

AM_TESTS_ENVIRONMENT += \
	CMOCKA_MESSAGE_OUTPUT=TAP; export CMOCKA_MESSAGE_OUTPUT; \
	TEST_TIMEOUT_S=$${TEST_TIMEOUT_S:-$(TEST_TIMEOUT)}; export TEST_TIMEOUT_S; \
	LIBVMMRT_SO=$(abs_top_builddir)/.libs/$(VMMRT_SONAME); export LIBVMMRT_SO; \
	LIBVMMRT_SONAME=$(VMMRT_SONAME); export LIBVMMRT_SONAME; \
	NM='$(NM)'; export NM; READELF='$(READELF)'; export READELF; ABIDIFF='$(ABIDIFF)'; export ABIDIFF; \
	CC='$(CC)'; export CC; CXX='$(CXX)'; export CXX; CUDA_CPPFLAGS='$(CUDA_CPPFLAGS)'; export CUDA_CPPFLAGS; \
	SANITIZED_BUILD='$(SAN_CFLAGS)'; export SANITIZED_BUILD; \
	TORTURE=$(abs_top_builddir)/tools/vmmrt-torture$(EXEEXT); export TORTURE; \
	FUZZ_REPLAY=$(abs_top_builddir)/tests/fuzz/fuzz-replay$(EXEEXT); export FUZZ_REPLAY; \
	FUZZ_INPUTS=$(abs_top_srcdir)/tests/fuzz; export FUZZ_INPUTS; \
	FUZZ_REGRESS=$(abs_top_srcdir)/tests/regression/fuzz; export FUZZ_REGRESS;

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

# ------------------------------------------------------------ unit
unit_tests = \
	tests/unit/test-options \
	tests/unit/test-host-backend \
	tests/unit/test-slot \
	tests/unit/test-slot-async \
	tests/unit/test-slot-stream \
	tests/unit/test-pages \
	tests/unit/test-arena \
	tests/unit/test-worker \
	tests/unit/test-offload \
	tests/unit/test-schedule \
	tests/unit/test-streams \
	tests/unit/test-remap-yield
tests_unit_test_options_SOURCES = tests/unit/test-options.c
tests_unit_test_options_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_host_backend_SOURCES = tests/unit/test-host-backend.c tests/common/backend-check.h tests/common/check-ok.h
tests_unit_test_host_backend_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_slot_SOURCES = tests/unit/test-slot.c tests/common/test-common.h tests/common/check-ok.h tests/common/test-layers.h
tests_unit_test_slot_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_slot_async_SOURCES = tests/unit/test-slot-async.c tests/common/test-common.h tests/common/check-ok.h tests/common/test-layers.h
tests_unit_test_slot_async_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_slot_stream_SOURCES = tests/unit/test-slot-stream.c tests/common/test-common.h tests/common/check-ok.h tests/common/test-layers.h
tests_unit_test_slot_stream_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_pages_SOURCES = tests/unit/test-pages.c tests/common/test-common.h tests/common/check-ok.h tests/common/test-layers.h
tests_unit_test_pages_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_arena_SOURCES = tests/unit/test-arena.c tests/common/test-common.h tests/common/check-ok.h tests/common/test-layers.h
tests_unit_test_arena_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_worker_SOURCES = tests/unit/test-worker.c tests/common/test-common.h tests/common/check-ok.h tests/common/test-layers.h
tests_unit_test_worker_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_offload_SOURCES = tests/unit/test-offload.c $(test_model)
tests_unit_test_offload_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_schedule_SOURCES = tests/unit/test-schedule.c $(test_model)
tests_unit_test_schedule_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_streams_SOURCES = tests/unit/test-streams.c $(test_model)
tests_unit_test_streams_CPPFLAGS = $(TEST_CPPFLAGS)
tests_unit_test_remap_yield_SOURCES = tests/unit/test-remap-yield.c
tests_unit_test_remap_yield_CPPFLAGS = $(TEST_CPPFLAGS)

# ------------------------------------------------------------ regression
regression_tests = \
	tests/regression/test-remap-order \
	tests/regression/test-torture-regress
tests_regression_test_remap_order_SOURCES = tests/regression/test-remap-order.c tests/common/test-layers.h
tests_regression_test_remap_order_CPPFLAGS = $(TEST_CPPFLAGS)
tests_regression_test_torture_regress_SOURCES = tests/regression/test-torture-regress.c tests/common/test-layers.h
tests_regression_test_torture_regress_CPPFLAGS = $(TEST_CPPFLAGS)

# ------------------------------------------------------------ gpu
gpu_tests = tests/gpu/test-cuda-backend tests/gpu/test-two-devices
tests_gpu_test_cuda_backend_SOURCES = tests/gpu/test-cuda-backend.c tests/common/backend-check.h tests/common/check-ok.h
tests_gpu_test_cuda_backend_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_gpu_test_two_devices_SOURCES = tests/gpu/test-two-devices.c $(test_model)
tests_gpu_test_two_devices_CPPFLAGS = $(TEST_CPPFLAGS)

# ------------------------------------------------------------ abi
abi_tests = tests/abi/exports.sh tests/abi/abi.sh tests/abi/header.sh tests/abi/ctypes.sh tests/abi/test-dlopen
tests_abi_test_dlopen_SOURCES = tests/abi/test-dlopen.c
tests_abi_test_dlopen_CPPFLAGS = $(AM_CPPFLAGS) $(CMOCKA_CFLAGS)
tests_abi_test_dlopen_LDADD = $(CMOCKA_LIBS) -ldl -lpthread

# ------------------------------------------------------------ fuzz replay
# The fuzz target built by gcc, replaying the seed corpus and the regression
# inputs (make fuzz builds the libFuzzer one: torture.mk).
tests_fuzz_fuzz_replay_SOURCES = tests/fuzz/fuzz-api.c tests/fuzz/fuzz-replay.c
tests_fuzz_fuzz_replay_LDADD = libvmmrt-testing.la $(URCU_LIBS) $(CK_LIBS) -lpthread

# ------------------------------------------------------------ scripts
torture_tests = tests/torture/short.sh tests/torture/hang.sh tests/regression/planted.sh
tree_tests = tests/spdx.sh tests/layering.sh tests/comment-refs.sh tests/man-check.sh tests/doc-headings.sh tests/bench-smoke.sh \
	tests/python.sh

check_PROGRAMS += $(unit_tests) $(regression_tests) $(gpu_tests) tests/abi/test-dlopen tests/fuzz/fuzz-replay
TESTS += $(unit_tests) $(regression_tests) $(gpu_tests) $(abi_tests) $(torture_tests) tests/fuzz/replay.sh \
	$(tree_tests)

# ------------------------------------------------------------ benchmarks (built)
noinst_PROGRAMS += tests/benchmark/vmmrt-handoff tests/benchmark/vmmrt-gap-probe
tests_benchmark_vmmrt_handoff_SOURCES = tests/benchmark/handoff.c
tests_benchmark_vmmrt_handoff_LDADD = libvmmrt-core.la $(URCU_LIBS) $(CK_LIBS)
tests_benchmark_vmmrt_gap_probe_SOURCES = tests/benchmark/gap-probe.c
tests_benchmark_vmmrt_gap_probe_LDADD = libvmmrt-core.la $(URCU_LIBS) $(CK_LIBS)

EXTRA_DIST += tests/abi/exports.sh tests/abi/abi.sh tests/abi/header.sh tests/abi/ctypes.sh \
	$(torture_tests) $(tree_tests) tests/common/timeout.sh tests/gpu/gpu-check.sh tests/tsan.supp \
	tests/abi/header.c tests/abi/header.cc tests/install/check.sh tests/install/consumer.c \
	tests/fuzz/replay.sh tests/fuzz/corpus tests/fuzz/known tests/fuzz/make-corpus.py tests/regression/fuzz

# ------------------------------------------------------------ on a GPU machine
# `make gpu-check`: the GPU tests alone, with a table.
gpu-check: $(gpu_tests)
	@$(SHELL) $(srcdir)/tests/gpu/gpu-check.sh $(gpu_tests)
.PHONY: gpu-check

# `make gpu-suite`: the whole GPU suite in one go on the GPU machine — the
# backend's own GPU tests, and the runtime-level unit tests (slots, workers,
# offload) run again against the CUDA backend (VMMRT_BACKEND=cuda; the tests
# that need the host emulation leave themselves out there). test-slot-async
# is not among them yet: it has not run on a GPU (its memory deltas after
# kernel launches and its timing are the host backend's).
gpu_runtime_tests = tests/unit/test-slot tests/unit/test-pages tests/unit/test-arena tests/unit/test-worker tests/unit/test-offload tests/unit/test-schedule \
	tests/unit/test-streams
gpu-suite: $(gpu_tests) $(gpu_runtime_tests)
	@VMMRT_BACKEND=cuda $(SHELL) $(srcdir)/tests/gpu/gpu-check.sh $(gpu_tests) $(gpu_runtime_tests)
.PHONY: gpu-suite
