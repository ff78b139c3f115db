# SPDX-License-Identifier: LGPL-2.1-or-later
# Manual pages (tests/man-check.sh, which checks them, is tests.mk's).
#
#  man/man7/vmmrt.7        the overview; its ENVIRONMENT section is generated
#                          from the option table (src/options.c)
#  man/man3/*.3            one page per public function of include/vmmrt.h:
#                          a full page per family, ".so" links for the others
#  man/vmmrt-optdoc        prints the option table as man(7) rows
#  man/update-options.sh   puts them into vmmrt.7 ("make update-man")
#  tests/man-check.sh      TAP: the block is current, mandoc -Tlint is clean,
#                          every function has its page and every page its function

man7_pages = man/man7/vmmrt.7

man3_pages = \
	man/man3/vmmrt_arena_free.3 \
	man/man3/vmmrt_arena_lend.3 \
	man/man3/vmmrt_arena_malloc.3 \
	man/man3/vmmrt_arena_reset.3 \
	man/man3/vmmrt_arena_stats_get.3 \
	man/man3/vmmrt_backward_begin.3 \
	man/man3/vmmrt_backward_end.3 \
	man/man3/vmmrt_checksum_host.3 \
	man/man3/vmmrt_copy_to_device.3 \
	man/man3/vmmrt_copy_to_device_async.3 \
	man/man3/vmmrt_copy_to_host.3 \
	man/man3/vmmrt_copy_to_host_async.3 \
	man/man3/vmmrt_driver_stats_get.3 \
	man/man3/vmmrt_driver_stats_reset.3 \
	man/man3/vmmrt_event_create.3 \
	man/man3/vmmrt_event_destroy.3 \
	man/man3/vmmrt_event_elapsed_ms.3 \
	man/man3/vmmrt_event_query.3 \
	man/man3/vmmrt_event_record.3 \
	man/man3/vmmrt_event_synchronize.3 \
	man/man3/vmmrt_fill_word.3 \
	man/man3/vmmrt_forward_begin.3 \
	man/man3/vmmrt_forward_end.3 \
	man/man3/vmmrt_graph_begin_capture.3 \
	man/man3/vmmrt_graph_destroy.3 \
	man/man3/vmmrt_graph_end_capture.3 \
	man/man3/vmmrt_graph_launch.3 \
	man/man3/vmmrt_group_address.3 \
	man/man3/vmmrt_group_begin_capture.3 \
	man/man3/vmmrt_group_bytes.3 \
	man/man3/vmmrt_group_create.3 \
	man/man3/vmmrt_group_discover.3 \
	man/man3/vmmrt_group_end_capture.3 \
	man/man3/vmmrt_group_error.3 \
	man/man3/vmmrt_group_get_state.3 \
	man/man3/vmmrt_group_rediscover.3 \
	man/man3/vmmrt_group_replay.3 \
	man/man3/vmmrt_group_replay_copies.3 \
	man/man3/vmmrt_group_save.3 \
	man/man3/vmmrt_group_stays.3 \
	man/man3/vmmrt_host_alloc.3 \
	man/man3/vmmrt_host_free.3 \
	man/man3/vmmrt_kernel_busy.3 \
	man/man3/vmmrt_kernel_checksum.3 \
	man/man3/vmmrt_kernel_fill.3 \
	man/man3/vmmrt_kernel_layer.3 \
	man/man3/vmmrt_last_error.3 \
	man/man3/vmmrt_layer_checksum_host.3 \
	man/man3/vmmrt_mem_info.3 \
	man/man3/vmmrt_offload_abort.3 \
	man/man3/vmmrt_offload_allocate.3 \
	man/man3/vmmrt_offload_release_retired.3 \
	man/man3/vmmrt_offload_set_schedule.3 \
	man/man3/vmmrt_offload_stats_get.3 \
	man/man3/vmmrt_offload_stats_reset.3 \
	man/man3/vmmrt_offload_sync.3 \
	man/man3/vmmrt_option_describe.3 \
	man/man3/vmmrt_options_apply_env.3 \
	man/man3/vmmrt_options_create.3 \
	man/man3/vmmrt_options_destroy.3 \
	man/man3/vmmrt_options_get.3 \
	man/man3/vmmrt_options_set.3 \
	man/man3/vmmrt_pages_create.3 \
	man/man3/vmmrt_pages_destroy.3 \
	man/man3/vmmrt_pages_size.3 \
	man/man3/vmmrt_runtime_create.3 \
	man/man3/vmmrt_runtime_destroy.3 \
	man/man3/vmmrt_runtime_info_get.3 \
	man/man3/vmmrt_runtime_options_get.3 \
	man/man3/vmmrt_slot_address.3 \
	man/man3/vmmrt_slot_create.3 \
	man/man3/vmmrt_slot_destroy.3 \
	man/man3/vmmrt_slot_error.3 \
	man/man3/vmmrt_slot_get_state.3 \
	man/man3/vmmrt_slot_map.3 \
	man/man3/vmmrt_slot_map_after.3 \
	man/man3/vmmrt_slot_map_async.3 \
	man/man3/vmmrt_slot_map_pages.3 \
	man/man3/vmmrt_slot_map_pages_table.3 \
	man/man3/vmmrt_slot_release_after.3 \
	man/man3/vmmrt_slot_size.3 \
	man/man3/vmmrt_slot_truncate.3 \
	man/man3/vmmrt_slot_unmap.3 \
	man/man3/vmmrt_slot_wait.3 \
	man/man3/vmmrt_slot_wait_stream.3 \
	man/man3/vmmrt_status_name.3 \
	man/man3/vmmrt_stream_create.3 \
	man/man3/vmmrt_stream_destroy.3 \
	man/man3/vmmrt_stream_synchronize.3 \
	man/man3/vmmrt_stream_wait_event.3 \
	man/man3/vmmrt_strerror.3 \
	man/man3/vmmrt_trace_span.3 \
	man/man3/vmmrt_version.3 \
	man/man3/vmmrt_version_string.3

dist_man_MANS += $(man7_pages) $(man3_pages)

noinst_PROGRAMS += man/vmmrt-optdoc
man_vmmrt_optdoc_SOURCES = man/vmmrt-optdoc.c
man_vmmrt_optdoc_LDADD = libvmmrt-core.la $(URCU_LIBS) $(CK_LIBS)

EXTRA_DIST += man/update-options.sh

# Regenerate the option block of vmmrt(7) after changing the option table.
.PHONY: update-man
update-man: man/vmmrt-optdoc$(EXEEXT)
	$(SHELL) $(srcdir)/man/update-options.sh ./man/vmmrt-optdoc$(EXEEXT) $(srcdir)/man/man7/vmmrt.7
