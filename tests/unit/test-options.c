/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The option table: defaults valid, validation strict, environment wins. */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "options.h"
#include "vmmrt.h"

static void defaults_are_valid(void **state)
{
	/* Every default must pass its own validation, or the runtime would start on a bad value. */
	vmmrt_options *o;
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	for (size_t i = 0; i < vmmrt__options_count(); i++) {
		vmmrt_option_info info = {.size = sizeof(info)};
		assert_int_equal(vmmrt_option_describe(i, &info), VMMRT_OK);
		assert_non_null(info.doc);
		assert_true(strncmp(info.env, "VMMRT_", 6) == 0);
		assert_int_equal(vmmrt_options_set(o, info.name, info.default_value), VMMRT_OK);
	}
	assert_int_equal(vmmrt_option_describe(vmmrt__options_count(), &(vmmrt_option_info){0}),
			 VMMRT_E_INVALID_ARGUMENT);
	vmmrt_options_destroy(o);
}

static void values_are_validated(void **state)
{
	vmmrt_options *o;
	char buf[64];
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "driver_workers", "4"), VMMRT_OK);
	assert_int_equal(vmmrt_options_get(o, "driver_workers", buf, sizeof(buf)), VMMRT_OK);
	assert_string_equal(buf, "4");
	/* Out of range, malformed, negative, trailing junk, empty: all named errors. */
	assert_int_equal(vmmrt_options_set(o, "driver_workers", "0"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "driver_workers", "65"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "driver_workers", "-1"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "driver_workers", "2x"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "driver_workers", ""), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "driver_workers", NULL), VMMRT_E_INVALID_OPTION);
	assert_non_null(strstr(vmmrt_last_error(), "VMMRT_DRIVER_WORKERS"));
	/* A failed set leaves the old value. */
	assert_int_equal(vmmrt_options_get(o, "driver_workers", buf, sizeof(buf)), VMMRT_OK);
	assert_string_equal(buf, "4");
	assert_int_equal(vmmrt_options_set(o, "mode", "remap"), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "mode", "Remap"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "host_capacity", "1G"), VMMRT_OK);
	assert_int_equal(vmmrt__opt_u(o, VMMRT_OPT_HOST_CAPACITY), 1ull << 30);
	assert_int_equal(vmmrt_options_set(o, "host_capacity", "64MiB"), VMMRT_OK);
	assert_int_equal(vmmrt__opt_u(o, VMMRT_OPT_HOST_CAPACITY), 64ull << 20);
	assert_int_equal(vmmrt_options_set(o, "host_capacity", "99999999999T"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "host_capacity", "1Q"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "host_granularity", "3M"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "host_granularity", "64K"), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "checked_threads", "off"), VMMRT_OK);
	assert_int_equal(vmmrt__opt_u(o, VMMRT_OPT_CHECKED_THREADS), 0);
	assert_int_equal(vmmrt_options_set(o, "checked_threads", "maybe"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "host_copy_gbps", "nan"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(o, "host_copy_gbps", "12.5"), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "no_such_option", "1"), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt_options_set(NULL, "mode", "remap"), VMMRT_E_INVALID_ARGUMENT);
	/* Names may be given as variables or with dashes. */
	assert_int_equal(vmmrt_options_set(o, "VMMRT_LOOKAHEAD", "2"), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "driver-workers", "2"), VMMRT_OK);
	assert_int_equal(vmmrt_options_get(o, "lookahead", buf, 1), VMMRT_E_INVALID_SIZE);
	vmmrt_options_destroy(o);
}

static void environment_overrides(void **state)
{
	vmmrt_options *o;
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "lookahead", "1"), VMMRT_OK);
	setenv("VMMRT_LOOKAHEAD", "3", 1);
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_OK);
	assert_int_equal(vmmrt__opt_u(o, VMMRT_OPT_LOOKAHEAD), 3);
	setenv("VMMRT_LOOKAHEAD", "many", 1);
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_E_INVALID_OPTION);
	assert_non_null(strstr(vmmrt_last_error(), "VMMRT_LOOKAHEAD"));
	unsetenv("VMMRT_LOOKAHEAD");
	/* The runtime refuses to start on a bad variable instead of falling back. */
	setenv("VMMRT_MODE", "sideways", 1);
	vmmrt_runtime *rt = (vmmrt_runtime *)0x1;
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_E_INVALID_OPTION);
	assert_null(rt);
	unsetenv("VMMRT_MODE");
	vmmrt_options_destroy(o);
}

