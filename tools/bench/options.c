/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Runtime options: what the command line gives every mode's runtime, and what
 * a runtime has in force.
 *
 * The public API has no copy of an options object, and setting an option marks
 * it as the program's (which "environment"=fallback looks at), so the bench
 * keeps the settings it made, in order, and replays them onto a fresh object
 * for each runtime; the mode then sets its own on top. Each setting is
 * validated when it is made, on a scratch object, so a bad value is a usage
 * error before any runtime exists.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "bench.h"

struct bench_option {
	char name[64];
	char *value;
};

vmmrt_status bench_options_init(bench_ctx *ctx)
{
	return vmmrt_options_create(&ctx->scratch);
}

void bench_options_free(bench_ctx *ctx)
{
	for (size_t i = 0; i < ctx->nopts; i++)
		free(ctx->opts[i].value);
	free(ctx->opts);
	ctx->opts = NULL;
	ctx->nopts = 0;
	vmmrt_options_destroy(ctx->scratch);
	ctx->scratch = NULL;
}

vmmrt_status bench_options_set(bench_ctx *ctx, const char *name, const char *value)
{
	vmmrt_status st = vmmrt_options_set(ctx->scratch, name, value);
	if (st != VMMRT_OK)
		return st;
	bench_option *o = realloc(ctx->opts, (ctx->nopts + 1) * sizeof(*o));
	if (!o)
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	ctx->opts = o;
	o = &ctx->opts[ctx->nopts];
	snprintf(o->name, sizeof(o->name), "%s", name);
	if (!(o->value = strdup(value)))
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	ctx->nopts++;
	return VMMRT_OK;
}

vmmrt_status bench_options_new(const bench_ctx *ctx, vmmrt_options **out)
{
	vmmrt_options *o = NULL;
	vmmrt_status st = vmmrt_options_create(&o);
	for (size_t i = 0; st == VMMRT_OK && i < ctx->nopts; i++)
		st = vmmrt_options_set(o, ctx->opts[i].name, ctx->opts[i].value);
	if (st != VMMRT_OK) {
		vmmrt_options_destroy(o);
		o = NULL;
	}
	*out = o;
	return st;
}

bool bench_option_exists(const char *name)
{
	vmmrt_option_info info = {.size = sizeof(info)};
	for (size_t i = 0; vmmrt_option_describe(i, &info) == VMMRT_OK; i++)
		if (strcmp(info.name, name) == 0)
			return true;
	return false;
}

/* The option a command-line spelling names ("driver-workers" is driver_workers),
 * or false: flags are spelled with dashes, so one with '_' is not an option. */
static bool option_name(const char *spelling, char *out, size_t len)
{
	size_t n = strcspn(spelling, "=");
	if (n >= len || memchr(spelling, '_', n))
		return false;
	for (size_t i = 0; i < n; i++)
		out[i] = spelling[i] == '-' ? '_' : spelling[i];
	out[n] = '\0';
	return bench_option_exists(out);
}

vmmrt_status bench_options_parse_args(bench_ctx *ctx, int *argc, char **argv)
{
	int keep = 1;
	for (int i = 1; i < *argc; i++) {
		const char *a = argv[i];
		char name[64];
		if (strncmp(a, "--", 2) != 0 || !option_name(a + 2, name, sizeof(name))) {
			argv[keep++] = argv[i];
			continue;
		}
		const char *eq = strchr(a + 2, '=');
		const char *value = eq ? eq + 1 : (i + 1 < *argc ? argv[++i] : NULL);
		/* a missing value is the library's error ("missing value") */
		vmmrt_status st = bench_options_set(ctx, name, value);
		if (st != VMMRT_OK)
			return st;
	}
	argv[keep] = NULL;
	*argc = keep;
	return VMMRT_OK;
}

vmmrt_status bench_runtime_option(bench_ctx *ctx, const vmmrt_runtime *rt, const char *name, char *buf, size_t len)
{
	vmmrt_status st = vmmrt_runtime_options_get(rt, ctx->scratch);
	return st == VMMRT_OK ? vmmrt_options_get(ctx->scratch, name, buf, len) : st;
}

vmmrt_status bench_runtime_flag(bench_ctx *ctx, const vmmrt_runtime *rt, const char *name, bool *on)
{
	char v[8];
	vmmrt_status st = bench_runtime_option(ctx, rt, name, v, sizeof(v));
	*on = st == VMMRT_OK && strcmp(v, "0") != 0;
	return st;
}
