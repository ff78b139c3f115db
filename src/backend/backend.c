/* What is shared by the backends: the calling thread's role. */
#include "config.h"

#include "backend/backend.h"

static __thread vmmrt_thread_role thread_role = VMMRT_ROLE_APP;

vmmrt_thread_role vmmrt_thread_role_get(void)
{
	return thread_role;
}

vmmrt_thread_role vmmrt_thread_role_set(vmmrt_thread_role role)
{
	vmmrt_thread_role old = thread_role;
	thread_role = role;
	return old;
}
