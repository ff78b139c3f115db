/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Runtime creation and teardown: options (with the environment applied), the
 * backend, the driver workers, and at the end the proof that nothing leaked.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>
#include <urcu/urcu-bp.h>

#include "api.h"
#include "arena.h"
#include "error.h"
#include "runtime.h"
#include "offload.h"
#include "pages.h"
#include "slot.h"
#include "trace.h"

/* A message of vmmrt__error() without its leading "VMMRT_E_<NAME>: ". */
static const char *without_status_name(const char *message)
{
	const char *p = message;

	if (strncmp(p, "VMMRT_E_", 8) != 0)
		return message;
	p += 8;
	while ((*p >= 'A' && *p <= 'Z') || *p == '_')
		p++;
	return strncmp(p, ": ", 2) == 0 ? p + 2 : message;
}

static vmmrt_status open_backend(vmmrt_runtime *rt, char *note, size_t note_len)
{
	vmmrt__backend_choice choice = (vmmrt__backend_choice)vmmrt__opt_u(&rt->opts, VMMRT_OPT_BACKEND);
	vmmrt_status st;

	if (choice == VMMRT_BACKEND_HOST) {
		snprintf(note, note_len, "host backend requested");
		return vmmrt__drv_open(rt, &vmmrt__backend_host);
	}
	st = vmmrt__drv_open(rt, &vmmrt__backend_cuda);
	if (st == VMMRT_OK) {
		snprintf(note, note_len, "%s", choice == VMMRT_BACKEND_AUTO ? "auto: CUDA driver and device found"
									     : "cuda backend requested");
		return VMMRT_OK;
	}
	if (choice == VMMRT_BACKEND_CUDA || (st != VMMRT_E_NO_DEVICE && st != VMMRT_E_NOT_SUPPORTED))
		return vmmrt__error_wrap(st, "cuda backend");
	/*
	 * auto: no usable GPU here, so emulate one; say why in the user's words.
	 * Falling back is the choice auto exists to make, not a failure, so the
	 * cause goes without its status name ("VMMRT_E_NOT_SUPPORTED: ").
	 */
	snprintf(note, note_len, "auto: no GPU to use, so the host backend emulates one (%s)",
		 without_status_name(vmmrt_last_error()));
	/* The reason now lives in the note: a runtime created on the fallback is a success. */
	vmmrt__error_clear();
	return vmmrt__drv_open(rt, &vmmrt__backend_host);
}

static void free_runtime(vmmrt_runtime *rt)
{
	vmmrt__drv_close(rt);
	if (rt->trace)
		(void)vmmrt__trace_close(rt->trace);
	pthread_mutex_destroy(&rt->sync_lock);
	pthread_mutex_destroy(&rt->slots_lock);
	vmmrt__drv_free_fault_hooks(rt); /* the workers are gone, the backend closed */
	free(rt->offload); /* NULL after destroy, empty when creation failed */
	free(rt->calls);
	free(rt);
}

/*
 * fork() without exec (a framework's data-loader workers) copies only the
 * forking thread. Two pieces of liburcu state would then lie to the child:
 * the call_rcu thread (it frees slots) would be missing, so the child's
 * vmmrt_runtime_destroy would wait forever in urcu_bp_barrier; and the RCU
 * registry would still list the parent's driver workers, whose stacks the
 * child's new threads reuse, so its first grace period would wait on or read
 * garbage. The "bulletproof" flavour is the one liburcu makes for this: its
 * fork hooks recreate the call_rcu thread and prune the registry of readers
 * that did not survive. Registered once per process, in liburcu's order.
 */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void before_fork(void)
{
	urcu_bp_call_rcu_before_fork();
	urcu_bp_before_fork();
}

static void after_fork_parent(void)
{
	urcu_bp_after_fork_parent();
	urcu_bp_call_rcu_after_fork_parent();
}

static void after_fork_child(void)
{
	urcu_bp_after_fork_child();
	urcu_bp_call_rcu_after_fork_child();
}

