/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The library's version at run time: what was linked may differ from the header compiled against. */
#include "config.h"

#include "vmmrt.h"

/* configure's version and the header's must agree, or the two queries would disagree. */
_Static_assert(VMMRT_VERSION_HEX == ((VMMRT_PACKAGE_MAJOR << 16) | (VMMRT_PACKAGE_MINOR << 8) | VMMRT_PACKAGE_PATCH),
	       "include/vmmrt.h's VMMRT_VERSION_* and configure.ac's version differ");

unsigned int vmmrt_version(void)
{
	return VMMRT_VERSION_HEX;
}

const char *vmmrt_version_string(void)
{
	return PACKAGE_VERSION;
}
