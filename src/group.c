/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Offload groups: one per runner, holding the descriptors of the tensors its
 * forward saves for its backward. Discovery records them in order; capture
 * checks that the same tensors come back in the same order (a drift would make
 * a graph read the wrong bytes) and hands out their fixed addresses.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>

#include "api.h"
#include "array.h"
#include "error.h"
#include "offload.h"

#define DEFAULT_ALIGN 256

vmmrt_status vmmrt_group_create(vmmrt_runtime *rt, const char *name, vmmrt_group **out)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt && out, "NULL argument");
	vmmrt__offload *off = rt->offload;
	if (off->allocated)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "group '%s' created after vmmrt_offload_allocate",
				   name ? name : "");
	if (!vmmrt__array_reserve(&off->groups, &off->cap, off->ngroups + 1, sizeof(*off->groups)))
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "group list");
	vmmrt_group *g = calloc(1, sizeof(*g));
	if (!g)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "group");
	g->rt = rt;
	g->off = off;
	g->index = off->ngroups;
	if (name)
		snprintf(g->name, sizeof(g->name), "%s", name);
	else
		snprintf(g->name, sizeof(g->name), "group%u", g->index);
	g->state = VMMRT_GROUP_DISCOVERING;
	off->groups[off->ngroups++] = g;
	*out = g;
	return VMMRT_OK;
}

static vmmrt_status check_desc(const vmmrt_group *g, const vmmrt_tensor_desc *d)
{
	if (!d)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "group '%s': descriptor is NULL", g->name);
	if (d->bytes == 0 || d->bytes > (SIZE_MAX >> 2))
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "group '%s': tensor of %zu bytes", g->name, d->bytes);
	if (d->ndim > VMMRT_MAX_DIMS)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "group '%s': %u dimensions (at most %d)", g->name,
				   d->ndim, VMMRT_MAX_DIMS);
	size_t a = d->align ? d->align : DEFAULT_ALIGN;
	if ((a & (a - 1)) != 0 || a > (1u << 21))
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "group '%s': alignment %zu is not a power of two <= 2 MiB",
				   g->name, d->align);
	return VMMRT_OK;
}

vmmrt_status vmmrt_group_discover(vmmrt_group *g, const vmmrt_tensor_desc *d)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(g, "group is NULL");
	vmmrt_status st = check_desc(g, d);
	if (st != VMMRT_OK)
		return st;
	if (g->state != VMMRT_GROUP_DISCOVERING)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "group '%s': discovery is over (allocated)", g->name);
	/* Two arrays, one capacity: both grow the same way from it, and it
	 * moves only once both have grown. */
	unsigned desc_cap = g->cap;
	if (!vmmrt__array_reserve(&g->desc, &desc_cap, g->ndesc + 1, sizeof(*g->desc)) ||
	    !vmmrt__array_reserve(&g->offset, &g->cap, g->ndesc + 1, sizeof(*g->offset)))
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "descriptors");
	size_t a = d->align ? d->align : DEFAULT_ALIGN;
	size_t off = (g->bytes + a - 1) & ~(a - 1);
	if (off > SIZE_MAX - d->bytes)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "group '%s': total size overflows", g->name);
	g->desc[g->ndesc] = *d;
	g->offset[g->ndesc] = off;
	g->ndesc++;
	g->bytes = off + d->bytes;
	return VMMRT_OK;
}

