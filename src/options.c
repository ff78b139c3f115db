/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The option table and everything derived from it. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "error.h"
#include "options.h"

typedef enum opt_type { T_ENUM, T_UINT, T_SIZE, T_BOOL, T_DOUBLE, T_STRING } opt_type;

typedef struct opt_row {
	const char *name;
	const char *env;
	opt_type type;
	const char *def;
	const char *choices[6]; /* T_ENUM */
	double min, max;        /* T_UINT, T_SIZE, T_DOUBLE */
	const char *doc;
} opt_row;

#define KiB 1024.0
#define MiB (1024.0 * KiB)
#define GiB (1024.0 * MiB)
#define TiB (1024.0 * GiB)

static const opt_row table[VMMRT_OPT_COUNT_] = {
	[VMMRT_OPT_BACKEND] = {"backend", "VMMRT_BACKEND", T_ENUM, "auto", {"auto", "cuda", "host"}, 0, 0,
		"driver backend: cuda (libcuda.so.1 loaded at run time), host (a GPU emulated on host "
		"memory), or auto (cuda when a driver and a device are present, else host)"},
	[VMMRT_OPT_DEVICE] = {"device", "VMMRT_DEVICE", T_UINT, "0", {0}, 0, 1023,
		"device ordinal the runtime works on"},
	[VMMRT_OPT_MODE] = {"mode", "VMMRT_MODE", T_ENUM, "pingpong", {"pingpong", "remap", "none"}, 0, 0,
		"offload strategy: pingpong (two resident banks), remap (release after the D2H, map "
		"again before the H2D), none (activations stay resident)"},
	[VMMRT_OPT_DRIVER_WORKERS] = {"driver_workers", "VMMRT_DRIVER_WORKERS", T_UINT, "1", {0}, 1, 64,
		"resident driver-worker threads; VMM calls from two threads contend badly on the "
		"H200, so 1 is the default"},
	[VMMRT_OPT_LOOKAHEAD] = {"lookahead", "VMMRT_LOOKAHEAD", T_UINT, "1", {0}, 0, 16,
		"runners whose restore is started ahead of the one being consumed"},
	[VMMRT_OPT_HANDLE_POOL] = {"handle_pool", "VMMRT_HANDLE_POOL", T_UINT, "0", {0}, 0, 4096,
		"released physical handles each worker keeps for reuse instead of cuMemRelease "
		"(remap mode; never a vmmrt_slot_create slot's); 0 gives every byte back to the driver"},
	[VMMRT_OPT_CHECKED_THREADS] = {"checked_threads", "VMMRT_CHECKED_THREADS", T_BOOL, "1", {0}, 0, 1,
		"refuse cuMemCreate/Map/SetAccess/Unmap/Release from any thread but a driver worker "
		"(VMMRT_E_NOT_PERMITTED)"},
	[VMMRT_OPT_DRIVER_INLINE] = {"driver_inline", "VMMRT_DRIVER_INLINE", T_BOOL, "0", {0}, 0, 1,
		"remap mode, for comparison only: make the VMM calls on the launch thread, which then "
		"waits for each copy before releasing (what the driver workers avoid); turns "
		"checked_threads off and maps at each use (lookahead 0)"},
	[VMMRT_OPT_TIMEOUT_MS] = {"timeout_ms", "VMMRT_TIMEOUT_MS", T_UINT, "30000", {0}, 1, 86400000,
		"bound on every wait for a driver worker and on vmmrt_offload_sync (VMMRT_E_TIMEOUT "
		"after it); vmmrt_stream_synchronize waits as cuStreamSynchronize does"},
	[VMMRT_OPT_OOM_RETRIES] = {"oom_retries", "VMMRT_OOM_RETRIES", T_UINT, "3", {0}, 0, 1000,
		"times a worker retries a create that ran out of device memory"},
	[VMMRT_OPT_OOM_BACKOFF_US] = {"oom_backoff_us", "VMMRT_OOM_BACKOFF_US", T_UINT, "1000", {0}, 0, 10000000,
		"first back-off between out-of-memory retries, doubled each retry"},
	[VMMRT_OPT_HOST_CAPACITY] = {"host_capacity", "VMMRT_HOST_CAPACITY", T_SIZE, "16G", {0}, 2 * MiB, 64 * TiB,
		"host backend: emulated device memory (suffixes K, M, G, T)"},
	[VMMRT_OPT_HOST_GRANULARITY] = {"host_granularity", "VMMRT_HOST_GRANULARITY", T_SIZE, "2M", {0}, 4 * KiB, 1 * GiB,
		"host backend: VMM granularity, a power of two and a multiple of the page size"},
	[VMMRT_OPT_HOST_LATENCY] = {"host_latency", "VMMRT_HOST_LATENCY", T_BOOL, "0", {0}, 0, 1,
		"host backend: make driver calls, copies and their slow-down under copy load cost "
		"what they cost on the H200"},
	[VMMRT_OPT_HOST_COPY_GBPS] = {"host_copy_gbps", "VMMRT_HOST_COPY_GBPS", T_DOUBLE, "55", {0}, 0.01, 10000,
		"host backend: modelled pinned copy bandwidth in GB/s when host_latency is on"},
	[VMMRT_OPT_TRACE] = {"trace", "VMMRT_TRACE", T_STRING, "", {0}, 0, 0,
		"write a Chrome/Perfetto trace of the runtime's VMM driver calls (a track per thread) and "
		"of the spans the application adds with vmmrt_trace_span to this file at runtime destroy "
		"(empty: off)"},
	[VMMRT_OPT_ENVIRONMENT] = {"environment", "VMMRT_ENVIRONMENT", T_ENUM, "override", {"override", "fallback", "ignore"}, 0, 0,
		"how VMMRT_* variables combine with what the program set: override (a variable wins), "
		"fallback (a variable fills only what the program left unset), ignore (the environment "
		"is not read); VMMRT_ENVIRONMENT itself applies only when the program left this unset"},
	[VMMRT_OPT_MAX_BANKS] = {"max_banks", "VMMRT_MAX_BANKS", T_UINT, "8", {0}, 1, 64,
		"ping-pong with a schedule declared before allocation: the most banks it may get (it "
		"gets what the schedule needs under the look-ahead, and a shorter look-ahead if that is "
		"more than this); without one, two banks"},
	[VMMRT_OPT_HANDLE_REUSE] = {"handle_reuse", "VMMRT_HANDLE_REUSE", T_BOOL, "1", {0}, 0, 1,
		"remap with one driver worker: a released handle serves the next map of its size "
		"(cuMemUnmap, then cuMemMap, no cuMemRelease/cuMemCreate), never holding more than "
		"remap's budget of groups; an abort gives them back to the driver"},
	[VMMRT_OPT_D2H_YIELD] = {"d2h_yield", "VMMRT_D2H_YIELD", T_BOOL, "1", {0}, 0, 1,
		"remap: a D2H copy waits for the maps already due, so that their cuMemSetAccess runs "
		"beside no D2H (ten times slower beside one on the H200)"},
};

