/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * What both halves of the host backend share: the prologue of every op, and
 * the registries. Every stream, event, graph and pinned allocation handed out
 * is on one of the backend's lists (under obj_lock), so that a stale or bogus
 * handle is an error, not a crash; each kind of object says how its handles
 * are found and how one is released (host-internal.h).
 */
#include "config.h"

#include "backend/host-internal.h"
#include "error.h"

vmmrt_status vmmrt__host_enter(vmmrt__backend *b, const char *func)
{
	/* The CUDA 13 driver answers CUDA_ERROR_NOT_PERMITTED here; older ones deadlock. */
	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC)
		return vmmrt__error(VMMRT_E_NOT_PERMITTED, "%s: driver call from inside a host function", func);
	if (!b)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: NULL backend", func);
	return VMMRT_OK;
}

static struct cds_list_head *list_of(vmmrt__backend *b, const vmmrt__host_kind *k)
{
	return (struct cds_list_head *)((char *)b + k->list);
}

void vmmrt__host_register(vmmrt__backend *b, const vmmrt__host_kind *k, struct cds_list_head *node)
{
	pthread_mutex_lock(&b->obj_lock);
	cds_list_add_tail(node, list_of(b, k));
	pthread_mutex_unlock(&b->obj_lock);
}

struct cds_list_head *vmmrt__host_lookup(vmmrt__backend *b, const vmmrt__host_kind *k, const void *key)
{
	struct cds_list_head *node;

	cds_list_for_each(node, list_of(b, k)) {
		if (k->match ? k->match(node, key) : (const void *)node == key)
			return node;
	}
	return NULL;
}

vmmrt_status vmmrt__host_destroy(vmmrt__backend *b, const vmmrt__host_kind *k, const void *key, const char *func)
{
	struct cds_list_head *node;
	vmmrt_status st = vmmrt__host_enter(b, func);

	if (st != VMMRT_OK)
		return st;
	pthread_mutex_lock(&b->obj_lock);
	node = vmmrt__host_lookup(b, k, key);
	if (node)
		cds_list_del(node);
	pthread_mutex_unlock(&b->obj_lock);
	if (!node)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, k->unknown, func, key);
	k->release(b, node);
	return VMMRT_OK;
}

void vmmrt__host_unregister_all(vmmrt__backend *b, const vmmrt__host_kind *k)
{
	for (;;) {
		struct cds_list_head *node = NULL;

		pthread_mutex_lock(&b->obj_lock);
		if (!cds_list_empty(list_of(b, k))) {
			node = list_of(b, k)->next;
			cds_list_del(node);
		}
		pthread_mutex_unlock(&b->obj_lock);
		if (!node)
			return;
		k->release(b, node);
	}
}