/* Pinned host buffer and the four events every strategy uses. */
vmmrt_status vmmrt__group_alloc_common(vmmrt_group *g)
{
	vmmrt_runtime *rt = g->rt;
	vmmrt_status st;
	/* Whole 8-byte words, so the checksum kernels can read the tail too. */
	if ((st = vmmrt__drv_host_alloc(rt, (g->bytes + 7) & ~(size_t)7, &g->host)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_create(rt, false, &g->fwd_done)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_create(rt, true, &g->d2h_start)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_create(rt, true, &g->d2h_done)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_create(rt, true, &g->h2d_start)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_create(rt, true, &g->restored)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_create(rt, false, &g->consumed)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "group '%s': allocation", g->name);
	return VMMRT_OK;
}

void vmmrt__group_release(vmmrt_group *g)
{
	vmmrt_runtime *rt = g->rt;
	vmmrt__bevent **ev[] = {&g->fwd_done, &g->d2h_start, &g->d2h_done, &g->h2d_start, &g->restored, &g->consumed};
	for (unsigned i = 0; i < sizeof(ev) / sizeof(ev[0]); i++)
		if (*ev[i]) {
			(void)vmmrt__drv_event_destroy(rt, *ev[i]);
			*ev[i] = NULL;
		}
	/* Pinned memory a stuck stream may still copy from is left allocated:
	 * freeing it can wait for that stream forever (cuMemFreeHost), or let a
	 * copy read freed memory; destroy reports the leak. */
	if (g->host && !g->off->stuck)
		(void)vmmrt__drv_host_free(rt, g->host);
	g->host = NULL;
	g->base = 0;
	g->state = VMMRT_GROUP_DISCOVERING;
}

void vmmrt__group_free(vmmrt_group *g)
{
	vmmrt__group_release(g);
	free(g->desc);
	free(g->offset);
	free(g);
}

vmmrt_status vmmrt_group_begin_capture(vmmrt_group *g)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(g, "group is NULL");
	if (g->state != VMMRT_GROUP_ALLOCATED && g->state != VMMRT_GROUP_READY)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "group '%s': begin capture needs an allocated group",
				   g->name);
	g->saved = 0;
	g->state = VMMRT_GROUP_CAPTURING;
	return VMMRT_OK;
}

static bool same_desc(const vmmrt_tensor_desc *a, const vmmrt_tensor_desc *b)
{
	if (a->bytes != b->bytes || a->dtype != b->dtype || a->ndim != b->ndim ||
	    (a->align ? a->align : DEFAULT_ALIGN) != (b->align ? b->align : DEFAULT_ALIGN))
		return false;
	for (unsigned i = 0; i < a->ndim; i++)
		if (a->shape[i] != b->shape[i] || a->stride[i] != b->stride[i])
			return false;
	return true;
}

vmmrt_status vmmrt_group_save(vmmrt_group *g, const vmmrt_tensor_desc *d, vmmrt_devptr src, vmmrt_stream stream,
			      vmmrt_devptr *addr)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(g, "group is NULL");
	VMMRT__CHECK_ARG(addr, "addr is NULL");
	vmmrt_status st = check_desc(g, d);
	if (st != VMMRT_OK)
		return st;
	if (g->state != VMMRT_GROUP_CAPTURING)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "group '%s': save outside begin/end capture", g->name);
	if (g->saved >= g->ndesc)
		return vmmrt__error(VMMRT_E_MISMATCH, "group '%s': tensor %u saved, but discovery found only %u",
				   g->name, g->saved + 1, g->ndesc);
	if (!same_desc(d, &g->desc[g->saved]))
		return vmmrt__error(VMMRT_E_MISMATCH,
				   "group '%s': tensor %u differs from discovery (bytes %zu vs %zu, dtype %u vs %u, "
				   "ndim %u vs %u, or shape/stride/alignment)",
				   g->name, g->saved, d->bytes, g->desc[g->saved].bytes, d->dtype,
				   g->desc[g->saved].dtype, d->ndim, g->desc[g->saved].ndim);
	vmmrt_devptr dst = g->base + g->offset[g->saved];
	/* The address handed out must lie inside the reserved range, whatever the strategy. */
	if (dst < g->base || dst + d->bytes > g->base + g->bytes)
		return vmmrt__error(VMMRT_E_MISMATCH, "group '%s': tensor %u at 0x%llx is outside the slot", g->name,
				   g->saved, (unsigned long long)dst);
	if (src) {
		st = vmmrt__drv_memcpy_dtod_async(g->rt, dst, src, d->bytes, stream);
		if (st != VMMRT_OK)
			return st;
		/* Until a hook runs, this copy may still be writing the slot that
		 * an abort releases (remap). */
		g->save_stream = stream;
		g->save_streamed = true;
	}
	g->saved++;
	*addr = dst;
	return VMMRT_OK;
}

