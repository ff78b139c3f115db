/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The prologue of every public call, and the copy-out of the structs the
 * library fills. One place, so every entry point keeps the same promises:
 *  - a call that succeeds leaves vmmrt_last_error() empty (the message is the
 *    last failure of the call this thread just made, never an old one);
 *  - nothing that can reach the driver runs inside a host function.
 */
#ifndef VMMRT__API_H
#define VMMRT__API_H

#include <stddef.h>
#include <string.h>

#include "driver.h"
#include "error.h"

/* A call that may reach the driver: refused inside a host function. */
#define VMMRT__API_ENTER() \
	do { \
		vmmrt__error_clear(); \
		vmmrt_status api_st_ = vmmrt__drv_check_caller(__func__); \
		if (api_st_ != VMMRT_OK) \
			return api_st_; \
	} while (0)

/* A call that touches no driver (options, accessors, statistics): allowed anywhere. */
#define VMMRT__API_ENTER_ANYWHERE() vmmrt__error_clear()

/*
 * Copy `full` (the library's struct, its size_t size first) into the caller's
 * `out`, whose first member is the size the caller was built with: as much as
 * fits, zeroes beyond what this library knows, the caller's size left as set.
 * Below min_size (the struct's first release) is VMMRT_E_INVALID_SIZE.
 */
static inline vmmrt_status vmmrt__sized_out(void *out, const void *full, size_t full_size, size_t min_size,
					    const char *type, const char *func)
{
	size_t want;
	memcpy(&want, out, sizeof(want));
	if (want < min_size)
		return vmmrt__error(VMMRT_E_INVALID_SIZE,
				    "%s: %s.size is %zu; set it to sizeof(%s) (%zu in this library) before the call",
				    func, type, want, type, full_size);
	size_t n = want < full_size ? want : full_size;
	memcpy((char *)out + sizeof(want), (const char *)full + sizeof(want), n - sizeof(want));
	if (want > full_size)
		memset((char *)out + full_size, 0, want - full_size);
	return VMMRT_OK;
}

/* Each struct's size in its first release: the end of its last field then. */
#define VMMRT__END_OF(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
#define VMMRT__RUNTIME_INFO_SIZE_V1 VMMRT__END_OF(vmmrt_runtime_info, lookahead)
#define VMMRT__DRIVER_STATS_SIZE_V1 VMMRT__END_OF(vmmrt_driver_stats, max_us)
#define VMMRT__OFFLOAD_STATS_SIZE_V1 VMMRT__END_OF(vmmrt_offload_stats, schedule_recorded)
#define VMMRT__OPTION_INFO_SIZE_V1 VMMRT__END_OF(vmmrt_option_info, doc)
#define VMMRT__ARENA_STATS_SIZE_V1 VMMRT__END_OF(vmmrt_arena_stats, errors)

#define VMMRT__SIZED_OUT(out, full, min_size, type) \
	vmmrt__sized_out((out), &(full), sizeof(full), (min_size), type, __func__)

#endif
