/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-handoff: how fast a host function hands a request to a driver worker.
 *
 * Producers are host functions enqueued on several streams (on a GPU, the
 * driver's callback thread; on the host backend, the stream threads). Each
 * pushes one preallocated request; the consumer records the latency from the
 * push to the moment it starts the request. Two queues, same run, same load:
 *   lockfree: libvmmrt's workers (wfcqueue + ck_ec event count);
 *   mutex:    a mutex + condition variable queue, the seed's design.
 * Prints p50/p99 latency and throughput for each and their ratio.
 *
 *   vmmrt-handoff [--requests=N] [--streams=S] [--burst=B] [--json=FILE] [runtime options]
 */
#include "config.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>

#include "runtime.h"
#include "worker.h"

typedef struct sample_set {
	uint64_t *ns;
	int64_t n;
} sample_set;

/* ---------------------------------------------------------- lock-free side */

typedef struct lf_item {
	vmmrt__request req;
	vmmrt__workers *w;
	sample_set *out;
} lf_item;

static void lf_consume(void *arg)
{
	lf_item *it = arg;
	/* start_ns was taken by the worker when it picked the request up. */
	int64_t i = uatomic_add_return(&it->out->n, 1) - 1;
	it->out->ns[i] = it->req.start_ns - it->req.enqueue_ns;
}

static void lf_produce(void *arg)
{
	lf_item *it = arg;
	(void)vmmrt__worker_push(it->w, 0, &it->req);
}

/* ------------------------------------------------------------- mutex side */

typedef struct mx_item {
	struct mx_item *next;
	uint64_t enqueue_ns;
	struct mx_queue *q;
} mx_item;

typedef struct mx_queue {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	mx_item *head, **tail;
	bool stop;
	sample_set *out;
	pthread_t thread;
} mx_queue;

static void mx_produce(void *arg)
{
	mx_item *it = arg;
	mx_queue *q = it->q;
	it->next = NULL;
	it->enqueue_ns = vmmrt__now_ns(); /* before the lock: waiting for it is hand-off cost */
	pthread_mutex_lock(&q->lock);
	*q->tail = it;
	q->tail = &it->next;
	pthread_cond_signal(&q->cond);
	pthread_mutex_unlock(&q->lock);
}

static void *mx_consumer(void *arg)
{
	mx_queue *q = arg;
	pthread_mutex_lock(&q->lock);
	for (;;) {
		while (!q->head && !q->stop)
			pthread_cond_wait(&q->cond, &q->lock);
		if (!q->head)
			break;
		mx_item *it = q->head;
		q->head = it->next;
		if (!q->head)
			q->tail = &q->head;
		uint64_t now = vmmrt__now_ns();
		q->out->ns[q->out->n++] = now - it->enqueue_ns;
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

/* ------------------------------------------------------------------ driver */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

typedef struct result {
	double p50_us, p99_us, max_us, per_s;
} result;

static result summarize(sample_set *s, uint64_t elapsed_ns)
{
	result r = {0};
	if (s->n == 0)
		return r;
	qsort(s->ns, (size_t)s->n, sizeof(uint64_t), cmp_u64);
	r.p50_us = (double)s->ns[(s->n - 1) / 2] / 1000.0;
	r.p99_us = (double)s->ns[(int64_t)((double)(s->n - 1) * 0.99)] / 1000.0;
	r.max_us = (double)s->ns[s->n - 1] / 1000.0;
	r.per_s = (double)s->n / ((double)elapsed_ns / 1e9);
	return r;
}

/* Enqueue `requests` host functions round-robin on the streams, in bursts. */
static vmmrt_status drive(vmmrt_runtime *rt, vmmrt_stream *st, unsigned streams, unsigned requests, unsigned burst,
			  vmmrt__host_fn fn, void *items, size_t item_size, uint64_t *elapsed)
{
	uint64_t t0 = vmmrt__now_ns();
	for (unsigned i = 0; i < requests; i++) {
		vmmrt_status s = vmmrt__drv_launch_host_func(rt, st[i % streams], fn, (char *)items + i * item_size);
		if (s != VMMRT_OK)
			return s;
		if (burst && (i + 1) % burst == 0)
			for (unsigned k = 0; k < streams; k++)
				if ((s = vmmrt__drv_stream_synchronize(rt, st[k])) != VMMRT_OK)
					return s;
	}
	for (unsigned k = 0; k < streams; k++)
		(void)vmmrt__drv_stream_synchronize(rt, st[k]);
	*elapsed = vmmrt__now_ns() - t0;
	return VMMRT_OK;
}

static unsigned flag_u(int argc, char **argv, const char *name, unsigned def)
{
	size_t n = strlen(name);
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], name, n) && argv[i][n] == '=')
			return (unsigned)strtoul(argv[i] + n + 1, NULL, 10);
	return def;
}

static const char *flag_s(int argc, char **argv, const char *name)
{
	size_t n = strlen(name);
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], name, n) && argv[i][n] == '=')
			return argv[i] + n + 1;
	return NULL;
}

