/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Stream-ordered backing of the application's own slots, between
 * iterations: a few slots and a stream of their own, and random cycles of
 * map (vmmrt_slot_map_async, vmmrt_slot_wait), fill, compute for a random
 * while over the fill, checksum, and release after the stream
 * (vmmrt_slot_release_after), so that a release runs before the slot's next
 * map or is overtaken by it as the timing falls. Some cycles release right
 * after the fill and map again before the stream may pass the release (the
 * stream waits on a host word until then): the computation must then find
 * the fill's bytes, which a release that ran anyway would have taken (new
 * memory, or on the host backend a fault).
 *
 * Half the runs map the way a launch thread that never waits does: the map
 * follows an event on a second stream busy for a random while
 * (vmmrt_slot_map_after) and the stream waits for it on the device
 * (vmmrt_slot_wait_stream), so the fill after it runs over memory only a
 * correct wait guarantees. With faults armed, such a map is also waited for
 * on the host before the fill (a map that failed must not be written
 * through): the stream's wait must then have been let go however the map
 * ended, or the clean-up's drain hangs.
 *
 * Checked: every cycle's checksum; the slots' memory is what slot_bytes
 * says once the releases have run, and none is left after destroy (the
 * scenario's end checks the handles too); a map never leaves a slot
 * unmapped. Injected faults end the cycles with a named error, as anywhere.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "driver.h"
#include "runtime.h"
#include "scenario.h"

#define NSLOTS 3
#define NCYCLES 24
_Static_assert(NCYCLES <= S_MAX_CYCLES, "s_verify_cycles reads at most S_MAX_CYCLES");

typedef struct slots_run {
	scen *s;
	vmmrt_stream st;
	vmmrt_stream side;       /* stream_ordered: the work a map follows */
	vmmrt_event *after;
	bool stream_ordered;     /* maps by map_after and wait_stream */
	vmmrt_slot *x[NSLOTS], *res;
	unsigned n;
	uint32_t *gate;          /* pinned: the stream waits until it reaches gate_at */
	vmmrt_devptr gate_dev;
	uint32_t gate_at;
	uint64_t want[NCYCLES];
	bool launched[NCYCLES];
	bool forced[NCYCLES];    /* its gate was opened by the keeper: not checked */
} slots_run;

#define OK(r, what, call) s_ok((r)->s, API((r)->s, what, call), what)

static uint64_t slot_bytes(scen *s)
{
	vmmrt_offload_stats st = {.size = sizeof(st)};
	return vmmrt_offload_stats_get(s->rt, &st) == VMMRT_OK ? st.slot_bytes : UINT64_MAX;
}

static bool setup(slots_run *r)
{
	scen *s = r->s;
	void *p = NULL;
	if (!OK(r, "vmmrt_stream_create", vmmrt_stream_create(s->rt, &r->st)))
		return false;
	if (!OK(r, "vmmrt_host_alloc", vmmrt_host_alloc(s->rt, 64, &p)))
		return false;
	r->gate = p;
	__atomic_store_n(r->gate, 0, __ATOMIC_SEQ_CST);
	if (!OK(r, "host_devptr", vmmrt__drv_host_devptr(s->rt, p, &r->gate_dev)))
		return false;
	if (!OK(r, "vmmrt_slot_create", vmmrt_slot_create(s->rt, NCYCLES * 8, &r->res)))
		return false;
	if (!OK(r, "vmmrt_slot_map", vmmrt_slot_map(r->res)))
		return false;
	t_range_add(vmmrt_slot_address(r->res), vmmrt_slot_size(r->res), s->seed);
	if (r->stream_ordered &&
	    (!OK(r, "vmmrt_stream_create", vmmrt_stream_create(s->rt, &r->side)) ||
	     !OK(r, "vmmrt_event_create", vmmrt_event_create(s->rt, 0, &r->after))))
		return false;
	r->n = (unsigned)rnd_in(&s->r, 1, NSLOTS);
	for (unsigned k = 0; k < r->n; k++) {
		size_t bytes = (size_t)rnd_in(&s->r, 1, 2 * s->gran);
		if (!OK(r, "vmmrt_slot_create", vmmrt_slot_create(s->rt, bytes, &r->x[k])))
			return false;
		t_range_add(vmmrt_slot_address(r->x[k]), vmmrt_slot_size(r->x[k]), s->seed);
	}
	return true;
}

/* The map before a use, after a random while of the side stream's, and the
 * stream's wait for it: nobody on the host waits, unless faults may fail it. */
static bool map_on_stream(slots_run *r, vmmrt_slot *x)
{
	scen *s = r->s;
	uint64_t ns = rnd_in(&s->r, 0, 2000000);
	if (!OK(r, "vmmrt_kernel_busy", vmmrt_kernel_busy(s->rt, r->side, ns)) ||
	    !OK(r, "vmmrt_event_record", vmmrt_event_record(s->rt, r->after, r->side)) ||
	    !OK(r, "vmmrt_slot_map_after", vmmrt_slot_map_after(x, r->after)) ||
	    !OK(r, "vmmrt_slot_wait_stream", vmmrt_slot_wait_stream(x, r->st)))
		return false;
	return s->fc.rate == 0 || OK(r, "vmmrt_slot_wait", vmmrt_slot_wait(x));
}

/* The map before a use: queued, then waited for on the worker (not the GPU),
 * or on the stream. */
static bool map(slots_run *r, vmmrt_slot *x)
{
	if (r->stream_ordered) {
		if (!map_on_stream(r, x))
			return false;
	} else if (!OK(r, "vmmrt_slot_map_async", vmmrt_slot_map_async(x)) ||
		   !OK(r, "vmmrt_slot_wait", vmmrt_slot_wait(x))) {
		return false;
	}
	if (r->stream_ordered && r->s->fc.rate == 0)
		return true; /* PENDING, MAPPED: the stream knows when */
	vmmrt_slot_state now = vmmrt_slot_get_state(x);
	if (now != VMMRT_SLOT_MAPPED && now != VMMRT_SLOT_PENDING && !fault_causes(&r->s->fc))
		t_fail(r->s->seed, "slot-state", "slot %p in state %d after vmmrt_slot_wait succeeded", (void *)x, (int)now);
	return true;
}

/*
 * The gate's keeper: a thread that makes no driver call and opens the gate
 * if the torture thread has not within a bound. While the gate holds the
 * stream, the device is not idle; a call of another thread that
 * synchronizes it (cuMemFreeHost: vmmrt_host_free, a destroy that frees
 * pinned memory) then holds the driver until the stream has passed, and on
 * the H200 this thread's next driver call (cuEventRecord in
 * vmmrt_slot_release_after) waited behind it: neither could go on, a hang
 * of the torture's own making. Opened by the keeper, the gate may let the
 * stream pass the release before the map: that cycle is not checked.
 */
typedef struct gate_keeper {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;               /* the torture thread got through its calls */
	uint32_t *gate, at;
	bool forced;
} gate_keeper;

static void *keep_gate(void *arg)
{
	gate_keeper *k = arg;
	uint64_t ms = 2ull * cfg.timeout_ms + 1000;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&k->lock);
	while (!k->done)
		if (pthread_cond_timedwait(&k->cond, &k->lock, &ts) == ETIMEDOUT)
			break;
	if (!k->done) {
		k->forced = true;
		__atomic_store_n(k->gate, k->at, __ATOMIC_SEQ_CST);
	}
	pthread_mutex_unlock(&k->lock);
	return NULL;
}

