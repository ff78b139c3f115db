/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The option table: one row per option (name, VMMRT_* variable, type, default,
 * range, doc). Parsing, validation, the environment, tools' --help and the
 * option section of vmmrt(7) all come from it, so they cannot disagree.
 */
#ifndef VMMRT__OPTIONS_H
#define VMMRT__OPTIONS_H

#include <stdbool.h>
#include <stdio.h>

#include "vmmrt.h"

typedef enum vmmrt__opt_id {
	VMMRT_OPT_BACKEND = 0,
	VMMRT_OPT_DEVICE,
	VMMRT_OPT_MODE,
	VMMRT_OPT_DRIVER_WORKERS,
	VMMRT_OPT_LOOKAHEAD,
	VMMRT_OPT_HANDLE_POOL,
	VMMRT_OPT_CHECKED_THREADS,
	VMMRT_OPT_DRIVER_INLINE,
	VMMRT_OPT_TIMEOUT_MS,
	VMMRT_OPT_OOM_RETRIES,
	VMMRT_OPT_OOM_BACKOFF_US,
	VMMRT_OPT_HOST_CAPACITY,
	VMMRT_OPT_HOST_GRANULARITY,
	VMMRT_OPT_HOST_LATENCY,
	VMMRT_OPT_HOST_COPY_GBPS,
	VMMRT_OPT_TRACE,
	VMMRT_OPT_ENVIRONMENT,
	VMMRT_OPT_MAX_BANKS,
	VMMRT_OPT_HANDLE_REUSE,
	VMMRT_OPT_D2H_YIELD,
	VMMRT_OPT_COUNT_
} vmmrt__opt_id;

typedef enum vmmrt__backend_choice {
	VMMRT_BACKEND_AUTO = 0,
	VMMRT_BACKEND_CUDA,
	VMMRT_BACKEND_HOST,
} vmmrt__backend_choice;

/* How the environment combines with what the program set (option "environment"). */
typedef enum vmmrt__env_mode {
	VMMRT_ENV_OVERRIDE = 0, /* a VMMRT_* variable replaces the program's value */
	VMMRT_ENV_FALLBACK,     /* a variable applies only where the program set nothing */
	VMMRT_ENV_IGNORE,       /* the environment is not read */
} vmmrt__env_mode;

typedef union vmmrt__opt_value {
	uint64_t u;   /* uint, size, bool and enum options (enum: index of the choice) */
	double d;     /* double options */
	char s[256];  /* string options */
} vmmrt__opt_value;

struct vmmrt_options {
	vmmrt__opt_value v[VMMRT_OPT_COUNT_];
	bool from_env[VMMRT_OPT_COUNT_];    /* the value in force came from the environment */
	bool from_program[VMMRT_OPT_COUNT_]; /* the program set it (vmmrt_options_set, argv) */
};

/* Typed accessors for the runtime (the value was validated when set). */
static inline uint64_t vmmrt__opt_u(const vmmrt_options *o, vmmrt__opt_id id) { return o->v[id].u; }
static inline double vmmrt__opt_d(const vmmrt_options *o, vmmrt__opt_id id) { return o->v[id].d; }
static inline const char *vmmrt__opt_s(const vmmrt_options *o, vmmrt__opt_id id) { return o->v[id].s; }

void vmmrt__options_defaults(vmmrt_options *o);
/* vmmrt_options_apply_env without the public prologue. */
vmmrt_status vmmrt__options_apply_env(vmmrt_options *opts);
size_t vmmrt__options_count(void);
/* Look an option up by name ("driver_workers"), by variable ("VMMRT_DRIVER_WORKERS")
 * or by command-line spelling ("driver-workers"). */
int vmmrt__options_find(const char *name);

/* Tools: print "--name=VALUE  doc [VMMRT_<NAME>, default]" lines, and accept
 * --name=value / --name value for every option; other arguments are left in
 * argv (compacted), *argc updated. */
void vmmrt__options_print_help(FILE *out);
vmmrt_status vmmrt__options_parse_args(vmmrt_options *o, int *argc, char **argv);
/* The man(7) table rows for vmmrt(7). */
void vmmrt__options_print_man(FILE *out);

#endif
