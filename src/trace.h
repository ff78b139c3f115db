/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Chrome/Perfetto trace events ("Trace Event Format", JSON): complete events
 * ("ph":"X") on named tracks. Driver calls land on one track per worker
 * thread; GPU-side spans (graphs, copies) are added by whoever measured them
 * with device events, on tracks named after their stream.
 */
#ifndef VMMRT__TRACE_H
#define VMMRT__TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "vmmrt.h"

typedef struct vmmrt__trace vmmrt__trace;

vmmrt_status vmmrt__trace_open(const char *path, vmmrt__trace **out);
/* A driver call on the calling thread's track, CLOCK_MONOTONIC nanoseconds. */
void vmmrt__trace_call(vmmrt__trace *t, const char *name, uint64_t t0_ns, uint64_t t1_ns, size_t bytes);
/* A span on a named track (a stream), e.g. ("h2d", "restore L3"). */
void vmmrt__trace_span(vmmrt__trace *t, const char *track, const char *name, uint64_t t0_ns, uint64_t t1_ns);
/* Name the calling thread's track ("driver-worker-0"). */
void vmmrt__trace_thread_name(vmmrt__trace *t, const char *name);
/* Write the file and free everything. */
vmmrt_status vmmrt__trace_close(vmmrt__trace *t);

#endif