size_t vmmrt__options_count(void)
{
	return VMMRT_OPT_COUNT_;
}

static bool name_matches(const char *want, const char *name)
{
	/* "driver-workers" and "driver_workers" are the same option. */
	for (; *want && *name; want++, name++) {
		char a = *want == '-' ? '_' : *want;
		if (a != *name)
			return false;
	}
	return *want == '\0' && *name == '\0';
}

int vmmrt__options_find(const char *name)
{
	if (!name)
		return -1;
	for (int i = 0; i < VMMRT_OPT_COUNT_; i++)
		if (name_matches(name, table[i].name) || strcmp(name, table[i].env) == 0)
			return i;
	return -1;
}

static vmmrt_status parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!isdigit((unsigned char)*s))
		return VMMRT_E_INVALID_OPTION;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return VMMRT_E_INVALID_OPTION;
	unsigned shift = 0;
	switch (toupper((unsigned char)*end)) {
	case 'K': shift = 10; end++; break;
	case 'M': shift = 20; end++; break;
	case 'G': shift = 30; end++; break;
	case 'T': shift = 40; end++; break;
	default: break;
	}
	if (shift && (*end == 'i' || *end == 'I'))
		end++;
	if (shift && (*end == 'B' || *end == 'b'))
		end++;
	if (*end != '\0' || (shift && v > (UINT64_MAX >> shift)))
		return VMMRT_E_INVALID_OPTION;
	*out = (uint64_t)v << shift;
	return VMMRT_OK;
}

