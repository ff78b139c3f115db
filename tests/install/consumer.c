/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A program built against the installed libvmmrt with nothing but
 * pkg-config's flags (tests/install/check.sh builds it shared and static). */
#include <stdio.h>
#include <string.h>

#include <vmmrt.h>

int main(void)
{
	vmmrt_options *o;
	vmmrt_runtime *rt;
	vmmrt_slot *s;
	char in[4096], out[4096];
	memset(in, 0x5a, sizeof(in));
	if (vmmrt_options_create(&o) || vmmrt_options_set(o, "backend", "host") || vmmrt_runtime_create(o, &rt))
		goto fail;
	vmmrt_options_destroy(o);
	if (vmmrt_slot_create(rt, sizeof(in), &s) || vmmrt_slot_map(s) ||
	    vmmrt_copy_to_device(rt, vmmrt_slot_address(s), in, sizeof(in)) ||
	    vmmrt_copy_to_host(rt, out, vmmrt_slot_address(s), sizeof(out)) || memcmp(in, out, sizeof(in)) ||
	    vmmrt_slot_destroy(s) || vmmrt_runtime_destroy(rt))
		goto fail;
	printf("libvmmrt %s: slot round trip ok\n", vmmrt_version_string());
	return 0;
fail:
	fprintf(stderr, "consumer: %s\n", vmmrt_last_error());
	return 1;
}
