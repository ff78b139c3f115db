/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The --trace file of the whole run, merged from the runtimes' own.
 *
 * Each mode's runtime writes its trace (Trace Event Format, JSON) to the
 * --trace file when it is destroyed, with times relative to the earliest event
 * of that file. Right after, the bench reads the file back: the span
 * "MODE runtime", which the bench added from a host clock reading it kept
 * (bench_trace_mark), gives that file's origin on CLOCK_MONOTONIC, so every
 * event goes back onto the host clock. Named tracks (pid 2: compute, d2h, h2d,
 * bench) are matched by name across the modes; host threads (pid 1) keep their
 * thread ids, and their names get the mode in front ("remap vmmrt-drv-0"). At
 * the end the merged events are written over the file, as one trace.
 *
 * The reader takes any JSON, but only the fields of the format that the
 * library writes are kept: ph, pid, tid, name, ts, dur, args.name, args.bytes.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define NAME_LEN 64
#define MAX_TRACKS 32

typedef struct tev {
	int pid;           /* 1: a host thread, 2: a named track */
	long tid;          /* pid 1: the thread id; pid 2: the track's index + 1 */
	bool meta;         /* pid 1: the thread's name, no span */
	char name[NAME_LEN];
	uint64_t t0, dur;  /* ns, t0 on CLOCK_MONOTONIC */
	uint64_t bytes;    /* args.bytes; 0: none */
} tev;

struct bench_trace {
	tev *ev;
	size_t n, cap;
	char tracks[MAX_TRACKS][NAME_LEN];
	unsigned ntracks;
	bool failed;       /* a mode's events could not be taken in */
};

int bench_trace_open(bench_ctx *ctx, const char *path)
{
	/* The runtimes take the path as their "trace" option: check it fits now. */
	if (vmmrt_options_set(ctx->scratch, "trace", path) != VMMRT_OK) {
		fprintf(stderr, "vmmrt-bench: --trace: %s\n", vmmrt_last_error());
		return -1;
	}
	/* Fail now, not at the end of a long run, if the file cannot be written. */
	FILE *f = fopen(path, "w");
	if (!f || fclose(f) != 0) {
		fprintf(stderr, "vmmrt-bench: --trace: cannot write '%s': %s\n", path, strerror(errno));
		return -1;
	}
	if (!(ctx->trace = calloc(1, sizeof(*ctx->trace)))) {
		fprintf(stderr, "vmmrt-bench: --trace: out of host memory\n");
		return -1;
	}
	ctx->trace_path = path;
	return 0;
}

/* ------------------------------------------------------------ the reader */

typedef struct reader {
	const char *p, *end;
} reader;

static void ws(reader *r)
{
	while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
		r->p++;
}

/* Skip white space; consume c if it comes next. */
static bool take(reader *r, char c)
{
	ws(r);
	if (r->p < r->end && *r->p == c) {
		r->p++;
		return true;
	}
	return false;
}

/* A string into buf (cut to len - 1 bytes; \u escapes beyond ASCII become '?'). */
static bool string(reader *r, char *buf, size_t len)
{
	size_t n = 0;
	if (!take(r, '"'))
		return false;
	while (r->p < r->end && *r->p != '"') {
		char c = *r->p++;
		if (c == '\\') {
			if (r->p >= r->end)
				return false;
			c = *r->p++;
			switch (c) {
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'n': c = '\n'; break;
			case 'r': c = '\r'; break;
			case 't': c = '\t'; break;
			case 'u': {
				if (r->end - r->p < 4)
					return false;
				char hex[5] = {r->p[0], r->p[1], r->p[2], r->p[3], 0};
				char *e;
				unsigned long u = strtoul(hex, &e, 16);
				if (*e)
					return false;
				r->p += 4;
				c = u < 0x80 ? (char)u : '?';
				break;
			}
			default: break; /* \" \\ \/ */
			}
		}
		if (n + 1 < len)
			buf[n++] = c;
	}
	if (len)
		buf[n] = '\0';
	return take(r, '"');
}

