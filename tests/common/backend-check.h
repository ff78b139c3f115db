/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * What the backends' own tests share (tests/unit/test-host-backend.c,
 * tests/gpu/test-cuda-backend.c): they call a backend's ops table directly,
 * the one place outside src/driver.c that does.
 */
#ifndef VMMRT__TEST_BACKEND_CHECK_H
#define VMMRT__TEST_BACKEND_CHECK_H

#include <stdbool.h>

#include "backend/backend.h"
#include "check-ok.h"

/* A query's answer (finished or not); an error fails the test. */
static inline bool test_event_done(const vmmrt__backend_ops *ops, vmmrt__backend *b, vmmrt__bevent *e)
{
	bool d = false;
	OK(ops->event_query(b, e, &d));
	return d;
}

static inline bool test_stream_done(const vmmrt__backend_ops *ops, vmmrt__backend *b, vmmrt_stream s)
{
	bool d = false;
	OK(ops->stream_query(b, s, &d));
	return d;
}

#endif
