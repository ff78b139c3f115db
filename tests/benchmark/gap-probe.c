/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-gap-probe: what a compute stream pays between two graph replays for
 * each kind of dependency the offload strategies put there. Each variant
 * replays a 200 us graph N times with the dependency enqueued before each
 * replay (the thing waited for has long finished), and reports the median
 * gap between replays from device timing events.
 *
 *   vmmrt-gap-probe [--reps=N] [runtime options]
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

#define TRY(x) \
	do { \
		vmmrt_status st_ = (x); \
		if (st_ != VMMRT_OK) { \
			fprintf(stderr, "gap-probe: %s: %s\n", #x, vmmrt_last_error()); \
			exit(1); \
		} \
	} while (0)

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

enum variant { BACK_TO_BACK, EVENT_AFTER_COPY, EVENT_AFTER_COPY_GRAPH, EVENT_AFTER_WAITVALUE_COPY_GRAPH,
	       WAITVALUE_HOST, HOST_FUNC_ELSEWHERE, EVENT_AND_HOST_FUNC, N_VARIANTS };
static const char *const names[] = {"back to back", "event after memcpy", "event after copy graph",
				    "event after wait-value + copy graph", "wait-value on a host-pinned flag",
				    "host function on another stream per replay",
				    "event wait + host function per replay"};

static void nothing(void *arg)
{
	(void)arg;
}

int main(int argc, char **argv)
{
	vmmrt_options *o;
	vmmrt_runtime *rt;
	unsigned reps = 200;
	TRY(vmmrt_options_create(&o));
	TRY(vmmrt__options_parse_args(o, &argc, argv));
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--reps=", 7))
			reps = (unsigned)strtoul(argv[i] + 7, NULL, 10);
	TRY(vmmrt_runtime_create(o, &rt));
	vmmrt_options_destroy(o);

	vmmrt_stream compute, other;
	TRY(vmmrt__drv_stream_create(rt, &compute));
	TRY(vmmrt__drv_stream_create(rt, &other));
	vmmrt_slot *buf;
	TRY(vmmrt_slot_create(rt, 2u << 20, &buf));
	TRY(vmmrt_slot_map(buf));
	void *host;
	uint32_t *flag;
	vmmrt_devptr flag_dev;
	TRY(vmmrt__drv_host_alloc(rt, 2u << 20, &host));
	TRY(vmmrt__drv_host_alloc(rt, 64, (void **)&flag));
	TRY(vmmrt__drv_host_devptr(rt, flag, &flag_dev));
	*flag = 1;
	vmmrt__bgraph *work, *copy;
	TRY(vmmrt__drv_stream_begin_capture(rt, compute));
	TRY(vmmrt__drv_kernel_launch(rt, compute, VMMRT_KERNEL_BUSY, &(vmmrt__kernel_args){.ns = 200000}));
	TRY(vmmrt__drv_stream_end_capture(rt, compute, &work));
	TRY(vmmrt__drv_stream_begin_capture(rt, other));
	TRY(vmmrt__drv_memcpy_htod_async(rt, vmmrt_slot_address(buf), host, 64 << 10, other));
	TRY(vmmrt__drv_stream_end_capture(rt, other, &copy));
	vmmrt__bevent *done, **start = calloc(reps, sizeof(*start)), **end = calloc(reps, sizeof(*end));
	float *gap = calloc(reps, sizeof(*gap));
	TRY(vmmrt__drv_event_create(rt, false, &done));
	for (unsigned i = 0; i < reps; i++) {
		TRY(vmmrt__drv_event_create(rt, true, &start[i]));
		TRY(vmmrt__drv_event_create(rt, true, &end[i]));
	}
	vmmrt_runtime_info info = {.size = sizeof(info)};
	vmmrt_runtime_info_get(rt, &info);
	printf("gap between two 200 us graph replays on %s, %u replays each (median, us)\n", info.device, reps);
	for (int v = 0; v < N_VARIANTS; v++) {
		for (unsigned i = 0; i < reps; i++) {
			/* The dependency is satisfied long before the compute stream reaches it. */
			switch (v) {
			case EVENT_AFTER_COPY:
			case EVENT_AND_HOST_FUNC:
				TRY(vmmrt__drv_memcpy_htod_async(rt, vmmrt_slot_address(buf), host, 64 << 10, other));
				TRY(vmmrt__drv_event_record(rt, done, other));
				break;
			case EVENT_AFTER_COPY_GRAPH:
				TRY(vmmrt__drv_graph_launch(rt, copy, other));
				TRY(vmmrt__drv_event_record(rt, done, other));
				break;
			case EVENT_AFTER_WAITVALUE_COPY_GRAPH:
				TRY(vmmrt__drv_stream_wait_value32(rt, other, flag_dev, 1));
				TRY(vmmrt__drv_graph_launch(rt, copy, other));
				TRY(vmmrt__drv_event_record(rt, done, other));
				break;
			default:
				break;
			}
			TRY(vmmrt__drv_event_record(rt, start[i], compute));
			TRY(vmmrt__drv_graph_launch(rt, work, compute));
			TRY(vmmrt__drv_event_record(rt, end[i], compute));
			if (v == HOST_FUNC_ELSEWHERE || v == EVENT_AND_HOST_FUNC) {
				/* what remap does after each backward graph: another stream
				 * waits for it and runs a host function that wakes a worker */
				TRY(vmmrt__drv_stream_wait_event(rt, other, end[i]));
				TRY(vmmrt__drv_launch_host_func(rt, other, nothing, NULL));
			}
			if (v == WAITVALUE_HOST)
				TRY(vmmrt__drv_stream_wait_value32(rt, compute, flag_dev, 1));
			else if (v != BACK_TO_BACK && v != HOST_FUNC_ELSEWHERE)
				TRY(vmmrt__drv_stream_wait_event(rt, compute, done));
		}
		TRY(vmmrt__drv_stream_synchronize(rt, compute));
		TRY(vmmrt__drv_stream_synchronize(rt, other));
		for (unsigned i = 0; i + 1 < reps; i++)
			TRY(vmmrt__drv_event_elapsed_ms(rt, end[i], start[i + 1], &gap[i]));
		qsort(gap, reps - 1, sizeof(float), cmp_float);
		printf("  %-40s %7.2f\n", names[v], gap[(reps - 1) / 2] * 1000.0f);
	}
	vmmrt_runtime_destroy(rt); /* frees what is left */
	return 0;
}
