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
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
