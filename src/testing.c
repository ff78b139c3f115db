/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The test switches of src/testing.h: only in libvmmrt-testing.la. */
#include "config.h"

#include <stdlib.h>

#define _LGPL_SOURCE /* the inline rcu_set_pointer: ThreadSanitizer sees the publication */
#include <urcu/pointer.h>

#include "runtime.h"
#include "testing.h"

void vmmrt__drv_set_fault_hook(vmmrt_runtime *rt, vmmrt__fault_fn fn, void *ctx)
{
	/* One pointer, so a call in flight never pairs one hook's function with
	 * another's context (test-only: no allocation means no hook). Published
	 * as RCU does, so a reader never sees it before its fields (the compiler
	 * may sink plain stores past a plain store of the pointer). */
	struct vmmrt__fault_hook *h = fn ? calloc(1, sizeof(*h)) : NULL;
	if (h) {
		h->fn = fn;
		h->ctx = ctx;
		h->next = rt->fault_all;
		rt->fault_all = h;
	}
	rcu_set_pointer(&rt->fault, h);
}

void vmmrt__offload_test_plant(vmmrt_runtime *rt, int mask)
{
	if (rt->offload)
		rt->offload->planted = mask;
}

uintptr_t vmmrt__test_graph_exec(vmmrt_runtime *rt, vmmrt_graph *g)
{
	uintptr_t exec = 0;
	if (rt->ops->graph_exec(rt->be, (vmmrt__bgraph *)g, &exec) != VMMRT_OK)
		return 0;
	return exec;
}
