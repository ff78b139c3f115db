# SPDX-License-Identifier: LGPL-2.1-or-later
# The CUDA backend's kernels, compiled by nvcc and embedded in the library
# (the GPU tests are tests.mk's).

EXTRA_DIST += \
	src/kernels/vmmrt_kernels.cu \
	build-aux/embed.sh

# ---- device kernels: nvcc -> fatbin (sm_90 SASS + compute_90 PTX by default,
# see NVCC_ARCH_FLAGS in configure.ac) -> a C byte array in the library, loaded
# with cuModuleLoadData by src/backend/cuda.c. Without nvcc the library builds
# anyway and kernel_launch reports VMMRT_E_NOT_SUPPORTED.
if HAVE_NVCC
nodist_libvmmrt_base_la_SOURCES = src/kernels/vmmrt_kernels_fatbin.c
MOSTLYCLEANFILES += \
	src/kernels/vmmrt_kernels.fatbin \
	src/kernels/vmmrt_kernels_fatbin.c \
	src/kernels/vmmrt_kernels_fatbin.c.tmp

src/kernels/vmmrt_kernels.fatbin: $(srcdir)/src/kernels/vmmrt_kernels.cu $(srcdir)/src/pattern.h $(srcdir)/include/vmmrt.h
	$(AM_V_GEN)$(MKDIR_P) src/kernels && \
	$(NVCC) $(NVCC_ARCH_FLAGS) $(NVCCFLAGS) -I$(srcdir)/include -I$(srcdir)/src \
		--fatbin -o $@ $(srcdir)/src/kernels/vmmrt_kernels.cu

src/kernels/vmmrt_kernels_fatbin.c: src/kernels/vmmrt_kernels.fatbin $(srcdir)/build-aux/embed.sh
	$(AM_V_GEN)$(SHELL) $(srcdir)/build-aux/embed.sh vmmrt__kernels_fatbin src/kernels/vmmrt_kernels.fatbin >$@.tmp && \
	mv -f $@.tmp $@
endif
