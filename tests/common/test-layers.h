/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The model the tests that drive the hooks by hand build: a runtime on the
 * host backend with the options they name, n layers of one 1-D activation
 * each (a group apiece), discovered, allocated and, if asked, captured (each
 * activation saved at its fixed address). Statuses rather than asserts: the
 * regression tests build it in forked children, which report by exit status.
 * The iterations are the test's own; tests that only need iterations run the
 * whole synthetic model (offload-model.h).
 */
#ifndef VMMRT__TEST_LAYERS_H
#define VMMRT__TEST_LAYERS_H

#include <stdbool.h>
#include <stddef.h>

#include "vmmrt.h"

/* A layer's activation: `bytes` as 8-byte words. */
static inline vmmrt_tensor_desc test_act(size_t bytes, uint32_t dtype)
{
	return (vmmrt_tensor_desc){.bytes = bytes, .dtype = dtype, .ndim = 1, .shape = {(int64_t)(bytes / 8)},
				   .stride = {1}};
}

typedef struct test_layers_cfg {
	const char *const *options; /* test_layers_runtime's */
	unsigned n;
	size_t bytes;              /* each layer's activation, unless sizes */
	const size_t *sizes;       /* NULL, or layer i's in sizes[i] */
	uint32_t dtype;
	bool capture;              /* save every activation after allocation */
} test_layers_cfg;

/* A runtime on the host backend with the name/value pairs kv (NULL: none)
 * set after "backend" "host" (VMMRT_BACKEND still overrides it). */
static inline vmmrt_status test_layers_runtime(const char *const *kv, vmmrt_runtime **rt)
{
	vmmrt_options *o;
	vmmrt_status st = vmmrt_options_create(&o);
	if (st != VMMRT_OK)
		return st;
	st = vmmrt_options_set(o, "backend", "host");
	for (; st == VMMRT_OK && kv && kv[0]; kv += 2)
		st = vmmrt_options_set(o, kv[0], kv[1]);
	if (st == VMMRT_OK)
		st = vmmrt_runtime_create(o, rt);
	vmmrt_options_destroy(o);
	return st;
}

/* The runtime in *rt, layer i's group in g[i] and (capture) its activation's
 * address in addr[i] (addr may be NULL). On failure the first failure is
 * returned and the runtime destroyed (*rt NULL). */
static inline vmmrt_status test_layers(const test_layers_cfg *c, vmmrt_runtime **rt, vmmrt_group **g,
				       vmmrt_devptr *addr)
{
	vmmrt_devptr a;
	*rt = NULL;
	vmmrt_status st = test_layers_runtime(c->options, rt);
	for (unsigned i = 0; st == VMMRT_OK && i < c->n; i++) {
		vmmrt_tensor_desc d = test_act(c->sizes ? c->sizes[i] : c->bytes, c->dtype);
		st = vmmrt_group_create(*rt, NULL, &g[i]);
		if (st == VMMRT_OK)
			st = vmmrt_group_discover(g[i], &d);
	}
	if (st == VMMRT_OK)
		st = vmmrt_offload_allocate(*rt);
	for (unsigned i = 0; st == VMMRT_OK && c->capture && i < c->n; i++) {
		vmmrt_tensor_desc d = test_act(c->sizes ? c->sizes[i] : c->bytes, c->dtype);
		st = vmmrt_group_begin_capture(g[i]);
		if (st == VMMRT_OK)
			st = vmmrt_group_save(g[i], &d, 0, NULL, addr ? &addr[i] : &a);
		if (st == VMMRT_OK)
			st = vmmrt_group_end_capture(g[i]);
	}
	if (st != VMMRT_OK && *rt) {
		(void)vmmrt_runtime_destroy(*rt);
		*rt = NULL;
	}
	return st;
}

#endif
