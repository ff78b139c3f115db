/* What is shared by the backends: the calling thread's role. */
#include "config.h"

#include "backend/backend.h"

/* initial-exec: a host function on the driver's callback thread must not
 * trigger a lazy TLS allocation when libvmmrt was dlopen()ed (e.g. by Python). */
static __thread __attribute__((tls_model("initial-exec"))) vmmrt__thread_role thread_role = VMMRT_ROLE_APP;

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