static void register_atfork(void)
{
	(void)pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

vmmrt_status vmmrt_runtime_create(const vmmrt_options *opts, vmmrt_runtime **out)
{
	VMMRT__API_ENTER();
	vmmrt_status st;
	VMMRT__CHECK_ARG(out, "out is NULL");
	*out = NULL;
	pthread_once(&atfork_once, register_atfork);

	vmmrt_runtime *rt = calloc(1, sizeof(*rt));
	if (!rt)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "runtime");
	pthread_mutex_init(&rt->sync_lock, NULL);
	pthread_mutex_init(&rt->slots_lock, NULL);
	CDS_INIT_LIST_HEAD(&rt->slots);
	CDS_INIT_LIST_HEAD(&rt->pages);
	if (opts)
		rt->opts = *opts;
	else
		vmmrt__options_defaults(&rt->opts);
	st = vmmrt__options_apply_env(&rt->opts);
	if (st != VMMRT_OK) {
		free_runtime(rt);
		return st;
	}
	rt->mode = (vmmrt_mode)vmmrt__opt_u(&rt->opts, VMMRT_OPT_MODE);
	rt->lookahead = (unsigned)vmmrt__opt_u(&rt->opts, VMMRT_OPT_LOOKAHEAD);
	rt->max_banks = (unsigned)vmmrt__opt_u(&rt->opts, VMMRT_OPT_MAX_BANKS);
	rt->driver_inline = vmmrt__opt_u(&rt->opts, VMMRT_OPT_DRIVER_INLINE) != 0;
	/* Inline, a map for a later use could run before the release of the
	 * group's current use (the launch thread makes both): map at each use. */
	if (rt->driver_inline)
		rt->lookahead = 0;
	/* Inline driver calls are made on the launch thread by definition. */
	rt->checked_threads = vmmrt__opt_u(&rt->opts, VMMRT_OPT_CHECKED_THREADS) != 0 && !rt->driver_inline;
	/* What vmmrt_runtime_options_get reports is what runs, derived values included. */
	rt->opts.v[VMMRT_OPT_LOOKAHEAD].u = rt->lookahead;
	rt->opts.v[VMMRT_OPT_CHECKED_THREADS].u = rt->checked_threads;
	rt->timeout_ms = vmmrt__opt_u(&rt->opts, VMMRT_OPT_TIMEOUT_MS);
	rt->be_cfg = (vmmrt__backend_config){
		.device_ordinal = (int)vmmrt__opt_u(&rt->opts, VMMRT_OPT_DEVICE),
		.host_capacity = vmmrt__opt_u(&rt->opts, VMMRT_OPT_HOST_CAPACITY),
		.host_granularity = vmmrt__opt_u(&rt->opts, VMMRT_OPT_HOST_GRANULARITY),
		.host_latency = vmmrt__opt_u(&rt->opts, VMMRT_OPT_HOST_LATENCY) != 0,
		.host_copy_gbps = vmmrt__opt_d(&rt->opts, VMMRT_OPT_HOST_COPY_GBPS),
	};

	rt->calls = calloc(VMMRT_CALL_COUNT_, sizeof(*rt->calls));
	if (!rt->calls) {
		free_runtime(rt);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "call statistics");
	}
	if ((st = vmmrt__offload_create(rt)) != VMMRT_OK) {
		free_runtime(rt);
		return st;
	}
	if (vmmrt__opt_s(&rt->opts, VMMRT_OPT_TRACE)[0]) {
		st = vmmrt__trace_open(vmmrt__opt_s(&rt->opts, VMMRT_OPT_TRACE), &rt->trace);
		if (st != VMMRT_OK) {
			free_runtime(rt);
			return st;
		}
	}
	char note[sizeof(rt->note)];
	st = open_backend(rt, note, sizeof(note));
	if (st != VMMRT_OK) {
		rt->be = NULL;
		free_runtime(rt);
		return st;
	}
	memcpy(rt->note, note, sizeof(rt->note));
	if ((st = vmmrt__drv_setup(rt)) != VMMRT_OK) {
		free_runtime(rt);
		return st;
	}
	st = vmmrt__workers_create(rt, (unsigned)vmmrt__opt_u(&rt->opts, VMMRT_OPT_DRIVER_WORKERS),
				   &vmmrt__slot_worker_class, &rt->workers);
	if (st != VMMRT_OK) {
		rt->workers = NULL;
		free_runtime(rt);
		return st;
	}
	*out = rt;
	return VMMRT_OK;
}

/* Destroy the slots the application left behind, so their memory and
 * reservations return; a slot whose teardown fails is counted, not hidden. */
