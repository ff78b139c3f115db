/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Arrays that grow: see array.h. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>

#include "array.h"

bool vmmrt__array_reserve(void *arrayp, unsigned *cap, unsigned need, size_t elem)
{
	if (need <= *cap)
		return true;
	unsigned n = *cap ? *cap : 8;
	while (n < need) {
		if (n > UINT32_MAX / 2)
			return false;
		n *= 2;
	}
	if (elem && n > SIZE_MAX / elem)
		return false;
	void **a = arrayp;
	void *grown = realloc(*a, (size_t)n * elem);
	if (!grown)
		return false;
	*a = grown;
	*cap = n;
	return true;
}