static vmmrt_status parse_value(int id, const char *value, vmmrt__opt_value *out)
{
	const opt_row *r = &table[id];
	char *end;

	if (!value)
		return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): missing value", r->name, r->env);
	switch (r->type) {
	case T_ENUM:
		for (unsigned i = 0; i < 6 && r->choices[i]; i++)
			if (strcmp(value, r->choices[i]) == 0) {
				out->u = i;
				return VMMRT_OK;
			}
	{
		char list[96];
		size_t at = 0;
		list[0] = '\0';
		for (unsigned i = 0; i < 6 && r->choices[i]; i++)
			at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s", i ? ", " : "", r->choices[i]);
		return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): '%s' is not one of %s", r->name, r->env,
				   value, list);
	}
	case T_BOOL:
		if (!strcmp(value, "1") || !strcasecmp(value, "on") || !strcasecmp(value, "yes") ||
		    !strcasecmp(value, "true")) {
			out->u = 1;
			return VMMRT_OK;
		}
		if (!strcmp(value, "0") || !strcasecmp(value, "off") || !strcasecmp(value, "no") ||
		    !strcasecmp(value, "false")) {
			out->u = 0;
			return VMMRT_OK;
		}
		return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): '%s' is not a boolean (0/1, on/off)",
				   r->name, r->env, value);
	case T_UINT: {
		errno = 0;
		if (!isdigit((unsigned char)value[0]))
			return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): '%s' is not a non-negative integer",
					   r->name, r->env, value);
		unsigned long long v = strtoull(value, &end, 10);
		if (errno || *end)
			return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): '%s' is not a non-negative integer",
					   r->name, r->env, value);
		if ((double)v < r->min || (double)v > r->max)
			return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): %llu is outside [%.0f, %.0f]", r->name,
					   r->env, v, r->min, r->max);
		out->u = v;
		return VMMRT_OK;
	}
	case T_SIZE: {
		uint64_t v;
		if (parse_size(value, &v) != VMMRT_OK)
			return vmmrt__error(VMMRT_E_INVALID_OPTION,
					   "%s (%s): '%s' is not a size (digits with an optional K, M, G or T)",
					   r->name, r->env, value);
		if ((double)v < r->min || (double)v > r->max)
			return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): %s is outside [%.0f, %.0f] bytes",
					   r->name, r->env, value, r->min, r->max);
		if (id == VMMRT_OPT_HOST_GRANULARITY && ((v & (v - 1)) != 0 || v % 4096 != 0))
			return vmmrt__error(VMMRT_E_INVALID_OPTION,
					   "%s (%s): %s is not a power of two multiple of 4096", r->name,
					   r->env, value);
		out->u = v;
		return VMMRT_OK;
	}
	case T_DOUBLE: {
		errno = 0;
		double v = strtod(value, &end);
		if (errno || end == value || *end || !isfinite(v))
			return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): '%s' is not a number", r->name,
					   r->env, value);
		if (v < r->min || v > r->max)
			return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): %g is outside [%g, %g]", r->name,
					   r->env, v, r->min, r->max);
		out->d = v;
		return VMMRT_OK;
	}
	case T_STRING:
		if (strlen(value) >= sizeof(out->s))
			return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s (%s): value longer than %zu bytes",
					   r->name, r->env, sizeof(out->s) - 1);
		strcpy(out->s, value);
		return VMMRT_OK;
	}
	return vmmrt__error(VMMRT_E_INVALID_OPTION, "%s: unknown type", r->name);
}

