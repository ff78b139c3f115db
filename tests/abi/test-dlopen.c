/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * libvmmrt loaded the way Python, a PyTorch extension or a plugin system
 * loads it: dlopen() of the built shared library, every function through
 * dlsym(), nothing linked. A slot round trip on the host backend, on the
 * loading thread and on a thread created afterwards (its thread-local state
 * comes from the dynamic TLS of a dlopen()ed library); then dlclose() and a
 * second load. LIBVMMRT_SO names the library.
 */
#include "config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vmmrt.h"

/* The functions this test calls, by their declared types. */
#define FUNCS(X) \
	X(vmmrt_options_create) X(vmmrt_options_set) X(vmmrt_options_destroy) X(vmmrt_runtime_create) \
	X(vmmrt_runtime_destroy) X(vmmrt_slot_create) X(vmmrt_slot_map) X(vmmrt_slot_unmap) \
	X(vmmrt_slot_destroy) X(vmmrt_slot_address) X(vmmrt_copy_to_device) X(vmmrt_copy_to_host) \
	X(vmmrt_last_error) X(vmmrt_version)

static struct {
#define FIELD(f) __typeof__(&f) f;
	FUNCS(FIELD)
#undef FIELD
} lib;

static void *load(void)
{
	const char *path = getenv("LIBVMMRT_SO");
	void *h = dlopen(path ? path : "libvmmrt.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		fail_msg("dlopen(%s): %s", path ? path : "libvmmrt.so.1", dlerror());
#define LOOKUP(f) \
	if (!(lib.f = (__typeof__(&f))dlsym(h, #f))) \
		fail_msg("dlsym(%s): %s", #f, dlerror());
	FUNCS(LOOKUP)
#undef LOOKUP
	return h;
}

#define OK(call) \
	do { \
		vmmrt_status st_ = (call); \
		if (st_ != VMMRT_OK) \
			return st_; \
	} while (0)

/* Fill, save, release, map again at the same address, restore, compare. */
static vmmrt_status round_trip(void)
{
	enum { BYTES = 1 << 20 };
	vmmrt_options *o;
	vmmrt_runtime *rt;
	vmmrt_slot *s;
	static uint64_t a[BYTES / 8], b[BYTES / 8];
	OK(lib.vmmrt_options_create(&o));
	OK(lib.vmmrt_options_set(o, "backend", "host"));
	OK(lib.vmmrt_runtime_create(o, &rt));
	lib.vmmrt_options_destroy(o);
	OK(lib.vmmrt_slot_create(rt, BYTES, &s));
	OK(lib.vmmrt_slot_map(s));
	vmmrt_devptr at = lib.vmmrt_slot_address(s);
	for (size_t i = 0; i < BYTES / 8; i++)
		a[i] = i * 0x9E3779B97F4A7C15ull;
	OK(lib.vmmrt_copy_to_device(rt, at, a, BYTES));
	OK(lib.vmmrt_copy_to_host(rt, b, at, BYTES));
	OK(lib.vmmrt_slot_unmap(s));
	OK(lib.vmmrt_slot_map(s));
	if (lib.vmmrt_slot_address(s) != at)
		return VMMRT_E_MISMATCH;
	OK(lib.vmmrt_copy_to_device(rt, at, b, BYTES));
	memset(b, 0, sizeof(b));
	OK(lib.vmmrt_copy_to_host(rt, b, at, BYTES));
	if (memcmp(a, b, BYTES) != 0)
		return VMMRT_E_CORRUPTED;
	OK(lib.vmmrt_slot_destroy(s));
	OK(lib.vmmrt_runtime_destroy(rt));
	/* a failure leaves its message in this thread's (dynamic) TLS */
	if (lib.vmmrt_slot_create(NULL, 1, &s) != VMMRT_E_INVALID_ARGUMENT ||
	    strstr(lib.vmmrt_last_error(), "VMMRT_E_INVALID_ARGUMENT") == NULL)
		return VMMRT_E_INVALID_STATE;
	return VMMRT_OK;
}

static void *thread_round_trip(void *arg)
{
	*(vmmrt_status *)arg = round_trip();
	return NULL;
}

static void loads_with_dlopen(void **state)
{
	void *h = load();
	assert_int_equal(lib.vmmrt_version(), VMMRT_VERSION_HEX);
	vmmrt_status st = round_trip();
	if (st != VMMRT_OK)
		fail_msg("round trip on the loading thread: %d: %s", st, lib.vmmrt_last_error());
	pthread_t t;
	vmmrt_status tst = VMMRT_E_DRIVER;
	assert_int_equal(pthread_create(&t, NULL, thread_round_trip, &tst), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(tst, VMMRT_OK);
	/* -z nodelete: unloading is a no-op, so loading again finds the same library */
	assert_int_equal(dlclose(h), 0);
	h = load();
	assert_int_equal(round_trip(), VMMRT_OK);
	assert_int_equal(dlclose(h), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(loads_with_dlopen),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
