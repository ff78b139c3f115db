# SPDX-License-Identifier: LGPL-2.1-or-later
# CUDA backend build fragment: the kernels' fatbin embedded in the library,
# the GPU tests and `make gpu-check`. Included at the end of Makefile.am:
#   include $(srcdir)/cuda.mk
# (after check_PROGRAMS, TESTS, EXTRA_DIST, TEST_CFLAGS and TEST_LDADD are set).

EXTRA_DIST += \
	src/kernels/vmmrt_kernels.cu \
	build-aux/embed.sh \
	tests/gpu/gpu-check.sh

# ---- device kernels: nvcc -> fatbin (sm_90 SASS + compute_90 PTX by default,
# see NVCC_ARCH_FLAGS in configure.ac) -> a C byte array in the library, loaded
# with cuModuleLoadData by src/backend/cuda.c. Without nvcc the library builds
# anyway and kernel_launch reports VMMRT_E_NOT_SUPPORTED.
if HAVE_NVCC
nodist_libvmmrt_core_la_SOURCES = src/kernels/vmmrt_kernels_fatbin.c
MOSTLYCLEANFILES = \
	src/kernels/vmmrt_kernels.fatbin \
	src/kernels/vmmrt_kernels_fatbin.c \
	src/kernels/vmmrt_kernels_fatbin.c.tmp

src/kernels/vmmrt_kernels.fatbin: $(srcdir)/src/kernels/vmmrt_kernels.cu $(srcdir)/src/backend/backend.h $(srcdir)/include/vmmrt.h
	$(AM_V_GEN)$(MKDIR_P) src/kernels && \
	$(NVCC) $(NVCC_ARCH_FLAGS) $(NVCCFLAGS) -I$(srcdir)/include -I$(srcdir)/src \
		--fatbin -o $@ $(srcdir)/src/kernels/vmmrt_kernels.cu

src/kernels/vmmrt_kernels_fatbin.c: src/kernels/vmmrt_kernels.fatbin $(srcdir)/build-aux/embed.sh
	$(AM_V_GEN)$(SHELL) $(srcdir)/build-aux/embed.sh vmmrt__kernels_fatbin src/kernels/vmmrt_kernels.fatbin >$@.tmp && \
	mv -f $@.tmp $@
endif

# ---- GPU tests: built by `make check` and run there too (they skip without a
# device); `make gpu-check` runs them alone and prints a table.
gpu_tests = tests/gpu/test-cuda-backend tests/gpu/test-two-devices
check_PROGRAMS += $(gpu_tests)
TESTS += $(gpu_tests)
tests_gpu_test_cuda_backend_SOURCES = tests/gpu/test-cuda-backend.c
tests_gpu_test_cuda_backend_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_gpu_test_cuda_backend_CFLAGS = $(TEST_CFLAGS)
tests_gpu_test_cuda_backend_LDADD = $(TEST_LDADD)
tests_gpu_test_two_devices_SOURCES = tests/gpu/test-two-devices.c tests/unit/offload-model.c tests/unit/offload-model.h
tests_gpu_test_two_devices_CFLAGS = $(TEST_CFLAGS)
tests_gpu_test_two_devices_LDADD = $(TEST_LDADD)

gpu-check: $(gpu_tests)
	@$(SHELL) $(srcdir)/tests/gpu/gpu-check.sh $(gpu_tests)
.PHONY: gpu-check

# `make gpu-suite`: the whole GPU suite in one go on the GPU machine — the
# backend's own GPU tests, and the runtime-level unit tests (slots, workers,
# offload) run again against the CUDA backend (VMMRT_BACKEND=cuda; the tests
# that need the host emulation leave themselves out there).
gpu_runtime_tests = tests/unit/test-slot tests/unit/test-worker tests/unit/test-offload tests/unit/test-streams
gpu-suite: $(gpu_tests) $(gpu_runtime_tests)
	@VMMRT_BACKEND=cuda $(SHELL) $(srcdir)/tests/gpu/gpu-check.sh $(gpu_tests) $(gpu_runtime_tests)
.PHONY: gpu-suite