/*
 * Release right after the fill, then map again while the stream is held on
 * the gate (so it cannot have passed the release): the release must come to
 * nothing. The gate opens whatever happens, or the stream would wait for
 * ever: by this thread once its calls returned, or by the keeper (above).
 */
static bool release_and_map_again(slots_run *r, vmmrt_slot *x, unsigned c)
{
	scen *s = r->s;
	uint32_t at = ++r->gate_at;
	gate_keeper k = {.gate = r->gate, .at = at};
	pthread_t keeper;
	pthread_mutex_init(&k.lock, NULL);
	pthread_cond_init(&k.cond, NULL);
	if (pthread_create(&keeper, NULL, keep_gate, &k) != 0) {
		pthread_cond_destroy(&k.cond);
		pthread_mutex_destroy(&k.lock);
		return true; /* no gate without its keeper: the cycle goes on ungated */
	}
	bool ok = OK(r, "stream_wait_value32", vmmrt__drv_stream_wait_value32(s->rt, r->st, r->gate_dev, at)) &&
		  OK(r, "vmmrt_slot_release_after", vmmrt_slot_release_after(x, r->st)) && map(r, x);
	pthread_mutex_lock(&k.lock);
	k.done = true;
	if (!k.forced)
		__atomic_store_n(r->gate, at, __ATOMIC_SEQ_CST);
	pthread_cond_signal(&k.cond);
	pthread_mutex_unlock(&k.lock);
	pthread_join(keeper, NULL);
	pthread_cond_destroy(&k.cond);
	pthread_mutex_destroy(&k.lock);
	if (k.forced) {
		r->forced[c] = true;
		t_note(1, "scenario %016" PRIx64 ": slot cycle %u: the gate's keeper opened it (a driver call held "
			  "behind another thread's synchronizing one); the cycle is not checked", s->seed, c);
	}
	return ok;
}