void vmmrt__options_defaults(vmmrt_options *o)
{
	memset(o, 0, sizeof(*o));
	for (int i = 0; i < VMMRT_OPT_COUNT_; i++) {
		vmmrt_status st = parse_value(i, table[i].def, &o->v[i]);
		(void)st; /* the defaults are checked by the unit tests */
	}
}

vmmrt_status vmmrt_options_create(vmmrt_options **out)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(out, "out is NULL");
	vmmrt_options *o = malloc(sizeof(*o));
	if (!o)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "options: %zu bytes", sizeof(*o));
	vmmrt__options_defaults(o);
	*out = o;
	return VMMRT_OK;
}

void vmmrt_options_destroy(vmmrt_options *opts)
{
	free(opts);
}

vmmrt_status vmmrt_options_set(vmmrt_options *opts, const char *name, const char *value)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(opts, "options is NULL");
	VMMRT__CHECK_ARG(name, "name is NULL");
	int id = vmmrt__options_find(name);
	if (id < 0)
		return vmmrt__error(VMMRT_E_INVALID_OPTION, "unknown option '%s' (see vmmrt(7))", name);
	vmmrt__opt_value v;
	vmmrt_status st = parse_value(id, value, &v);
	if (st != VMMRT_OK)
		return st;
	opts->v[id] = v;
	opts->from_program[id] = true;
	opts->from_env[id] = false;
	return VMMRT_OK;
}

vmmrt_status vmmrt_options_get(const vmmrt_options *opts, const char *name, char *buf, size_t len)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(opts, "options is NULL");
	VMMRT__CHECK_ARG(buf && len, "buffer is NULL or empty");
	int id = vmmrt__options_find(name);
	if (id < 0)
		return vmmrt__error(VMMRT_E_INVALID_OPTION, "unknown option '%s' (see vmmrt(7))", name ? name : "(null)");
	const opt_row *r = &table[id];
	int n;
	switch (r->type) {
	case T_ENUM: n = snprintf(buf, len, "%s", r->choices[opts->v[id].u]); break;
	case T_DOUBLE: n = snprintf(buf, len, "%g", opts->v[id].d); break;
	case T_STRING: n = snprintf(buf, len, "%s", opts->v[id].s); break;
	default: n = snprintf(buf, len, "%" PRIu64, opts->v[id].u); break;
	}
	if (n < 0 || (size_t)n >= len)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "option %s: value needs %d bytes, buffer has %zu", r->name,
				   n + 1, len);
	return VMMRT_OK;
}

/* libvmmrt's variables that are not options: known, so never called typos. */
static const struct {
	const char *name;
	const char *doc;
} other_vars[] = {
	{"VMMRT_LIBRARY", "the libvmmrt file the Python package vmmrt loads"},
};

static bool is_known_var(const char *name)
{
	for (int i = 0; i < VMMRT_OPT_COUNT_; i++)
		if (strcmp(name, table[i].env) == 0)
			return true;
	for (size_t i = 0; i < sizeof(other_vars) / sizeof(other_vars[0]); i++)
		if (strcmp(name, other_vars[i].name) == 0)
			return true;
	return false;
}

/* Levenshtein distance, case-insensitive; names are short (< 64 bytes). */
static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), row[64];
	if (la >= 64 || lb >= 64)
		return SIZE_MAX;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			size_t sub = diag + (toupper((unsigned char)a[i - 1]) != toupper((unsigned char)b[j - 1]));
			size_t best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
			row[j] = sub < best ? sub : best;
			diag = up;
		}
	}
	return row[lb];
}