static size_t destroy_leftover_slots(vmmrt_runtime *rt)
{
	size_t n = (size_t)uatomic_read(&rt->live_slots), failed = 0, k = 0;
	if (n == 0)
		return 0;
	vmmrt_slot **list = calloc(n, sizeof(*list));
	if (!list)
		return n;
	pthread_mutex_lock(&rt->slots_lock);
	vmmrt_slot *s;
	/* A slot whose destroy is already queued (its waiter timed out) is the
	 * worker's, which may free it any time: a second DESTROY would run on
	 * freed memory. The workers' drain finishes it; what stays is counted. */
	cds_list_for_each_entry(s, &rt->slots, link)
		if (k < n && !uatomic_read(&s->dying))
			list[k++] = s;
	pthread_mutex_unlock(&rt->slots_lock);
	for (size_t i = 0; i < k; i++)
		if (vmmrt__slot_destroy(list[i]) != VMMRT_OK)
			failed++;
	free(list);
	return failed;
}

vmmrt_status vmmrt_runtime_destroy(vmmrt_runtime *rt)
{
	VMMRT__API_ENTER();
	vmmrt_status st;
	VMMRT__CHECK_ARG(rt, "runtime is NULL");

	vmmrt_status off_st = vmmrt__offload_destroy(rt);
	char off_msg[256];
	snprintf(off_msg, sizeof(off_msg), "%s", off_st == VMMRT_OK ? "" : vmmrt_last_error());
	(void)destroy_leftover_slots(rt);
	/* After the slots: none is bound to them any more. */
	vmmrt__pages_destroy_leftover(rt);
	vmmrt__workers_destroy(rt->workers, true);
	vmmrt__pages_free_leftover(rt);
	/* Slots are freed by call_rcu: let those callbacks run before we go. */
	urcu_bp_barrier();
	/* Counted after the drain: a destroy that timed out may have finished since. */
	int64_t stuck = uatomic_read(&rt->live_slots);
	int64_t handles = uatomic_read(&rt->live_handles);
	int64_t vas = uatomic_read(&rt->live_reservations);
	st = VMMRT_OK;
	if (stuck || handles || vas)
		st = vmmrt__error(VMMRT_E_BUSY,
				 "runtime destroy: %lld slots could not be torn down, %lld physical handles and "
				 "%lld reservations were still live (the backend closed them)",
				 (long long)stuck, (long long)handles, (long long)vas);
	else if (off_st != VMMRT_OK)
		st = vmmrt__error(off_st, "runtime destroy: %s", off_msg);
	/* Before the backend closes: the arena may keep it for the plain
	 * segments still outstanding (src/arena.c). */
	vmmrt__arena_runtime_gone(rt);
	free_runtime(rt);
	return st;
}

vmmrt_status vmmrt_runtime_info_get(const vmmrt_runtime *rt, vmmrt_runtime_info *out)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(out, "out is NULL");
	vmmrt_runtime_info info = {.size = sizeof(info)};
	info.backend = rt->ops->name;
	snprintf(info.backend_note, sizeof(info.backend_note), "%s", rt->note);
	snprintf(info.device, sizeof(info.device), "%s", rt->device_name);
	info.device_ordinal = rt->be_cfg.device_ordinal;
	info.granularity = rt->granularity;
	info.mode = rt->mode;
	info.driver_workers = vmmrt__workers_count(rt->workers);
	info.lookahead = rt->lookahead;
	return VMMRT__SIZED_OUT(out, info, VMMRT__RUNTIME_INFO_SIZE_V1, "vmmrt_runtime_info");
}

vmmrt_status vmmrt_runtime_options_get(const vmmrt_runtime *rt, vmmrt_options *out)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(out, "out is NULL (make one with vmmrt_options_create)");
	*out = rt->opts;
	return VMMRT_OK;
}

vmmrt_status vmmrt_trace_span(vmmrt_runtime *rt, const char *track, const char *name, uint64_t t0_ns, uint64_t t1_ns)
{
	VMMRT__API_ENTER(); /* the trace may allocate: not in a host function */
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(track && name, "track or name is NULL");
	if (t1_ns < t0_ns)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: span '%s' ends (%llu ns) before it starts (%llu ns)",
				    __func__, name, (unsigned long long)t1_ns, (unsigned long long)t0_ns);
	if (rt->trace)
		vmmrt__trace_span(rt->trace, track, name, t0_ns, t1_ns);
	return VMMRT_OK;
}

vmmrt_status vmmrt_mem_info(vmmrt_runtime *rt, size_t *free_bytes, size_t *total_bytes)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(free_bytes && total_bytes, "output pointer is NULL");
	return vmmrt__drv_mem_info(rt, free_bytes, total_bytes);
}
