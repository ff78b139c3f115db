/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The built-in kernels of the CUDA backend (see vmmrt__kernel_id in
 * src/backend/backend.h). Compiled by nvcc into a fatbin that is embedded in
 * the library and loaded with cuModuleLoadData; src/backend/cuda-stream.c launches them
 * with cuLaunchKernel, so the parameter lists here and there must agree: every
 * parameter is 8 bytes (a pointer or an unsigned long long).
 *
 * The bytes they produce must be bit-identical to vmmrt_fill_word() and
 * vmmrt_checksum_host() (src/pattern.c): vmmrt__mix64() and the constants are
 * pattern.h's, the host's own.
 *
 * Launch shapes (chosen by cuda-stream.c): VMMRT__KERNEL_THREADS threads per block, a
 * grid-stride loop, at most a few blocks per SM.
 */
#include <stdint.h>

#include "pattern.h"

#define VMMRT__KERNEL_THREADS 256

typedef unsigned long long u64;

static_assert(sizeof(u64) == sizeof(uint64_t), "u64 is 64 bits");

static __device__ __forceinline__ u64 dev_fill_word(u64 seed, u64 i)
{
	return vmmrt__mix64(seed + VMMRT__GOLDEN * (i + 1));
}

/* Nanoseconds since an arbitrary epoch, the same for every SM. */
static __device__ __forceinline__ u64 dev_globaltimer(void)
{
	u64 t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

static __device__ __forceinline__ void dev_spin_until(u64 start, u64 ns)
{
	while (dev_globaltimer() - start < ns)
		;
}

/* VMMRT_KERNEL_FILL: dst[i] = fill_word(seed, i) for i < nwords. */
extern "C" __global__ void __launch_bounds__(VMMRT__KERNEL_THREADS)
vmmrt__k_fill(u64 *dst, u64 nwords, u64 seed)
{
	const u64 stride = (u64)gridDim.x * blockDim.x;

	for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride)
		dst[i] = dev_fill_word(seed, i);
}

/*
 * First half of VMMRT_KERNEL_CHECKSUM: *out = 0, one thread, launched on the
 * same stream just before vmmrt__k_checksum (which only adds into *out). A
 * kernel rather than cuMemsetD32Async so that out may be any address the
 * device can write, and so that a captured graph holds two kernel nodes.
 */
extern "C" __global__ void vmmrt__k_zero64(u64 *out)
{
	*out = 0;
}

/*
 * VMMRT_KERNEL_CHECKSUM: *out += sum over i < nwords of mix64(src[i] + K*(i+1)).
 * The sum is modulo 2^64, so the order of the additions (grid stride, warp
 * shuffles, shared memory, one atomicAdd per block) does not change the bits.
 */
extern "C" __global__ void __launch_bounds__(VMMRT__KERNEL_THREADS)
vmmrt__k_checksum(const u64 *src, u64 nwords, u64 *out)
{
	__shared__ u64 warp_sums[VMMRT__KERNEL_THREADS / 32];
	const u64 stride = (u64)gridDim.x * blockDim.x;
	u64 sum = 0;

	for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride)
		sum += vmmrt__mix64(src[i] + VMMRT__CKSUM_K * (i + 1));

	for (int off = 16; off > 0; off >>= 1)
		sum += __shfl_down_sync(0xffffffffu, sum, off);
	if ((threadIdx.x & 31) == 0)
		warp_sums[threadIdx.x >> 5] = sum;
	__syncthreads();
	if (threadIdx.x < 32) {
		sum = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0;
		for (int off = 16; off > 0; off >>= 1)
			sum += __shfl_down_sync(0xffffffffu, sum, off);
		if (threadIdx.x == 0 && sum != 0)
			atomicAdd(out, sum);
	}
}

/* VMMRT_KERNEL_BUSY: one thread of one block spins on %globaltimer for ns. */
extern "C" __global__ void vmmrt__k_busy(u64 ns)
{
	const u64 start = dev_globaltimer();

	dev_spin_until(start, ns);
}

/*
 * VMMRT_KERNEL_LAYER: dst[i] = src[i] ^ fill_word(seed, i) (src == NULL: no
 * input, dst[i] = fill_word(seed, i)), lasting at least ns. Block 0 is
 * scheduled first, so its entry time is (about) the kernel's start; its thread
 * 0 spins after its share of the work until ns have passed since then. Only one
 * thread spins, so a grid larger than one wave is not stretched to n * ns.
 */
extern "C" __global__ void __launch_bounds__(VMMRT__KERNEL_THREADS)
vmmrt__k_layer(u64 *dst, const u64 *src, u64 nwords, u64 seed, u64 ns)
{
	const u64 start = dev_globaltimer();
	const u64 stride = (u64)gridDim.x * blockDim.x;

	if (src != nullptr) {
		for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride)
			dst[i] = src[i] ^ dev_fill_word(seed, i);
	} else {
		for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride)
			dst[i] = dev_fill_word(seed, i);
	}
	if (blockIdx.x == 0 && threadIdx.x == 0)
		dev_spin_until(start, ns);
}
