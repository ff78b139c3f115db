/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Status names and the per-thread message behind vmmrt_last_error(). */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

static const struct {
	const char *name;
	const char *text;
} status_table[VMMRT_STATUS_COUNT_] = {
	[VMMRT_OK] = {"VMMRT_OK", "success"},
	[VMMRT_E_INVALID_ARGUMENT] = {"VMMRT_E_INVALID_ARGUMENT", "invalid argument"},
	[VMMRT_E_INVALID_SIZE] = {"VMMRT_E_INVALID_SIZE", "invalid size (zero, overflowing or misaligned)"},
	[VMMRT_E_INVALID_STATE] = {"VMMRT_E_INVALID_STATE", "operation not allowed in this state"},
	[VMMRT_E_INVALID_OPTION] = {"VMMRT_E_INVALID_OPTION", "invalid option or VMMRT_* environment value"},
	[VMMRT_E_OUT_OF_MEMORY] = {"VMMRT_E_OUT_OF_MEMORY", "device out of memory"},
	[VMMRT_E_HOST_OUT_OF_MEMORY] = {"VMMRT_E_HOST_OUT_OF_MEMORY", "host out of memory"},
	[VMMRT_E_NOT_PERMITTED] = {"VMMRT_E_NOT_PERMITTED", "not permitted from this thread or context"},
	[VMMRT_E_NOT_SUPPORTED] = {"VMMRT_E_NOT_SUPPORTED", "not supported by this device or driver"},
	[VMMRT_E_NO_DEVICE] = {"VMMRT_E_NO_DEVICE", "no usable device or driver"},
	[VMMRT_E_DRIVER] = {"VMMRT_E_DRIVER", "driver error"},
	[VMMRT_E_TIMEOUT] = {"VMMRT_E_TIMEOUT", "timed out"},
	[VMMRT_E_BUSY] = {"VMMRT_E_BUSY", "work still in flight"},
	[VMMRT_E_MISMATCH] = {"VMMRT_E_MISMATCH", "capture does not match discovery"},
	[VMMRT_E_CANCELLED] = {"VMMRT_E_CANCELLED", "request cancelled"},
	[VMMRT_E_CORRUPTED] = {"VMMRT_E_CORRUPTED", "restored bytes differ from the saved ones"},
	[VMMRT_E_CAPTURE] = {"VMMRT_E_CAPTURE", "not allowed while a stream is capturing"},
	[VMMRT_E_FAULT] = {"VMMRT_E_FAULT", "device address not mapped"},
};

static __thread char last_message[512];

const char *vmmrt_strerror(vmmrt_status status)
{
	if ((unsigned)status >= VMMRT_STATUS_COUNT_)
		return "unknown status";
	return status_table[status].text;
}

const char *vmmrt_status_name(vmmrt_status status)
{
	if ((unsigned)status >= VMMRT_STATUS_COUNT_)
		return "VMMRT_E_UNKNOWN";
	return status_table[status].name;
}

const char *vmmrt_last_error(void)
{
	return last_message;
}

void vmmrt__error_clear(void)
{
	last_message[0] = '\0';
}

void vmmrt__error_adopt(const char *message)
{
	snprintf(last_message, sizeof(last_message), "%s", message);
}

vmmrt_status vmmrt__error(vmmrt_status status, const char *fmt, ...)
{
	int n = snprintf(last_message, sizeof(last_message), "%s: ", vmmrt_status_name(status));
	va_list ap;

	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(last_message))
		vsnprintf(last_message + n, sizeof(last_message) - (size_t)n, fmt, ap);
	va_end(ap);
	return status;
}

/* Append src to dst (size cap) without overrunning; truncation is fine here. */
static size_t append(char *dst, size_t at, size_t cap, const char *src)
{
	size_t n = strlen(src);
	if (at >= cap - 1)
		return at;
	if (n > cap - 1 - at)
		n = cap - 1 - at;
	memcpy(dst + at, src, n);
	dst[at + n] = '\0';
	return at + n;
}

vmmrt_status vmmrt__error_wrap(vmmrt_status status, const char *fmt, ...)
{
	char prefix[256], old[sizeof(last_message)];
	size_t at = 0;
	va_list ap;

	memcpy(old, last_message, sizeof(old));
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	last_message[0] = '\0';
	if (old[0] == '\0') {
		at = append(last_message, at, sizeof(last_message), vmmrt_status_name(status));
		at = append(last_message, at, sizeof(last_message), ": ");
		append(last_message, at, sizeof(last_message), prefix);
	} else {
		at = append(last_message, at, sizeof(last_message), prefix);
		at = append(last_message, at, sizeof(last_message), ": ");
		append(last_message, at, sizeof(last_message), old);
	}
	return status;
}
