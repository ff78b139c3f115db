/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-offload: the offload cycle an integration runs, end to end, with the
 * public API only. A model of LAYERS layers: each forward graph writes an
 * activation into its group's fixed address; each backward graph checks the
 * restored activation. Runs every strategy (pingpong, remap, none) and prints,
 * per iteration, whether every restored activation was right, and the device
 * memory the activations held.
 *
 *   vmmrt-offload [iterations]        (VMMRT_* variables apply, e.g. VMMRT_BACKEND=cuda)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <vmmrt.h>

#define LAYERS 4
#define ACT_BYTES (4u << 20)

#define CHECK(call) \
	do { \
		vmmrt_status st_ = (call); \
		if (st_ != VMMRT_OK) { \
			fprintf(stderr, "vmmrt-offload: %s: %s\n", #call, vmmrt_last_error()); \
			goto out; \
		} \
	} while (0)

/* What layer `layer` must hold in iteration `iter`: input ^ pattern(layer). */
static uint64_t expected_checksum(unsigned iter, unsigned layer, uint64_t *scratch)
{
	for (size_t w = 0; w < ACT_BYTES / 8; w++)
		scratch[w] = vmmrt_fill_word(iter + 1, w) ^ vmmrt_fill_word(100 + layer, w);
	return vmmrt_checksum_host(scratch, ACT_BYTES);
}

static int run_mode(const char *mode, unsigned iterations, uint64_t *scratch)
{
	vmmrt_options *opts = NULL;
	vmmrt_runtime *rt = NULL;
	vmmrt_stream compute = NULL;
	vmmrt_group *g[LAYERS] = {0};
	vmmrt_graph *fwd[LAYERS] = {0}, *bwd[LAYERS] = {0};
	vmmrt_slot *input = NULL, *results = NULL;
	int bad = -1;

	CHECK(vmmrt_options_create(&opts));
	CHECK(vmmrt_options_set(opts, "mode", mode));
	CHECK(vmmrt_runtime_create(opts, &rt));
	CHECK(vmmrt_stream_create(rt, &compute));

	/* 1. Discovery: what each layer saves for its backward, in forward order. */
	vmmrt_tensor_desc desc = {.bytes = ACT_BYTES, .dtype = 1, .ndim = 1, .shape = {ACT_BYTES / 8}, .stride = {1}};
	for (unsigned i = 0; i < LAYERS; i++) {
		char name[16];
		snprintf(name, sizeof(name), "layer%u", i);
		CHECK(vmmrt_group_create(rt, name, &g[i]));
		CHECK(vmmrt_group_discover(g[i], &desc));
	}
	/* 2. Allocation: fixed addresses, pinned host buffers. */
	CHECK(vmmrt_offload_allocate(rt));

	/* 3. Capture: the graphs only ever see the fixed addresses. */
	CHECK(vmmrt_slot_create(rt, ACT_BYTES, &input));
	CHECK(vmmrt_slot_map(input));
	CHECK(vmmrt_slot_create(rt, 8 * LAYERS, &results));
	CHECK(vmmrt_slot_map(results));
	for (unsigned i = 0; i < LAYERS; i++) {
		vmmrt_devptr act;
		CHECK(vmmrt_group_begin_capture(g[i]));
		CHECK(vmmrt_group_save(g[i], &desc, 0, NULL, &act));
		CHECK(vmmrt_group_end_capture(g[i]));
		CHECK(vmmrt_graph_begin_capture(rt, compute));
		CHECK(vmmrt_kernel_layer(rt, compute, act, vmmrt_slot_address(input), ACT_BYTES, 100 + i, 200000));
		CHECK(vmmrt_graph_end_capture(rt, compute, &fwd[i]));
		CHECK(vmmrt_graph_begin_capture(rt, compute));
		CHECK(vmmrt_kernel_busy(rt, compute, 400000));
		CHECK(vmmrt_kernel_checksum(rt, compute, act, ACT_BYTES, vmmrt_slot_address(results) + 8 * i));
		CHECK(vmmrt_graph_end_capture(rt, compute, &bwd[i]));
	}

	/* 4-5. Iterations: forward offload, backward restore around each graph. */
	bad = 0;
	for (unsigned it = 0; it < iterations; it++) {
		CHECK(vmmrt_kernel_fill(rt, compute, vmmrt_slot_address(input), ACT_BYTES, it + 1));
		for (unsigned i = 0; i < LAYERS; i++) {
			CHECK(vmmrt_forward_begin(g[i], compute));
			CHECK(vmmrt_graph_launch(rt, fwd[i], compute));
			CHECK(vmmrt_forward_end(g[i], compute));
		}
		for (unsigned i = LAYERS; i-- > 0;) {
			CHECK(vmmrt_backward_begin(g[i], compute));
			CHECK(vmmrt_graph_launch(rt, bwd[i], compute));
			CHECK(vmmrt_backward_end(g[i], compute));
		}
		/* The end of a training step: the application syncs (loss, optimizer). */
		CHECK(vmmrt_stream_synchronize(rt, compute));
		uint64_t got[LAYERS];
		CHECK(vmmrt_copy_to_host(rt, got, vmmrt_slot_address(results), sizeof(got)));
		unsigned ok = 0;
		for (unsigned i = 0; i < LAYERS; i++)
			ok += got[i] == expected_checksum(it, i, scratch);
		bad += LAYERS - ok;
		vmmrt_offload_stats s = {.size = sizeof(s)};
		CHECK(vmmrt_offload_stats_get(rt, &s));
		printf("%-8s iteration %u: %u/%u activations verified, activations on device %3" PRIu64
		       " MiB (peak %3" PRIu64 " MiB), %3" PRIu64 " MiB offloaded\n",
		       mode, it, ok, LAYERS, s.activation_bytes >> 20, s.activation_peak_bytes >> 20,
		       s.bytes_offloaded >> 20);
		if (it == 0) /* allocation mapped every group once, for capture */
			CHECK(vmmrt_offload_stats_reset(rt));
	}
	CHECK(vmmrt_offload_sync(rt));
out:
	if (rt) {
		if (compute)
			vmmrt_stream_synchronize(rt, compute);
		for (unsigned i = 0; i < LAYERS; i++) {
			if (fwd[i])
				vmmrt_graph_destroy(rt, fwd[i]);
			if (bwd[i])
				vmmrt_graph_destroy(rt, bwd[i]);
		}
		if (compute)
			vmmrt_stream_destroy(rt, compute);
		if (vmmrt_runtime_destroy(rt) != VMMRT_OK) { /* frees groups, slots, buffers */
			fprintf(stderr, "vmmrt-offload: %s\n", vmmrt_last_error());
			bad = bad < 0 ? bad : bad + 1;
		}
	}
	vmmrt_options_destroy(opts);
	return bad;
}

int main(int argc, char **argv)
{
	unsigned iterations = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 4;
	static const char *const modes[] = {"pingpong", "remap", "none"};
	uint64_t *scratch = malloc(ACT_BYTES);
	int rc = 0;
	if (!scratch || iterations == 0) {
		fprintf(stderr, "usage: vmmrt-offload [iterations > 0]\n");
		return 2;
	}
	for (unsigned m = 0; m < 3; m++) {
		int bad = run_mode(modes[m], iterations, scratch);
		printf("%-8s %s\n", modes[m], bad == 0 ? "verified" : bad < 0 ? "FAILED to run" : "CORRUPTED");
		if (bad != 0)
			rc = 1;
	}
	free(scratch);
	return rc;
}