static void command_line(void **state)
{
	vmmrt_options *o;
	char a0[] = "prog", a1[] = "--driver-workers=3", a2[] = "keep", a3[] = "--mode", a4[] = "remap",
	     a5[] = "--other";
	char *argv[] = {a0, a1, a2, a3, a4, a5, NULL};
	int argc = 6;
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	assert_int_equal(vmmrt__options_parse_args(o, &argc, argv), VMMRT_OK);
	assert_int_equal(argc, 3);
	assert_string_equal(argv[1], "keep");
	assert_string_equal(argv[2], "--other");
	assert_int_equal(vmmrt__opt_u(o, VMMRT_OPT_DRIVER_WORKERS), 3);
	assert_int_equal(vmmrt__opt_u(o, VMMRT_OPT_MODE), VMMRT_MODE_REMAP);
	char b1[] = "--lookahead=99";
	char *argv2[] = {a0, b1, NULL};
	argc = 2;
	assert_int_equal(vmmrt__options_parse_args(o, &argc, argv2), VMMRT_E_INVALID_OPTION);
	vmmrt_options_destroy(o);
}

/* A VMMRT_* variable libvmmrt does not know is a typo, named with the nearest known one. */
static void unknown_variables_are_named(void **state)
{
	vmmrt_options *o;
	vmmrt_runtime *rt = (vmmrt_runtime *)0x1;
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "backend", "host"), VMMRT_OK);
	setenv("VMMRT_LOOKAHAED", "2", 1);
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_E_INVALID_OPTION);
	assert_non_null(strstr(vmmrt_last_error(), "VMMRT_LOOKAHAED"));
	assert_non_null(strstr(vmmrt_last_error(), "did you mean VMMRT_LOOKAHEAD?"));
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_E_INVALID_OPTION);
	assert_null(rt);
	/* a program that does not want the environment read at all */
	assert_int_equal(vmmrt_options_set(o, "environment", "ignore"), VMMRT_OK);
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	unsetenv("VMMRT_LOOKAHAED");
	/* libvmmrt's variables that are not options are known too */
	assert_int_equal(vmmrt_options_set(o, "environment", "override"), VMMRT_OK);
	setenv("VMMRT_LIBRARY", "/nowhere/libvmmrt.so.1", 1);
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_OK);
	unsetenv("VMMRT_LIBRARY");
	vmmrt_options_destroy(o);
}

/* A variable whose name extends a known one (VMMRT_LOOKAHEAD_2, a copy
 * made for a second configuration) is a typo too: only the exact names are
 * known, however long the name. */
static void names_that_extend_a_known_one_are_refused(void **state)
{
	static const char *const names[] = {
		"VMMRT_LOOKAHEAD_2", "VMMRT_MODEX", "VMMRT_MODE_", "VMMRT_LIBRARY_PATH",
		"VMMRT_DRIVER_WORKERS_AND_THEN_SOME_MORE_LETTERS_PAST_SIXTY_FOUR_BYTES_OF_NAME",
	};
	vmmrt_options *o;
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		setenv(names[i], "2", 1);
		assert_int_equal(vmmrt_options_apply_env(o), VMMRT_E_INVALID_OPTION);
		char want[64];
		snprintf(want, sizeof(want), "%.40s", names[i]);
		assert_non_null(strstr(vmmrt_last_error(), want));
		assert_non_null(strstr(vmmrt_last_error(), "did you mean"));
		unsetenv(names[i]);
	}
	setenv("VMMRT_LOOKAHEAD_2", "2", 1);
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_E_INVALID_OPTION);
	assert_non_null(strstr(vmmrt_last_error(), "did you mean VMMRT_LOOKAHEAD?"));
	unsetenv("VMMRT_LOOKAHEAD_2");
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_OK);
	vmmrt_options_destroy(o);
}

/* A choice that is not one lists the choices. */
static void bad_choices_list_the_choices(void **state)
{
	vmmrt_options *o;
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	setenv("VMMRT_MODE", "bogus", 1);
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_E_INVALID_OPTION);
	assert_non_null(strstr(vmmrt_last_error(), "VMMRT_MODE"));
	assert_non_null(strstr(vmmrt_last_error(), "'bogus' is not one of pingpong, remap, none"));
	unsetenv("VMMRT_MODE");
	assert_int_equal(vmmrt_options_set(o, "environment", "sometimes"), VMMRT_E_INVALID_OPTION);
	assert_non_null(strstr(vmmrt_last_error(), "override, fallback, ignore"));
	vmmrt_options_destroy(o);
}