static const char *nearest_var(const char *name)
{
	const char *best = NULL;
	size_t best_d = SIZE_MAX;
	for (int i = 0; i < VMMRT_OPT_COUNT_; i++) {
		size_t d = edit_distance(name, table[i].env);
		if (d < best_d) {
			best_d = d;
			best = table[i].env;
		}
	}
	for (size_t i = 0; i < sizeof(other_vars) / sizeof(other_vars[0]); i++) {
		size_t d = edit_distance(name, other_vars[i].name);
		if (d < best_d) {
			best_d = d;
			best = other_vars[i].name;
		}
	}
	return best;
}

/* A VMMRT_* variable that libvmmrt does not know is a typo until proven
 * otherwise: silently ignoring VMMRT_LOOKAHAED would run with the default. */
static vmmrt_status check_unknown_vars(void)
{
	extern char **environ;
	for (char **e = environ; e && *e; e++) {
		if (strncmp(*e, "VMMRT_", 6) != 0)
			continue;
		char name[64];
		size_t n = strcspn(*e, "=");
		snprintf(name, sizeof(name), "%.*s", (int)(n < sizeof(name) ? n : sizeof(name) - 1), *e);
		if (n < sizeof(name) && is_known_var(name))
			continue;
		return vmmrt__error(VMMRT_E_INVALID_OPTION,
				    "environment: %s is not a libvmmrt variable; did you mean %s? (vmmrt(7) lists "
				    "them; option \"environment\"=ignore stops reading the environment)",
				    name, nearest_var(name));
	}
	return VMMRT_OK;
}

static vmmrt_status env_value(vmmrt_options *o, int id)
{
	const char *v = getenv(table[id].env);
	if (!v)
		return VMMRT_OK;
	vmmrt_status st = parse_value(id, v, &o->v[id]);
	if (st == VMMRT_OK)
		o->from_env[id] = true;
	return st;
}

vmmrt_status vmmrt_options_apply_env(vmmrt_options *opts)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(opts, "options is NULL");
	return vmmrt__options_apply_env(opts);
}

vmmrt_status vmmrt__options_apply_env(vmmrt_options *opts)
{
	/* All or nothing: a bad variable leaves opts as they were. */
	vmmrt_options o = *opts;
	vmmrt_status st;
	/* The mode itself: the program's choice wins, or "ignore" could be undone. */
	if (!o.from_program[VMMRT_OPT_ENVIRONMENT] && (st = env_value(&o, VMMRT_OPT_ENVIRONMENT)) != VMMRT_OK)
		return st;
	vmmrt__env_mode mode = (vmmrt__env_mode)o.v[VMMRT_OPT_ENVIRONMENT].u;
	if (mode == VMMRT_ENV_IGNORE) {
		*opts = o; /* the mode itself may have come from VMMRT_ENVIRONMENT */
		return VMMRT_OK;
	}
	if ((st = check_unknown_vars()) != VMMRT_OK)
		return st;
	for (int i = 0; i < VMMRT_OPT_COUNT_; i++) {
		if (i == VMMRT_OPT_ENVIRONMENT || (mode == VMMRT_ENV_FALLBACK && o.from_program[i]))
			continue;
		if ((st = env_value(&o, i)) != VMMRT_OK)
			return st;
	}
	*opts = o;
	return VMMRT_OK;
}

static const char *range_text(const opt_row *r, char *buf, size_t len)
{
	switch (r->type) {
	case T_ENUM: {
		size_t n = 0;
		buf[0] = '\0';
		for (unsigned i = 0; i < 6 && r->choices[i]; i++)
			n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", i ? "|" : "", r->choices[i]);
		return buf;
	}
	case T_BOOL: return "0|1";
	case T_UINT: snprintf(buf, len, "%.0f..%.0f", r->min, r->max); return buf;
	case T_SIZE: snprintf(buf, len, "bytes, %.0f..%.0f", r->min, r->max); return buf;
	case T_DOUBLE: snprintf(buf, len, "%g..%g", r->min, r->max); return buf;
	case T_STRING: return "path";
	}
	return "";
}

