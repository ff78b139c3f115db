/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The built-in kernels' byte patterns, the same on every backend and on the
 * host (pattern.c), in host and in device code (src/kernels/vmmrt_kernels.cu
 * includes this too):
 *   fill word i  = vmmrt__mix64(seed + VMMRT__GOLDEN * (i + 1))
 *   checksum     = sum over 8-byte words w_i of vmmrt__mix64(w_i + VMMRT__CKSUM_K * (i + 1)),
 *                  modulo 2^64 (order-free, so a device reduction may add in any order;
 *                  position-dependent, so swapped words are caught)
 */
#ifndef VMMRT__PATTERN_H
#define VMMRT__PATTERN_H

#include <stdint.h>

#define VMMRT__GOLDEN 0x9E3779B97F4A7C15ULL
#define VMMRT__CKSUM_K 0xD1B54A32D192ED03ULL

#ifdef __CUDACC__
#define VMMRT__HOST_DEVICE __host__ __device__ __forceinline__
#else
#define VMMRT__HOST_DEVICE inline
#endif

static VMMRT__HOST_DEVICE uint64_t vmmrt__mix64(uint64_t x)
{
	/* splitmix64 finalizer: cheap, and any bit flip changes the output. */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

#endif
