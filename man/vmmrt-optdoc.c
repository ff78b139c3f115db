/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-optdoc: print the option table of libvmmrt as man(7) .TP rows, the
 * body of the ENVIRONMENT section of vmmrt(7). man/update-options.sh puts its
 * output into the page and tests/man-check.sh checks the page against it, so
 * the manual cannot drift from src/options.c.
 */
#include "config.h"

#include <stdio.h>

#include "options.h"

int main(int argc, char **argv)
{
	if (argc > 1) {
		fprintf(stderr, "usage: %s > rows.man\n", argv[0]);
		return 2;
	}
	vmmrt__options_print_man(stdout);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		perror("vmmrt-optdoc: stdout");
		return 1;
	}
	return 0;
}
