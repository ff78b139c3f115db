/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Replays fuzzer inputs without libFuzzer (built by gcc for make check): each
 * file named on the command line, or each file of each directory, goes
 * through LLVMFuzzerTestOneInput once. TAP output, one line per input.
 */
#include "config.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int count, failed;

static void one(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		printf("not ok %d - %s: cannot open\n", ++count, path);
		failed++;
		return;
	}
	static uint8_t buf[1 << 16];
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	uint8_t *copy = malloc(n ? n : 1); /* an exact-size buffer, as libFuzzer gives */
	memcpy(copy, buf, n);
	LLVMFuzzerTestOneInput(copy, n);
	free(copy);
	printf("ok %d - %s\n", ++count, path);
	fflush(stdout);
}

static int cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	char *paths[4096];
	int n = 0;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
			DIR *d = opendir(argv[i]);
			struct dirent *e;
			while (d && (e = readdir(d)) && n < 4096) {
				if (e->d_name[0] == '.')
					continue;
				size_t len = strlen(argv[i]) + strlen(e->d_name) + 2;
				paths[n] = malloc(len);
				snprintf(paths[n++], len, "%s/%s", argv[i], e->d_name);
			}
			if (d)
				closedir(d);
		} else if (n < 4096) {
			paths[n++] = strdup(argv[i]);
		}
	}
	qsort(paths, (size_t)n, sizeof(paths[0]), cmp);
	printf("1..%d\n", n);
	for (int i = 0; i < n; i++) {
		one(paths[i]);
		free(paths[i]);
	}
	return failed ? 1 : 0;
}
