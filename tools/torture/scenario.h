/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* One torture scenario: a runtime, its groups and graphs, and what was checked. */
#ifndef VMMRT__TORTURE_SCENARIO_H
#define VMMRT__TORTURE_SCENARIO_H

#include "torture.h"

#define MAXG 8       /* groups per runtime */
#define MAXT 4       /* tensors per group */
#define MAXIT 64     /* iterations per runtime */
#define RESULT_POISON 0x5eb0a7ed5eb0a7edULL /* a result slot no backward graph wrote */

typedef struct tens {
	vmmrt_tensor_desc d;
	uint64_t seed;           /* the forward kernel's pattern */
	vmmrt_devptr addr;       /* fixed address handed out at capture */
	unsigned rix;            /* its 8-byte word in the result slot */
} tens;

typedef struct grp {
	vmmrt_group *g;
	char name[24];
	unsigned nt;             /* 0: an empty group (its hooks are no-ops) */
	tens t[MAXT];
	vmmrt_graph *fwd, *bwd;
	vmmrt_devptr base;       /* vmmrt_group_address at capture */
	size_t bytes;
} grp;

/* Calls made from inside a host function on the compute stream. */
#define HOSTFN_CALLS 23
typedef struct hostfn_probe {
	struct scen *s;
	_Atomic int ran;
	unsigned n;
	vmmrt_status st[HOSTFN_CALLS];
	const char *what[HOSTFN_CALLS];
	bool side_effect;        /* a call that was not refused changed something */
} hostfn_probe;

typedef struct scen {
	tthread *th;
	uint64_t seed;
	trng r;
	fault_ctx fc;
	vmmrt_runtime *rt;
	bool cuda;

	/* configuration */
	vmmrt_mode mode;
	unsigned lookahead, workers, pool, oom_retries;
	bool latency;
	double gbps;
	size_t gran;
	uint64_t fwd_ns, bwd_ns;
	unsigned ng, nonempty;
	grp G[MAXG];
	unsigned fwd_order[MAXG], bwd_order[MAXG];
	/* The order of an iteration: use k is group use_g[k]'s backward if
	 * use_b[k]. All forwards (fwd_order) then all backwards (bwd_order), or
	 * a random legal interleaving (each forward before its backward). */
	unsigned use_g[2 * MAXG];
	bool use_b[2 * MAXG];
	bool interleaved;
	bool declared;           /* vmmrt_offload_set_schedule before every allocation */
	bool recorded;           /* the library knows the order (declared, or an iteration ran whole) */
	unsigned nres;           /* tensors in all groups */
	size_t input_bytes;
	unsigned target_iters;
	bool end_in_flight;      /* remap: end right after a last forward, copies slow (see configure) */

	/* objects of the application side */
	vmmrt_stream compute;
	vmmrt_slot *input, *results;
	uint64_t *hres;          /* pinned: [MAXIT][nres] */
	vmmrt_slot *leftover[4]; /* slots whose destroy failed (a named error): again at the end */
	unsigned nleft;
	uint64_t iterseed[MAXIT];
	uint8_t launched[MAXIT][MAXG];  /* backward graph and its result copy enqueued */
	uint8_t verified[MAXIT][MAXG];
	unsigned iters;
	bool allocated, captured, stats_reset;
	unsigned reset_at;       /* the statistics restart at a quiet point from this iteration on */
	bool reallocated;        /* re-discovered since: bank sizes no longer one group's */
	/* re-discovered groups' old graphs and address ranges, until released */
	vmmrt_graph *old_graphs[4 * MAXG];
	unsigned nold_graphs;
	vmmrt_devptr old_base[4 * MAXG];
	unsigned nold_base;
	unsigned quiet_it;       /* the first iteration after the last quiet point (a checkpoint) */
	size_t base_free, base_total;

	/* what happened */
	bool errored;            /* a named error was reported: wind down */
	vmmrt_status first_err;
	char errmsg[320];
	bool stuck;              /* the compute stream would not drain */
	hostfn_probe probe;
	bool probe_pending;
	uint64_t checked_illegal;
} scen;

/* scenario.c */
void s_begin(scen *s, const char *what);
void s_end(scen *s);
#define API(s, what, expr) \
	__extension__({ \
		s_begin((s), (what)); \
		vmmrt_status st_api_ = (expr); \
		s_end(s); \
		st_api_; \
	})
/* A call of a legal sequence: true if it succeeded; else the error must be
 * named and explained by an injected fault, and the scenario winds down. */
