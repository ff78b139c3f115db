/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Error reporting: every failing internal path calls vmmrt__error() once, at the
 * place that knows the cause, and returns its status. The message is kept per
 * thread so the public vmmrt_last_error() describes this thread's last failure.
 */
#ifndef VMMRT__ERROR_H
#define VMMRT__ERROR_H

#include "vmmrt.h"

#if defined(__GNUC__)
#define VMMRT__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define VMMRT__PRINTF(a, b)
#endif

/* Set this thread's message ("VMMRT_E_<NAME>: <text>") and return status. */
vmmrt_status vmmrt__error(vmmrt_status status, const char *fmt, ...) VMMRT__PRINTF(2, 3);
/* Keep the message of a failure already reported below, prefixing context. */
vmmrt_status vmmrt__error_wrap(vmmrt_status status, const char *fmt, ...) VMMRT__PRINTF(2, 3);
void vmmrt__error_clear(void);
/* Make message ("VMMRT_E_<NAME>: <text>") this thread's again: a cause saved
 * before a clean-up whose own failures would replace it, or a worker's
 * message for the thread that waited on its request. */
void vmmrt__error_adopt(const char *message);

#define VMMRT__CHECK_ARG(cond, what) \
	do { \
		if (!(cond)) \
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: %s", __func__, what); \
	} while (0)

#endif
