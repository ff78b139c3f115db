/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Host reference of the built-in kernels' fill pattern and checksum. */
#include "config.h"

#include <string.h>

#include "pattern.h"
#include "vmmrt.h"

uint64_t vmmrt_fill_word(uint64_t seed, uint64_t index)
{
	return vmmrt__mix64(seed + VMMRT__GOLDEN * (index + 1));
}

uint64_t vmmrt_layer_checksum_host(size_t bytes, uint64_t input_seed, uint64_t layer_seed)
{
	uint64_t sum = 0;
	for (size_t i = 0; i < bytes / 8; i++) {
		uint64_t w = vmmrt_fill_word(input_seed, i) ^ vmmrt_fill_word(layer_seed, i);
		sum += vmmrt__mix64(w + VMMRT__CKSUM_K * (i + 1));
	}
	return sum;
}

uint64_t vmmrt_checksum_host(const void *data, size_t bytes)
{
	const unsigned char *p = data;
	uint64_t sum = 0;

	/* memcpy: the caller's buffer need not be 8-byte aligned */
	for (size_t i = 0; i < bytes / 8; i++) {
		uint64_t w;
		memcpy(&w, p + i * 8, 8);
		sum += vmmrt__mix64(w + VMMRT__CKSUM_K * (i + 1));
	}
	return sum;
}