bool s_ok(scen *s, vmmrt_status st, const char *what);
/* Suppress (or allow again) injected failures around clean-up calls. */
void s_quiet(scen *s, bool on);

static inline void heartbeat(scen *s, const char *what)
{
	atomic_store_explicit(&s->th->step, what, memory_order_relaxed);
	atomic_store_explicit(&s->th->heartbeat_ns, t_now_ns(), memory_order_relaxed);
}

static inline const char *mode_name(vmmrt_mode m)
{
	return m == VMMRT_MODE_REMAP ? "remap" : m == VMMRT_MODE_PINGPONG ? "pingpong" : "none";
}

static inline size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

/* settings.c */
/* Everything the scenario does, drawn from its seed (s->r). */
void s_configure(scen *s);
/* The runtime of those settings, with the fault hook set. */
bool s_create_runtime(scen *s);

/* verify.c */
/* Check the results of every launched backward not checked yet. */
void s_verify(scen *s);
/* Results of launched backwards that cannot be looked at (the stream is stuck): excused. */
void s_excuse_pending(scen *s);
/* Bounded wait until the compute stream is idle; false if it is not by then. */
bool s_drain_compute(scen *s, uint64_t limit_ms);
uint64_t s_drain_limit_ms(scen *s);
/* A quiet point (vmmrt_offload_sync first if `sync`): everything enqueued so
 * far has finished and is checked, with the invariants of a quiet point. */
void s_checkpoint(scen *s, bool sync);

/* capture.c */
/* begin / save each tensor (drifted saves refused) / end; `again`: the
 * addresses must be those of the first capture. */
bool s_capture_group(scen *s, grp *g, bool again);
/* The group's forward and backward graphs (none for an empty group). */
bool s_capture_graphs(scen *s, grp *g);
/* Every group's capture and graphs. */
bool s_capture(scen *s);

/* teardown.c */
/* Before the destroy of a scenario that ends with copies in flight: the
 * driver slowed so that a wrong teardown faults. */
void s_end_in_flight(scen *s);
/* Destroy the runtime (quiesced first if `sync`), checking that nothing leaked. */
void s_teardown(scen *s, bool sync);

/* illegal.c */
/* An illegal call must return exactly `want`, change nothing, and name the error. */
void s_expect(scen *s, vmmrt_status got, vmmrt_status want, const char *what);
void illegal_life_cycle(scen *s, bool allocated);
void illegal_slots(scen *s);
void illegal_handles(scen *s);
void illegal_options(scen *s);
/* Before use `pos` of the iteration (s->use_g, s->use_b): calls out of order; the schedule must not move. */
void illegal_hooks(scen *s, unsigned it, unsigned pos);
/* While group index gi has its forward (backward) open. */
void illegal_open_hook(scen *s, unsigned gi, bool backward);
void hostfn_probe_launch(scen *s);
void hostfn_probe_check(scen *s);

/* edges.c */
/* Whether the state numbered salt gets the edge calls (from the seed, not the scenario's stream). */
bool edges_here(const scen *s, unsigned salt);
/* The offload calls with zero, NULL and one-past-the-end arguments, with
 * `groups` created; before allocation the empty schedule where it is valid. */
void illegal_edges(scen *s, unsigned groups, bool allocated);

/* slots.c */
/* Random cycles of stream-ordered backing on slots of the application's own. */
void slot_backing(scen *s);
/* Destroy x and forget its range; one the library refuses stays for the end
 * (slots.c, pages.c). */
void s_slot_destroy(scen *s, vmmrt_slot *x);
#define S_MAX_CYCLES 32
/* The checksums n cycles (at most S_MAX_CYCLES) wrote into res (8 bytes each), each launched one
 * against want: counted in *verified, excused where forced (may be NULL), or
 * a corruption named "<what> cycle c ... (<why>)"; none launched: res is not read
 * (slots.c, pages.c). */
void s_verify_cycles(scen *s, vmmrt_slot *res, unsigned n, const uint64_t *want, const bool *launched,
		     const bool *forced, _Atomic uint64_t *verified, const char *what, const char *why);

/* pages.c */
/* Whether the scenario binds two slots to one pages object after iteration
 * it (from the seed: the scenario's stream is not drawn from). */
bool pages_here(const scen *s, unsigned it);
/* Random cycles through two slots bound to the same pages. */
void slot_pages(scen *s);

#endif