/* override, fallback and ignore, and the program's own choice of them. */
static void environment_modes(void **state)
{
	vmmrt_options *o, *base;
	assert_int_equal(vmmrt_options_create(&base), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(base, "lookahead", "1"), VMMRT_OK);
	setenv("VMMRT_LOOKAHEAD", "3", 1);
	setenv("VMMRT_DRIVER_WORKERS", "2", 1);
	static const struct {
		const char *program, *variable;
		unsigned lookahead, workers;
	} cases[] = {
		{NULL, NULL, 3, 2},          /* default: override */
		{"override", NULL, 3, 2},
		{"fallback", NULL, 1, 2},    /* only what the program left unset */
		{"ignore", NULL, 1, 1},
		{NULL, "fallback", 1, 2},    /* VMMRT_ENVIRONMENT when the program says nothing */
		{NULL, "ignore", 1, 1},
		{"override", "ignore", 3, 2}, /* the program's choice wins over the variable */
		{"ignore", "override", 1, 1},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
		*o = *base;
		if (cases[i].program)
			assert_int_equal(vmmrt_options_set(o, "environment", cases[i].program), VMMRT_OK);
		if (cases[i].variable)
			setenv("VMMRT_ENVIRONMENT", cases[i].variable, 1);
		assert_int_equal(vmmrt_options_apply_env(o), VMMRT_OK);
		unsetenv("VMMRT_ENVIRONMENT");
		if (vmmrt__opt_u(o, VMMRT_OPT_LOOKAHEAD) != cases[i].lookahead ||
		    vmmrt__opt_u(o, VMMRT_OPT_DRIVER_WORKERS) != cases[i].workers)
			fail_msg("case %zu: lookahead %llu workers %llu, want %u and %u", i,
				 (unsigned long long)vmmrt__opt_u(o, VMMRT_OPT_LOOKAHEAD),
				 (unsigned long long)vmmrt__opt_u(o, VMMRT_OPT_DRIVER_WORKERS), cases[i].lookahead,
				 cases[i].workers);
		vmmrt_options_destroy(o);
	}
	/* a bad variable changes nothing */
	setenv("VMMRT_MODE", "sideways", 1);
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	assert_int_equal(vmmrt_options_apply_env(o), VMMRT_E_INVALID_OPTION);
	assert_int_equal(vmmrt__opt_u(o, VMMRT_OPT_LOOKAHEAD), 1);
	unsetenv("VMMRT_MODE");
	unsetenv("VMMRT_LOOKAHEAD");
	unsetenv("VMMRT_DRIVER_WORKERS");
	vmmrt_options_destroy(o);
	vmmrt_options_destroy(base);
}

/* Option `key` of what `rt` runs with is `want`. */
static void assert_in_force(vmmrt_runtime *rt, const char *key, const char *want)
{
	vmmrt_options *got;
	char buf[32];
	assert_int_equal(vmmrt_options_create(&got), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_options_get(rt, got), VMMRT_OK);
	assert_int_equal(vmmrt_options_get(got, key, buf, sizeof(buf)), VMMRT_OK);
	assert_string_equal(buf, want);
	vmmrt_options_destroy(got);
}

/* What the runtime reports is what it runs with, not what the program asked. */
static void runtime_reports_values_in_force(void **state)
{
	vmmrt_options *o;
	vmmrt_runtime *rt;
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "backend", "host"), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "lookahead", "1"), VMMRT_OK);
	setenv("VMMRT_LOOKAHEAD", "2", 1);
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_OK);
	unsetenv("VMMRT_LOOKAHEAD");
	assert_in_force(rt, "lookahead", "2");
	assert_in_force(rt, "backend", "host");
	vmmrt_runtime_info info = {.size = sizeof(info)};
	assert_int_equal(vmmrt_runtime_info_get(rt, &info), VMMRT_OK);
	assert_int_equal(info.lookahead, 2);
	assert_int_equal(vmmrt_runtime_options_get(rt, NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	/* derived values are what runs: driver_inline maps at each use, on the launch thread */
	assert_int_equal(vmmrt_options_set(o, "mode", "remap"), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "driver_inline", "1"), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_OK);
	assert_in_force(rt, "lookahead", "0");
	assert_in_force(rt, "checked_threads", "0");
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	/* the mode the environment chose is the one reported */
	setenv("VMMRT_ENVIRONMENT", "ignore", 1);
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_OK);
	unsetenv("VMMRT_ENVIRONMENT");
	assert_in_force(rt, "environment", "ignore");
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	vmmrt_options_destroy(o);
}