/* The range texts derive from the constant table, so they are computed once
 * for the whole process and never change: nothing thread-local is needed. */
static char range_texts[VMMRT_OPT_COUNT_][96];
static pthread_once_t range_once = PTHREAD_ONCE_INIT;

static void fill_range_texts(void)
{
	for (int i = 0; i < VMMRT_OPT_COUNT_; i++)
		(void)range_text(&table[i], range_texts[i], sizeof(range_texts[i]));
}

vmmrt_status vmmrt_option_describe(size_t index, vmmrt_option_info *out)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(out, "out is NULL");
	if (index >= VMMRT_OPT_COUNT_)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "option index %zu >= %d", index, VMMRT_OPT_COUNT_);
	const opt_row *r = &table[index];
	pthread_once(&range_once, fill_range_texts);
	vmmrt_option_info info = {sizeof(info), r->name, r->env, r->def, range_texts[index], r->doc};
	return VMMRT__SIZED_OUT(out, info, VMMRT__OPTION_INFO_SIZE_V1, "vmmrt_option_info");
}

void vmmrt__options_print_help(FILE *out)
{
	char range[96];
	for (int i = 0; i < VMMRT_OPT_COUNT_; i++) {
		const opt_row *r = &table[i];
		char flag[64];
		snprintf(flag, sizeof(flag), "--%s=VALUE", r->name);
		for (char *p = flag; *p; p++)
			if (*p == '_')
				*p = '-';
		fprintf(out, "  %-28s %s\n  %-28s [%s; %s; default %s]\n", flag, r->doc, "", r->env,
			range_text(r, range, sizeof(range)), r->def[0] ? r->def : "empty");
	}
}

static void man_escape(FILE *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			fputs("\\e", out);
		else if (*s == '-')
			fputs("\\-", out);
		else
			fputc(*s, out);
	}
}

void vmmrt__options_print_man(FILE *out)
{
	char range[96];
	for (int i = 0; i < VMMRT_OPT_COUNT_; i++) {
		const opt_row *r = &table[i];
		fprintf(out, ".TP\n.BR %s \" (option \\(lq", r->env);
		man_escape(out, r->name);
		fputs("\\(rq)\"\n", out);
		man_escape(out, r->doc);
		fputs(".\nValues: ", out);
		man_escape(out, range_text(r, range, sizeof(range)));
		fputs("; default: ", out);
		man_escape(out, r->def[0] ? r->def : "empty");
		fputs(".\n", out);
	}
}

vmmrt_status vmmrt__options_parse_args(vmmrt_options *o, int *argc, char **argv)
{
	VMMRT__CHECK_ARG(o && argc && argv, "NULL argument");
	int keep = 1;
	for (int i = 1; i < *argc; i++) {
		const char *a = argv[i];
		if (strncmp(a, "--", 2) != 0) {
			argv[keep++] = argv[i];
			continue;
		}
		char name[64];
		const char *eq = strchr(a + 2, '=');
		size_t n = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
		if (n >= sizeof(name)) {
			argv[keep++] = argv[i];
			continue;
		}
		memcpy(name, a + 2, n);
		name[n] = '\0';
		int id = vmmrt__options_find(name);
		if (id < 0 || strchr(name, '_')) { /* not ours: --flags use dashes */
			argv[keep++] = argv[i];
			continue;
		}
		const char *value = eq ? eq + 1 : (i + 1 < *argc ? argv[++i] : NULL);
		vmmrt_status st = parse_value(id, value, &o->v[id]);
		if (st != VMMRT_OK)
			return st;
		o->from_program[id] = true;
	}
	argv[keep] = NULL;
	*argc = keep;
	return VMMRT_OK;
}
