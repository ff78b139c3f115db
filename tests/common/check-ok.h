/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* OK(call): a library call that must succeed; if not, the test fails with
 * the call, its status and the library's message. Include after cmocka.h. */
#ifndef VMMRT__TEST_CHECK_OK_H
#define VMMRT__TEST_CHECK_OK_H

#include "vmmrt.h"

#define OK(call) \
	do { \
		vmmrt_status st_ = (call); \
		if (st_ != VMMRT_OK) \
			fail_msg("%s -> %s: %s", #call, vmmrt_status_name(st_), vmmrt_last_error()); \
	} while (0)

#endif
