/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-example: the smallest complete round trip through libvmmrt.
 *
 * Reserve a fixed-VA slot, map memory behind it, fill it on the device,
 * offload the bytes to pinned host memory, release the device memory (the
 * address stays reserved), map new memory at the same address, reload the
 * bytes, and verify them with a device checksum. It prints the address before
 * and after: they are equal, which is what lets a CUDA Graph captured on the
 * slot keep working. Runs on a GPU (VMMRT_BACKEND=cuda) or anywhere with the
 * host backend (the default when there is no GPU).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <vmmrt.h>

#define CHECK(call) \
	do { \
		vmmrt_status st_ = (call); \
		if (st_ != VMMRT_OK) { \
			fprintf(stderr, "vmmrt-example: %s failed: %s\n", #call, vmmrt_last_error()); \
			goto out; \
		} \
	} while (0)

int main(void)
{
	const size_t bytes = 8u << 20; /* 8 MiB */
	const uint64_t seed = 42;
	vmmrt_runtime *rt = NULL;
	vmmrt_slot *slot = NULL, *result = NULL;
	vmmrt_stream stream = NULL;
	vmmrt_runtime_info info = {.size = sizeof(info)};
	void *host = NULL;
	uint64_t sum_before = 0, sum_after = 0;
	int rc = 1;

	CHECK(vmmrt_runtime_create(NULL, &rt));
	CHECK(vmmrt_runtime_info_get(rt, &info));
	printf("backend: %s (%s), device: %s, granularity %zu bytes\n", info.backend, info.backend_note, info.device,
	       info.granularity);

	CHECK(vmmrt_stream_create(rt, &stream));
	CHECK(vmmrt_slot_create(rt, bytes, &slot));
	CHECK(vmmrt_slot_create(rt, 8, &result)); /* rounded up to one granule */
	CHECK(vmmrt_slot_map(result));
	CHECK(vmmrt_host_alloc(rt, bytes, &host));

	vmmrt_devptr before = vmmrt_slot_address(slot);
	CHECK(vmmrt_slot_map(slot));
	CHECK(vmmrt_kernel_fill(rt, stream, before, bytes, seed));
	CHECK(vmmrt_kernel_checksum(rt, stream, before, bytes, vmmrt_slot_address(result)));
	CHECK(vmmrt_stream_synchronize(rt, stream));
	CHECK(vmmrt_copy_to_host(rt, &sum_before, vmmrt_slot_address(result), sizeof(sum_before)));
	printf("slot at 0x%llx: %zu bytes filled, checksum %016" PRIx64 "\n", before, bytes, sum_before);

	CHECK(vmmrt_copy_to_host(rt, host, before, bytes)); /* offload (D2H) */
	CHECK(vmmrt_slot_unmap(slot));                      /* device memory released */
	size_t free_b, total_b;
	CHECK(vmmrt_mem_info(rt, &free_b, &total_b));
	printf("offloaded and released: slot state %d, device free %zu MiB of %zu MiB\n",
	       (int)vmmrt_slot_get_state(slot), free_b >> 20, total_b >> 20);

	CHECK(vmmrt_slot_map(slot));                         /* new memory, same address */
	vmmrt_devptr after = vmmrt_slot_address(slot);
	CHECK(vmmrt_copy_to_device(rt, after, host, bytes)); /* reload (H2D) */
	CHECK(vmmrt_kernel_checksum(rt, stream, after, bytes, vmmrt_slot_address(result)));
	CHECK(vmmrt_stream_synchronize(rt, stream));
	CHECK(vmmrt_copy_to_host(rt, &sum_after, vmmrt_slot_address(result), sizeof(sum_after)));
	printf("remapped at 0x%llx: checksum %016" PRIx64 "\n", after, sum_after);

	uint64_t expect = 0;
	{
		/* The fill pattern is known on the host too: check against it, not only before/after. */
		uint64_t *ref = malloc(bytes);
		if (!ref)
			goto out;
		for (size_t i = 0; i < bytes / 8; i++)
			ref[i] = vmmrt_fill_word(seed, i);
		expect = vmmrt_checksum_host(ref, bytes);
		free(ref);
	}
	if (before == after && sum_before == sum_after && sum_after == expect) {
		printf("verified: same address, same bytes\n");
		rc = 0;
	} else {
		printf("FAILED: address %s, checksum %s\n", before == after ? "same" : "CHANGED",
		       sum_after == expect ? "ok" : "WRONG");
	}
out:
	if (host)
		vmmrt_host_free(rt, host);
	if (slot)
		vmmrt_slot_destroy(slot);
	if (result)
		vmmrt_slot_destroy(result);
	if (stream)
		vmmrt_stream_destroy(rt, stream);
	if (rt && vmmrt_runtime_destroy(rt) != VMMRT_OK) {
		fprintf(stderr, "vmmrt-example: %s\n", vmmrt_last_error());
		rc = 1;
	}
	return rc;
}
