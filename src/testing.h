/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Test switches: fault injection on every driver op and the planted bugs a
 * test uses to prove it can see one. They live in the convenience library
 * libvmmrt-testing.la, which the tests and the torture link: this file, and
 * the files with a planted bug (strategy-pingpong.c, strategy-remap.c,
 * offload-reset.c) built with VMMRT__TESTING. libvmmrt.so has neither, so no
 * program can turn a fence off or fake a failure.
 */
#ifndef VMMRT__TESTING_H
#define VMMRT__TESTING_H

#include "driver.h"
#include "offload.h"

/* Set (or, with fn NULL, clear) the runtime's fault hook; see vmmrt__fault_fn. */
void vmmrt__drv_set_fault_hook(vmmrt_runtime *rt, vmmrt__fault_fn fn, void *ctx);

/* Drop a fence or plant a bug (VMMRT__DROP_* | VMMRT__PLANT_*) in the runtime's offload. */
void vmmrt__offload_test_plant(vmmrt_runtime *rt, int mask);

/* What vmmrt_group_replay takes for one of the runtime's own graphs: the
 * CUgraphExec behind it on CUDA, the graph itself on the host backend. */
uintptr_t vmmrt__test_graph_exec(vmmrt_runtime *rt, vmmrt_graph *g);

#endif