static bool number(reader *r, double *v)
{
	ws(r);
	char buf[64];
	size_t n = 0;
	while (r->p + n < r->end && n + 1 < sizeof(buf) && strchr("+-0123456789.eE", r->p[n]))
		buf[n] = r->p[n], n++;
	buf[n] = '\0';
	char *e;
	*v = strtod(buf, &e);
	if (n == 0 || *e)
		return false;
	r->p += n;
	return true;
}

static bool skip_value(reader *r, int depth)
{
	char scratch[8];
	double d;
	ws(r);
	if (r->p >= r->end || depth > 32)
		return false;
	char c = *r->p;
	if (c == '"')
		return string(r, scratch, sizeof(scratch));
	if (c == '{' || c == '[') {
		char close = c == '{' ? '}' : ']';
		r->p++;
		if (take(r, close))
			return true;
		do {
			if (c == '{' && (!string(r, scratch, sizeof(scratch)) || !take(r, ':')))
				return false;
			if (!skip_value(r, depth + 1))
				return false;
		} while (take(r, ','));
		return take(r, close);
	}
	static const char *const words[] = {"true", "false", "null"};
	for (unsigned i = 0; i < 3; i++)
		if ((size_t)(r->end - r->p) >= strlen(words[i]) && strncmp(r->p, words[i], strlen(words[i])) == 0) {
			r->p += strlen(words[i]);
			return true;
		}
	return number(r, &d);
}

/* One event as the file has it. */
typedef struct raw_event {
	char ph[4], name[NAME_LEN], arg_name[NAME_LEN];
	double pid, tid, ts, dur, bytes;
} raw_event;

/* An object of scalar members into e; args (one level down) too. */
static bool object(reader *r, raw_event *e, bool args)
{
	if (!take(r, '{'))
		return false;
	if (take(r, '}'))
		return true;
	do {
		char key[16];
		bool ok;
		if (!string(r, key, sizeof(key)) || !take(r, ':'))
			return false;
		if (args && strcmp(key, "name") == 0)
			ok = string(r, e->arg_name, sizeof(e->arg_name));
		else if (args && strcmp(key, "bytes") == 0)
			ok = number(r, &e->bytes);
		else if (args)
			ok = skip_value(r, 1);
		else if (strcmp(key, "ph") == 0)
			ok = string(r, e->ph, sizeof(e->ph));
		else if (strcmp(key, "name") == 0)
			ok = string(r, e->name, sizeof(e->name));
		else if (strcmp(key, "pid") == 0)
			ok = number(r, &e->pid);
		else if (strcmp(key, "tid") == 0)
			ok = number(r, &e->tid);
		else if (strcmp(key, "ts") == 0)
			ok = number(r, &e->ts);
		else if (strcmp(key, "dur") == 0)
			ok = number(r, &e->dur);
		else if (strcmp(key, "args") == 0)
			ok = object(r, e, true);
		else
			ok = skip_value(r, 1);
		if (!ok)
			return false;
	} while (take(r, ','));
	return take(r, '}');
}

/* The events of a trace file: {"traceEvents": [...], ...}. */
static bool parse(reader *r, raw_event **out, size_t *nout)
{
	raw_event *ev = NULL;
	size_t n = 0, cap = 0;
	bool ok = take(r, '{');
	if (ok && !take(r, '}')) {
		do {
			char key[32];
			if (!(ok = string(r, key, sizeof(key)) && take(r, ':')))
				break;
			if (strcmp(key, "traceEvents") != 0) {
				if (!(ok = skip_value(r, 0)))
					break;
				continue;
			}
			if (!(ok = take(r, '[')))
				break;
			if (take(r, ']'))
				continue;
			do {
				if (n == cap) {
					cap = cap ? 2 * cap : 1024;
					raw_event *grown = realloc(ev, cap * sizeof(*ev));
					if (!(ok = grown != NULL))
						break;
					ev = grown;
				}
				memset(&ev[n], 0, sizeof(ev[n]));
				if (!(ok = object(r, &ev[n], false)))
					break;
				n++;
			} while (take(r, ','));
			if (!ok || !(ok = take(r, ']')))
				break;
		} while (take(r, ','));
		ok = ok && take(r, '}');
	}
	if (!ok) {
		free(ev);
		return false;
	}
	*out = ev;
	*nout = n;
	return true;
}

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char *buf = NULL;
	size_t n = 0, cap = 0;
	for (;;) {
		if (cap - n < 65536) {
			cap = cap ? 2 * cap : 1 << 20;
			char *grown = realloc(buf, cap);
			if (!grown) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = grown;
		}
		size_t got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	bool err = ferror(f);
	fclose(f);
	if (err) {
		free(buf);
		return NULL;
	}
	*len = n;
	return buf;
}