vmmrt_status vmmrt_group_end_capture(vmmrt_group *g)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(g, "group is NULL");
	if (g->state != VMMRT_GROUP_CAPTURING)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "group '%s': end capture without begin", g->name);
	if (g->saved != g->ndesc) {
		g->state = VMMRT_GROUP_ALLOCATED;
		return vmmrt__error(VMMRT_E_MISMATCH, "group '%s': %u tensors saved, discovery found %u", g->name,
				   g->saved, g->ndesc);
	}
	g->state = VMMRT_GROUP_READY;
	return VMMRT_OK;
}

vmmrt_group_state vmmrt_group_get_state(const vmmrt_group *g)
{
	if (!g)
		return VMMRT_GROUP_FAILED;
	return uatomic_read(&g->error) != VMMRT_OK ? VMMRT_GROUP_FAILED : g->state;
}

vmmrt_devptr vmmrt_group_address(const vmmrt_group *g)
{
	return g ? g->base : 0;
}

size_t vmmrt_group_bytes(const vmmrt_group *g)
{
	return g ? g->bytes : 0;
}

/* g->error while its message is being written: claimed, not yet reported. */
#define GROUP_ERROR_CLAIMED (-1)

void vmmrt__group_fail(vmmrt_group *g, vmmrt_status st, const char *what)
{
	/*
	 * Keep the first failure: later ones are usually its consequences.
	 * Claim the slot, write the message, then publish the status, so a
	 * reader never sees a status whose message is still being written
	 * (workers and host functions fail groups while the application reads).
	 */
	if (uatomic_cmpxchg(&g->error, VMMRT_OK, GROUP_ERROR_CLAIMED) != VMMRT_OK)
		return;
	snprintf(g->errmsg, sizeof(g->errmsg), "group '%s': %s: %s", g->name, what, vmmrt_strerror(st));
	uatomic_set(&g->error, (int32_t)st);
}

vmmrt_status vmmrt_group_error(vmmrt_group *g)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(g, "group is NULL");
	return vmmrt__group_take_error(g);
}

vmmrt_status vmmrt__group_take_error(vmmrt_group *g)
{
	int32_t e = uatomic_read(&g->error);
	if (e == VMMRT_OK || e == GROUP_ERROR_CLAIMED)
		return VMMRT_OK; /* a failure being published is reported by the next call */
	vmmrt__error((vmmrt_status)e, "%s (the host copy is intact)", g->errmsg);
	/* Only now may another failure claim the slot and rewrite the message. */
	uatomic_set(&g->error, VMMRT_OK);
	return (vmmrt_status)e;
}

vmmrt_status vmmrt__group_retire(vmmrt_group *g)
{
	vmmrt__offload *off = g->off;
	if (!vmmrt__array_reserve(&off->retired, &off->retired_cap, off->nretired + 1, sizeof(*off->retired)))
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "retired groups");
	vmmrt_group *old = malloc(sizeof(*old));
	if (!old)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "group '%s': retired copy", g->name);
	/* The copy keeps the memory, the events, the host buffer and the
	 * strategy's part; the group keeps its name, index and descriptor
	 * arrays (emptied: the new discovery fills them again). */
	*old = *g;
	old->desc = NULL;
	old->offset = NULL;
	old->ndesc = old->cap = 0;
	off->retired[off->nretired++] = old;
	g->ndesc = 0;
	g->bytes = 0;
	g->saved = 0;
	g->slot = NULL;
	g->base = 0;
	g->host = NULL;
	g->fwd_done = g->d2h_done = g->restored = g->consumed = g->d2h_start = g->h2d_start = NULL;
	g->timed_d2h = g->timed_h2d = false;
	g->d2h_graph = g->h2d_graph = NULL;
	g->restore_use = 0;
	memset(&g->remap, 0, sizeof(g->remap) > sizeof(g->pingpong) ? sizeof(g->remap) : sizeof(g->pingpong));
	g->begun = VMMRT__BEGUN_NONE;
	g->state = VMMRT_GROUP_DISCOVERING;
	return VMMRT_OK;
}

void vmmrt__group_free_retired(vmmrt__offload *off)
{
	for (unsigned i = 0; i < off->nretired; i++) {
		vmmrt_group *old = off->retired[i];
		off->ops->free_group(off, old);
		vmmrt__group_free(old);
	}
	off->nretired = 0;
}