static bool cycle(slots_run *r, unsigned c)
{
	scen *s = r->s;
	vmmrt_slot *x = r->x[rnd(&s->r) % r->n];
	vmmrt_devptr va = vmmrt_slot_address(x);
	size_t n = vmmrt_slot_size(x);
	uint64_t in = rnd(&s->r), layer = rnd(&s->r);
	if (!map(r, x))
		return false;
	if (!OK(r, "vmmrt_kernel_fill", vmmrt_kernel_fill(s->rt, r->st, va, n, in)))
		return false;
	if (chance(&s->r, 0.3) && !release_and_map_again(r, x, c))
		return false;
	/* Over the fill, for a random while: the stream's delay. */
	uint64_t ns = rnd_in(&s->r, 0, 3000000);
	if (!OK(r, "vmmrt_kernel_layer", vmmrt_kernel_layer(s->rt, r->st, va, va, n, layer, ns)) ||
	    !OK(r, "vmmrt_kernel_checksum",
		vmmrt_kernel_checksum(s->rt, r->st, va, n, vmmrt_slot_address(r->res) + 8 * (vmmrt_devptr)c)))
		return false;
	r->want[c] = vmmrt_layer_checksum_host(n, in, layer);
	r->launched[c] = true;
	if (chance(&s->r, 0.6) && !OK(r, "vmmrt_slot_release_after", vmmrt_slot_release_after(x, r->st)))
		return false;
	if (chance(&s->r, 0.1)) {
		struct timespec ts = {0, (long)rnd_in(&s->r, 100000, 4000000)}; /* the GPU catches up, or not */
		nanosleep(&ts, NULL);
	}
	return true;
}

/* Until the releases waiting for their events have run (bounded). */
static void settle(slots_run *r)
{
	uint64_t deadline = t_now_ns() + ((uint64_t)cfg.timeout_ms + 5000) * 1000000ull;
	for (unsigned k = 0; k < r->n; k++)
		while (r->x[k] && vmmrt_slot_get_state(r->x[k]) == VMMRT_SLOT_PENDING && t_now_ns() < deadline) {
			struct timespec ts = {0, 200000};
			nanosleep(&ts, NULL);
		}
}

void s_verify_cycles(scen *s, vmmrt_slot *res, unsigned n, const uint64_t *want, const bool *launched,
		     const bool *forced, _Atomic uint64_t *verified, const char *what, const char *why)
{
	uint64_t got[S_MAX_CYCLES];
	if (n > S_MAX_CYCLES)
		n = S_MAX_CYCLES;
	/* Nothing launched, nothing to read: res may never have been mapped
	 * (its map failed), and a copy from it would fault the host stream. */
	unsigned c = 0;
	while (c < n && !launched[c])
		c++;
	if (c == n)
		return;
	if (!s_ok(s, API(s, "vmmrt_copy_to_host", vmmrt_copy_to_host(s->rt, got, vmmrt_slot_address(res), 8 * n)),
		  "vmmrt_copy_to_host"))
		return;
	for (c = 0; c < n; c++) {
		if (!launched[c])
			continue;
		if (forced && forced[c]) {
			atomic_fetch_add_explicit(&T.excused, 1, memory_order_relaxed);
			continue;
		}
		if (got[c] == want[c]) {
			atomic_fetch_add_explicit(verified, 1, memory_order_relaxed);
			continue;
		}
		atomic_fetch_add_explicit(&T.corrupted, 1, memory_order_relaxed);
		t_fail(s->seed, "corrupted", "%s cycle %u: checksum %016" PRIx64 ", want %016" PRIx64 " (%s)", what, c,
		       got[c], want[c], why);
	}
}