/* ------------------------------------------------------------- the merge */

static tev *add(bench_trace *t)
{
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 4096;
		tev *grown = realloc(t->ev, cap * sizeof(*grown));
		if (!grown)
			return NULL;
		t->ev = grown;
		t->cap = cap;
	}
	tev *e = &t->ev[t->n++];
	memset(e, 0, sizeof(*e));
	return e;
}

/* The merged index + 1 of a named track (MAX_TRACKS + 1 when there are too many). */
static long track_id(bench_trace *t, const char *name)
{
	for (unsigned k = 0; k < t->ntracks; k++)
		if (strcmp(t->tracks[k], name) == 0)
			return k + 1;
	if (t->ntracks == MAX_TRACKS)
		return MAX_TRACKS + 1;
	snprintf(t->tracks[t->ntracks], NAME_LEN, "%s", name);
	return ++t->ntracks;
}

static uint64_t us_to_ns(double us)
{
	return us > 0 ? (uint64_t)llround(us * 1000.0) : 0;
}

/* The file's track names by tid: pid 2's thread_name records. */
static void track_names(const raw_event *ev, size_t n, const char *names[MAX_TRACKS + 2])
{
	for (unsigned k = 0; k < MAX_TRACKS + 2; k++)
		names[k] = NULL;
	for (size_t i = 0; i < n; i++)
		if (ev[i].ph[0] == 'M' && ev[i].pid == 2 && ev[i].tid >= 1 && ev[i].tid <= MAX_TRACKS + 1 &&
		    strcmp(ev[i].name, "thread_name") == 0)
			names[(unsigned)ev[i].tid] = ev[i].arg_name;
}

static const char *track_of(const raw_event *e, const char *const names[MAX_TRACKS + 2])
{
	return e->pid == 2 && e->tid >= 1 && e->tid <= MAX_TRACKS + 1 ? names[(unsigned)e->tid] : NULL;
}

static int merge(bench_trace *t, const char *path, const char *mode, uint64_t created_ns, const raw_event *ev,
		 size_t n)
{
	/* The file's origin on the host clock, from the span that started at created_ns. */
	char mark[NAME_LEN];
	snprintf(mark, sizeof(mark), "%s runtime", mode);
	const char *names[MAX_TRACKS + 2];
	track_names(ev, n, names);
	const raw_event *m = NULL;
	for (size_t i = 0; i < n && !m; i++) {
		const char *track = ev[i].ph[0] == 'X' ? track_of(&ev[i], names) : NULL;
		if (track && strcmp(track, "bench") == 0 && strcmp(ev[i].name, mark) == 0)
			m = &ev[i];
	}
	if (!m || us_to_ns(m->ts) > created_ns) {
		fprintf(stderr, "vmmrt-bench: --trace: %s: no span '%s' in %s, so its times cannot be placed\n", mode, mark,
			path);
		return -1;
	}
	uint64_t origin = created_ns - us_to_ns(m->ts);
	for (size_t i = 0; i < n; i++) {
		const raw_event *r = &ev[i];
		bool thread_name = r->ph[0] == 'M' && strcmp(r->name, "thread_name") == 0;
		if (r->ph[0] == 'X' && (r->pid == 1 || r->pid == 2)) {
			const char *track = track_of(r, names);
			tev *e = add(t);
			if (!e)
				goto oom;
			e->pid = (int)r->pid;
			e->tid = r->pid == 2 ? track_id(t, track ? track : "?") : (long)r->tid;
			snprintf(e->name, sizeof(e->name), "%s", r->name);
			e->t0 = origin + us_to_ns(r->ts);
			e->dur = us_to_ns(r->dur);
			e->bytes = r->bytes > 0 ? (uint64_t)llround(r->bytes) : 0;
		} else if (thread_name && r->pid == 1) {
			tev *e = add(t);
			if (!e)
				goto oom;
			e->pid = 1;
			e->tid = (long)r->tid;
			e->meta = true;
			snprintf(e->name, sizeof(e->name), "%s %s", mode, r->arg_name);
		}
	}
	return 0;
oom:
	fprintf(stderr, "vmmrt-bench: --trace: %s: out of host memory\n", mode);
	return -1;
}