static void success_leaves_no_message(void **state)
{
	vmmrt_options *o;
	char buf[32];
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "lookahead", "99"), VMMRT_E_INVALID_OPTION);
	assert_true(vmmrt_last_error()[0] != '\0');
	assert_int_equal(vmmrt_options_get(o, "lookahead", buf, sizeof(buf)), VMMRT_OK);
	assert_string_equal(vmmrt_last_error(), "");
	assert_int_equal(vmmrt_options_set(o, "backend", "host"), VMMRT_OK);
	vmmrt_runtime *rt;
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_OK);
	assert_string_equal(vmmrt_last_error(), "");
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 0, &s), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_slot_create(rt, 1, &s), VMMRT_OK);
	assert_string_equal(vmmrt_last_error(), "");
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	/* backend auto: the reason it chose what it chose is in the note, not an error */
	assert_int_equal(vmmrt_options_set(o, "backend", "auto"), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_OK);
	assert_string_equal(vmmrt_last_error(), "");
	/* ... in the user's words: a choice made on purpose carries no status name */
	vmmrt_runtime_info info = {.size = sizeof(info)};
	assert_int_equal(vmmrt_runtime_info_get(rt, &info), VMMRT_OK);
	assert_non_null(strstr(info.backend_note, "auto: "));
	assert_null(strstr(info.backend_note, "VMMRT_E_"));
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	vmmrt_options_destroy(o);
}

/* Sized structs: the caller's size decides what is written, never more. */
static void structs_carry_their_size(void **state)
{
	vmmrt_options *o;
	vmmrt_runtime *rt;
	assert_int_equal(vmmrt_options_create(&o), VMMRT_OK);
	assert_int_equal(vmmrt_options_set(o, "backend", "host"), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_create(o, &rt), VMMRT_OK);
	vmmrt_runtime_info small = {0};
	assert_int_equal(vmmrt_runtime_info_get(rt, &small), VMMRT_E_INVALID_SIZE);
	assert_non_null(strstr(vmmrt_last_error(), "sizeof(vmmrt_runtime_info)"));
	assert_null(small.backend);
	/* a caller built against a later, larger struct: the tail it has and we don't is zeroed */
	struct {
		vmmrt_runtime_info info;
		unsigned char later[64];
	} big;
	memset(&big, 0xa5, sizeof(big));
	big.info.size = sizeof(big);
	assert_int_equal(vmmrt_runtime_info_get(rt, &big.info), VMMRT_OK);
	assert_string_equal(big.info.backend, "host");
	assert_int_equal(big.info.size, sizeof(big));
	for (size_t i = 0; i < sizeof(big.later); i++)
		assert_int_equal(big.later[i], 0);
	vmmrt_driver_stats ds = {.size = 1};
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &ds), VMMRT_E_INVALID_SIZE);
	ds.size = sizeof(ds);
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &ds), VMMRT_OK);
	assert_string_equal(ds.name, "cuMemCreate");
	vmmrt_offload_stats os = {.size = 0};
	assert_int_equal(vmmrt_offload_stats_get(rt, &os), VMMRT_E_INVALID_SIZE);
	os.size = sizeof(os);
	assert_int_equal(vmmrt_offload_stats_get(rt, &os), VMMRT_OK);
	vmmrt_option_info oi = {.size = 0};
	assert_int_equal(vmmrt_option_describe(0, &oi), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	vmmrt_options_destroy(o);
}

static void version_matches_the_header(void **state)
{
	char want[32];
	assert_int_equal(vmmrt_version(), VMMRT_VERSION_HEX);
	snprintf(want, sizeof(want), "%d.%d.%d", VMMRT_VERSION_MAJOR, VMMRT_VERSION_MINOR, VMMRT_VERSION_PATCH);
	assert_string_equal(vmmrt_version_string(), want);
}

static void status_strings(void **state)
{
	for (int s = 0; s < VMMRT_STATUS_COUNT_; s++) {
		assert_non_null(vmmrt_strerror((vmmrt_status)s));
		assert_true(strncmp(vmmrt_status_name((vmmrt_status)s), "VMMRT_", 6) == 0);
	}
	assert_string_equal(vmmrt_status_name((vmmrt_status)9999), "VMMRT_E_UNKNOWN");
	assert_string_equal(vmmrt_strerror((vmmrt_status)-1), "unknown status");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(defaults_are_valid),
		cmocka_unit_test(values_are_validated),
		cmocka_unit_test(environment_overrides),
		cmocka_unit_test(command_line),
		cmocka_unit_test(status_strings),
		cmocka_unit_test(unknown_variables_are_named),
		cmocka_unit_test(names_that_extend_a_known_one_are_refused),
		cmocka_unit_test(bad_choices_list_the_choices),
		cmocka_unit_test(environment_modes),
		cmocka_unit_test(runtime_reports_values_in_force),
		cmocka_unit_test(success_leaves_no_message),
		cmocka_unit_test(structs_carry_their_size),
		cmocka_unit_test(version_matches_the_header),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