int main(int argc, char **argv)
{
	vmmrt_options *o;
	vmmrt_runtime *rt;
	if (vmmrt_options_create(&o) != VMMRT_OK || vmmrt__options_parse_args(o, &argc, argv) != VMMRT_OK) {
		fprintf(stderr, "vmmrt-handoff: %s\n", vmmrt_last_error());
		return 2;
	}
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--help")) {
			printf("usage: vmmrt-handoff [--requests=N] [--streams=S] [--burst=B] [--json=FILE] "
			       "[runtime options]\n");
			vmmrt__options_print_help(stdout);
			return 0;
		}
	unsigned requests = flag_u(argc, argv, "--requests", 20000);
	unsigned streams = flag_u(argc, argv, "--streams", 2);
	unsigned burst = flag_u(argc, argv, "--burst", 64);
	const char *json = flag_s(argc, argv, "--json");
	if (!requests || !streams || streams > 16) {
		fprintf(stderr, "vmmrt-handoff: need 1..16 streams and at least one request\n");
		return 2;
	}
	if (vmmrt_runtime_create(o, &rt) != VMMRT_OK) {
		fprintf(stderr, "vmmrt-handoff: %s\n", vmmrt_last_error());
		return 1;
	}
	vmmrt_options_destroy(o);
	vmmrt_runtime_info info = {.size = sizeof(info)};
	vmmrt_runtime_info_get(rt, &info);

	vmmrt_stream st[16];
	for (unsigned k = 0; k < streams; k++)
		if (vmmrt__drv_stream_create(rt, &st[k]) != VMMRT_OK)
			return 1;

	sample_set lf = {calloc(requests, sizeof(uint64_t)), 0}, mx = {calloc(requests, sizeof(uint64_t)), 0};
	lf_item *lfi = calloc(requests, sizeof(*lfi));
	mx_item *mxi = calloc(requests, sizeof(*mxi));
	vmmrt__workers *w;
	if (!lf.ns || !mx.ns || !lfi || !mxi || vmmrt__workers_create(rt, 1, NULL, &w) != VMMRT_OK) {
		fprintf(stderr, "vmmrt-handoff: setup failed\n");
		return 1;
	}
	for (unsigned i = 0; i < requests; i++) {
		vmmrt__request_init_call(&lfi[i].req, NULL, NULL);
		lfi[i].req.fn = lf_consume;
		lfi[i].req.arg = &lfi[i];
		lfi[i].w = w;
		lfi[i].out = &lf;
	}
	mx_queue q = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .out = &mx};
	q.tail = &q.head;
	for (unsigned i = 0; i < requests; i++)
		mxi[i].q = &q;
	pthread_create(&q.thread, NULL, mx_consumer, &q);

	uint64_t lf_ns = 0, mx_ns = 0;
	/* Interleave halves of each so machine noise hits both alike. */
	unsigned half = requests / 2;
	uint64_t e;
	drive(rt, st, streams, half, burst, lf_produce, lfi, sizeof(*lfi), &e);
	lf_ns += e;
	drive(rt, st, streams, half, burst, mx_produce, mxi, sizeof(*mxi), &e);
	mx_ns += e;
	drive(rt, st, streams, requests - half, burst, lf_produce, lfi + half, sizeof(*lfi), &e);
	lf_ns += e;
	drive(rt, st, streams, requests - half, burst, mx_produce, mxi + half, sizeof(*mxi), &e);
	mx_ns += e;

	vmmrt__workers_destroy(w, true);
	pthread_mutex_lock(&q.lock);
	q.stop = true;
	pthread_cond_signal(&q.cond);
	pthread_mutex_unlock(&q.lock);
	pthread_join(q.thread, NULL);

	result a = summarize(&lf, lf_ns), b = summarize(&mx, mx_ns);
	printf("hand-off host function -> worker, %s backend (%s), %u requests on %u streams, bursts of %u\n",
	       info.backend, info.device, requests, streams, burst);
	printf("%-10s %10s %10s %10s %12s\n", "queue", "p50_us", "p99_us", "max_us", "per_s");
	printf("%-10s %10.2f %10.2f %10.2f %12.0f\n", "lockfree", a.p50_us, a.p99_us, a.max_us, a.per_s);
	printf("%-10s %10.2f %10.2f %10.2f %12.0f\n", "mutex", b.p50_us, b.p99_us, b.max_us, b.per_s);
	printf("ratio mutex/lockfree: p50 %.2fx, p99 %.2fx; throughput lockfree/mutex %.2fx\n",
	       a.p50_us > 0 ? b.p50_us / a.p50_us : 0, a.p99_us > 0 ? b.p99_us / a.p99_us : 0,
	       b.per_s > 0 ? a.per_s / b.per_s : 0);
	int rc = (lf.n == (int64_t)requests && mx.n == (int64_t)requests) ? 0 : 1;
	if (rc)
		fprintf(stderr, "vmmrt-handoff: lost requests: lockfree %" PRId64 ", mutex %" PRId64 " of %u\n", lf.n,
			mx.n, requests);
	if (json) {
		FILE *f = fopen(json, "w");
		if (f) {
			fprintf(f,
				"{\"backend\":\"%s\",\"requests\":%u,\"streams\":%u,\"burst\":%u,"
				"\"lockfree\":{\"p50_us\":%.3f,\"p99_us\":%.3f,\"max_us\":%.3f,\"per_s\":%.0f},"
				"\"mutex\":{\"p50_us\":%.3f,\"p99_us\":%.3f,\"max_us\":%.3f,\"per_s\":%.0f},"
				"\"p50_ratio\":%.3f,\"p99_ratio\":%.3f}\n",
				info.backend, requests, streams, burst, a.p50_us, a.p99_us, a.max_us, a.per_s, b.p50_us,
				b.p99_us, b.max_us, b.per_s, a.p50_us > 0 ? b.p50_us / a.p50_us : 0,
				a.p99_us > 0 ? b.p99_us / a.p99_us : 0);
			fclose(f);
		}
	}
	for (unsigned k = 0; k < streams; k++)
		vmmrt__drv_stream_destroy(rt, st[k]);
	free(lf.ns);
	free(mx.ns);
	free(lfi);
	free(mxi);
	vmmrt_runtime_destroy(rt);
	return rc;
}