void bench_trace_absorb(bench_ctx *ctx, const char *mode, uint64_t created_ns)
{
	bench_trace *t = ctx->trace;
	if (!t)
		return;
	size_t len = 0, n = 0;
	raw_event *ev = NULL;
	char *buf = read_file(ctx->trace_path, &len);
	if (!buf) {
		fprintf(stderr, "vmmrt-bench: --trace: %s: cannot read %s: %s\n", mode, ctx->trace_path, strerror(errno));
		t->failed = true;
		return;
	}
	reader r = {buf, buf + len};
	if (!parse(&r, &ev, &n)) {
		fprintf(stderr, "vmmrt-bench: --trace: %s: %s is not a trace the bench can read (near byte %zu)\n", mode,
			ctx->trace_path, (size_t)(r.p - buf));
		t->failed = true;
	} else if (merge(t, ctx->trace_path, mode, created_ns, ev, n) != 0) {
		t->failed = true;
	}
	free(ev);
	free(buf);
}

/* ------------------------------------------------------------- the writer */

int bench_trace_close(bench_ctx *ctx)
{
	bench_trace *t = ctx->trace;
	if (!t)
		return 0;
	int rc = t->failed ? -1 : 0;
	FILE *f = fopen(ctx->trace_path, "w");
	if (!f) {
		fprintf(stderr, "vmmrt-bench: --trace: cannot write '%s': %s\n", ctx->trace_path, strerror(errno));
		rc = -1;
		goto out;
	}
	uint64_t origin = UINT64_MAX;
	for (size_t i = 0; i < t->n; i++)
		if (!t->ev[i].meta && t->ev[i].t0 < origin)
			origin = t->ev[i].t0;
	if (origin == UINT64_MAX)
		origin = 0;
	/* The layout of the library's own traces: host threads are pid 1, named
	 * tracks pseudo-threads of pid 2. */
	fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n", f);
	fputs("{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"host threads\"}},\n", f);
	fputs("{\"ph\":\"M\",\"pid\":2,\"name\":\"process_name\",\"args\":{\"name\":\"device streams\"}}", f);
	/* the modes run on the main thread, whose thread id is the process id */
	fprintf(f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%ld,\"name\":\"thread_name\",\"args\":{\"name\":\"launch thread\"}}",
		(long)getpid());
	for (unsigned k = 0; k < t->ntracks; k++) {
		fprintf(f, ",\n{\"ph\":\"M\",\"pid\":2,\"tid\":%u,\"name\":\"thread_name\",\"args\":{\"name\":", k + 1);
		bench_json_string(f, t->tracks[k]);
		fputs("}}", f);
	}
	for (size_t i = 0; i < t->n; i++) {
		const tev *e = &t->ev[i];
		if (e->meta) {
			fprintf(f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%ld,\"name\":\"thread_name\",\"args\":{\"name\":", e->tid);
			bench_json_string(f, e->name);
			fputs("}}", f);
			continue;
		}
		fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%ld,\"name\":", e->pid, e->tid);
		bench_json_string(f, e->name);
		fprintf(f, ",\"ts\":%.3f,\"dur\":%.3f", (double)(e->t0 - origin) / 1000.0, (double)e->dur / 1000.0);
		if (e->bytes)
			fprintf(f, ",\"args\":{\"bytes\":%llu}", (unsigned long long)e->bytes);
		fputc('}', f);
	}
	fputs("\n]}\n", f);
	if (fclose(f) != 0) {
		fprintf(stderr, "vmmrt-bench: --trace: write to '%s' failed\n", ctx->trace_path);
		rc = -1;
	}
out:
	free(t->ev);
	free(t);
	ctx->trace = NULL;
	return rc;
}
