/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* include/vmmrt.h as strict C99 (tests/abi/header.sh compiles this with
 * -std=c99 -Wall -Wextra -pedantic -Werror): every declaration, and
 * vmmrt_devptr's type is exactly unsigned long long (an incompatible pointer
 * type would be an error here). */
#include <vmmrt.h>

unsigned long long *header_devptr_is_ull(vmmrt_devptr *p);
unsigned long long *header_devptr_is_ull(vmmrt_devptr *p)
{
	return p;
}

int header_status_count(void);
int header_status_count(void)
{
	return (int)VMMRT_STATUS_COUNT_ + (int)sizeof(vmmrt_runtime_info);
}
