/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Arrays that grow (array.c): the one way the library's lists of groups,
 * descriptors, retired groups and handles get room.
 */
#ifndef VMMRT__ARRAY_H
#define VMMRT__ARRAY_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Make room for at least `need` elements of `elem` bytes in the array
 * `*arrayp` (a pointer to the array's pointer) of capacity `*cap`: the
 * capacity doubles, from 8, until it is enough. False when out of host
 * memory, with the array and its capacity as they were.
 */
bool vmmrt__array_reserve(void *arrayp, unsigned *cap, unsigned need, size_t elem);

#endif
