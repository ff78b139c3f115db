/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Trace events are appended to a growable array under a spinlock: appends are
 * rare next to the driver calls they describe (tens of microseconds each), and
 * the file is written once, at close, so nothing slows the calls being traced.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ck_spinlock.h>

#include "error.h"
#include "trace.h"
#include "tsan.h"

typedef struct trace_event {
	char track[32];
	char name[48];
	uint64_t t0, t1;
	uint64_t bytes;
	long tid;        /* > 0: a thread track; 0: a named track */
} trace_event;

struct vmmrt__trace {
	char path[256];
	ck_spinlock_t lock;
	trace_event *ev;
	size_t n, cap;
	uint64_t origin;
};

static void append(vmmrt__trace *t, const trace_event *e)
{
	ck_spinlock_lock(&t->lock);
	VMMRT__TSAN_ACQUIRE(&t->lock); /* ck's lock is inline assembly: tell TSan it orders */
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 4096;
		trace_event *ev = realloc(t->ev, cap * sizeof(*ev));
		if (!ev) { /* drop the event: a trace must never fail the run */
			VMMRT__TSAN_RELEASE(&t->lock);
			ck_spinlock_unlock(&t->lock);
			return;
		}
		t->ev = ev;
		t->cap = cap;
	}
	t->ev[t->n++] = *e;
	VMMRT__TSAN_RELEASE(&t->lock);
	ck_spinlock_unlock(&t->lock);
}

vmmrt_status vmmrt__trace_open(const char *path, vmmrt__trace **out)
{
	if (!path || !out || strlen(path) >= sizeof((*out)->path))
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "trace: bad path");
	vmmrt__trace *t = calloc(1, sizeof(*t));
	if (!t)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "trace");
	/* Fail now, not at the end of a long run, if the file cannot be written. */
	FILE *f = fopen(path, "w");
	if (!f) {
		free(t);
		return vmmrt__error(VMMRT_E_INVALID_OPTION, "trace: cannot write '%s'", path);
	}
	fclose(f);
	strcpy(t->path, path);
	ck_spinlock_init(&t->lock);
	*out = t;
	return VMMRT_OK;
}

void vmmrt__trace_call(vmmrt__trace *t, const char *name, uint64_t t0, uint64_t t1, size_t bytes)
{
	trace_event e = {.t0 = t0, .t1 = t1, .bytes = bytes, .tid = (long)syscall(SYS_gettid)};
	snprintf(e.name, sizeof(e.name), "%s", name);
	append(t, &e);
}

void vmmrt__trace_span(vmmrt__trace *t, const char *track, const char *name, uint64_t t0, uint64_t t1)
{
	trace_event e = {.t0 = t0, .t1 = t1};
	snprintf(e.track, sizeof(e.track), "%s", track);
	snprintf(e.name, sizeof(e.name), "%s", name);
	append(t, &e);
}

void vmmrt__trace_thread_name(vmmrt__trace *t, const char *name)
{
	trace_event e = {.t0 = 0, .t1 = 0, .bytes = UINT64_MAX, .tid = (long)syscall(SYS_gettid)};
	snprintf(e.name, sizeof(e.name), "%s", name);
	append(t, &e);
}

static void json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		if ((unsigned char)*s >= 0x20)
			fputc(*s, f);
	}
	fputc('"', f);
}

vmmrt_status vmmrt__trace_close(vmmrt__trace *t)
{
	if (!t)
		return VMMRT_OK;
	FILE *f = fopen(t->path, "w");
	vmmrt_status st = VMMRT_OK;
	if (!f) {
		st = vmmrt__error(VMMRT_E_INVALID_OPTION, "trace: cannot write '%s'", t->path);
		goto out;
	}
	uint64_t origin = UINT64_MAX;
	for (size_t i = 0; i < t->n; i++)
		if (t->ev[i].t1 && t->ev[i].t0 < origin)
			origin = t->ev[i].t0;
	if (origin == UINT64_MAX)
		origin = 0;
	/* Named tracks become pseudo-threads of pid 2 with a fixed tid per name. */
	char tracks[32][32];
	int ntracks = 0;
	fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n", f);
	fputs("{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"host threads\"}},\n", f);
	fputs("{\"ph\":\"M\",\"pid\":2,\"name\":\"process_name\",\"args\":{\"name\":\"device streams\"}}", f);
	for (size_t i = 0; i < t->n; i++) {
		trace_event *e = &t->ev[i];
		long tid = e->tid;
		int pid = 1;
		if (tid == 0) {
			int k;
			for (k = 0; k < ntracks; k++)
				if (strcmp(tracks[k], e->track) == 0)
					break;
			if (k == ntracks && ntracks < 32) {
				snprintf(tracks[ntracks++], sizeof(tracks[0]), "%s", e->track);
				fprintf(f, ",\n{\"ph\":\"M\",\"pid\":2,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", k + 1);
				json_string(f, e->track);
				fputs("}}", f);
			}
			tid = k + 1;
			pid = 2;
		}
		if (e->bytes == UINT64_MAX && e->t1 == 0) {
			fprintf(f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%ld,\"name\":\"thread_name\",\"args\":{\"name\":", tid);
			json_string(f, e->name);
			fputs("}}", f);
			continue;
		}
		fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%ld,\"name\":", pid, tid);
		json_string(f, e->name);
		fprintf(f, ",\"ts\":%.3f,\"dur\":%.3f", (double)(e->t0 - origin) / 1000.0,
			(double)(e->t1 - e->t0) / 1000.0);
		if (e->bytes)
			fprintf(f, ",\"args\":{\"bytes\":%llu}", (unsigned long long)e->bytes);
		fputc('}', f);
	}
	fputs("\n]}\n", f);
	if (fclose(f) != 0)
		st = vmmrt__error(VMMRT_E_INVALID_OPTION, "trace: write to '%s' failed", t->path);
out:
	free(t->ev);
	free(t);
	return st;
}
