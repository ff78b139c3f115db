/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* What is shared by the backends: the calling thread's role. */
#include "config.h"

#include "backend/backend.h"

/*
 * The default (dynamic) TLS model, never initial-exec: a library that
 * frameworks dlopen() (Python's ctypes, extension modules) must not need
 * glibc's small static TLS surplus, or the load fails with "cannot allocate
 * memory in static TLS block". The price is that a thread's first access to a
 * dynamic TLS block allocates it; the runtime pays that for the driver's
 * callback thread once at creation (vmmrt_runtime_create launches one host
 * function before anything else), not in a host function on the hot path.
 */
static __thread vmmrt__thread_role thread_role = VMMRT_ROLE_APP;

vmmrt__thread_role vmmrt__thread_role_get(void)
{
	return thread_role;
}

vmmrt__thread_role vmmrt__thread_role_set(vmmrt__thread_role role)
{
	vmmrt__thread_role old = thread_role;
	thread_role = role;
	return old;
}