void s_slot_destroy(scen *s, vmmrt_slot *x)
{
	vmmrt_devptr va = vmmrt_slot_address(x);
	if (s_ok(s, API(s, "vmmrt_slot_destroy", vmmrt_slot_destroy(x)), "vmmrt_slot_destroy"))
		t_range_del(va);
	else if (s->nleft < 4)
		s->leftover[s->nleft++] = x; /* still live: destroyed again at the end */
}

void slot_backing(scen *s)
{
	if (s->errored)
		return;
	slots_run r = {.s = s, .stream_ordered = chance(&s->r, 0.5)};
	uint64_t base = slot_bytes(s); /* the scenario's input and results slots */
	unsigned cycles = (unsigned)rnd_in(&s->r, 4, NCYCLES);
	bool ready = setup(&r); /* the results slot mapped, among the rest */
	for (unsigned c = 0; ready && c < cycles && cycle(&r, c); c++)
		;
	/* From here on, clean-up: nothing injected, and everything checked. */
	s_quiet(s, true);
	bool drained = !r.st || OK(&r, "vmmrt_stream_synchronize", vmmrt_stream_synchronize(s->rt, r.st));
	if (r.side && !OK(&r, "vmmrt_stream_synchronize", vmmrt_stream_synchronize(s->rt, r.side)))
		drained = false;
	settle(&r);
	if (drained && ready)
		s_verify_cycles(s, r.res, NCYCLES, r.want, r.launched, r.forced, &T.slot_cycles, "slot",
				"a release that a later map should have cancelled, or one that did not wait for its stream");
	if (ready && !s->errored && !fault_causes(&s->fc)) {
		uint64_t mapped = 0, now = slot_bytes(s);
		for (unsigned k = 0; k < r.n; k++)
			if (vmmrt_slot_get_state(r.x[k]) == VMMRT_SLOT_MAPPED)
				mapped += vmmrt_slot_size(r.x[k]);
		if (now != base + vmmrt_slot_size(r.res) + mapped)
			t_fail(s->seed, "slot-bytes", "slot_bytes %" PRIu64 ", want %" PRIu64 " (before %" PRIu64
			       ", results %zu, mapped %" PRIu64 ")", now, base + vmmrt_slot_size(r.res) + mapped, base,
			       vmmrt_slot_size(r.res), mapped);
	}
	if (drained) {
		for (unsigned k = 0; k < r.n; k++)
			if (r.x[k])
				s_slot_destroy(s, r.x[k]);
		if (r.res)
			s_slot_destroy(s, r.res);
		if (!s->errored && !fault_causes(&s->fc) && slot_bytes(s) != base)
			t_fail(s->seed, "slot-bytes", "slot_bytes %" PRIu64 " after destroy, %" PRIu64 " before",
			       slot_bytes(s), base);
	}
	if (r.gate && drained) /* the stream may still wait on it otherwise */
		(void)vmmrt_host_free(s->rt, r.gate);
	if (r.st && drained)
		(void)OK(&r, "vmmrt_stream_destroy", vmmrt_stream_destroy(s->rt, r.st));
	if (r.after && drained)
		(void)OK(&r, "vmmrt_event_destroy", vmmrt_event_destroy(s->rt, r.after));
	if (r.side && drained)
		(void)OK(&r, "vmmrt_stream_destroy", vmmrt_stream_destroy(s->rt, r.side));
	s_quiet(s, false);
}
