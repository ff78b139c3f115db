/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * ThreadSanitizer and the atomics it cannot see.
 *
 * liburcu's uatomic_* and ck's ck_pr_* are inline assembly (or volatile
 * accesses), so TSan sees neither their atomicity nor the order they give:
 * every flag published with uatomic_set and read with uatomic_read looks like
 * a data race, and so does everything published through them. In builds with
 * -fsanitize=thread (and only there) this header is included before anything
 * else (torture.mk adds -include) and replaces the uatomic_* macros with the
 * compiler's __atomic builtins, which TSan understands: the same operations
 * with the same (or, for read and set, acquire/release: on x86 the same
 * instructions) ordering, as liburcu 0.14 itself offers with
 * --enable-compiler-atomic-builtins. Its include guard keeps them replaced.
 *
 * What still escapes TSan is synchronization inside code it does not
 * instrument: the wfcqueue and lfstack of the liburcu-cds shared library,
 * call_rcu's grace periods, ck's spinlock. The hand-offs through those are
 * annotated where they happen with VMMRT__TSAN_RELEASE (before handing an
 * object over) and VMMRT__TSAN_ACQUIRE (after taking it), no-ops elsewhere.
 */
#ifndef VMMRT__TSAN_H
#define VMMRT__TSAN_H

#if defined(__SANITIZE_THREAD__)
#define VMMRT__TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define VMMRT__TSAN 1
#endif
#endif

#ifdef VMMRT__TSAN
#include "config.h"

#include <urcu/uatomic.h>

#undef uatomic_read
#undef uatomic_set
#undef uatomic_xchg
#undef uatomic_cmpxchg
#undef uatomic_add_return
#undef uatomic_sub_return
#undef uatomic_add
#undef uatomic_sub
#undef uatomic_inc
#undef uatomic_dec
#undef uatomic_and
#undef uatomic_or

#define uatomic_read(addr) __atomic_load_n((addr), __ATOMIC_ACQUIRE)
#define uatomic_set(addr, v) __atomic_store_n((addr), (v), __ATOMIC_RELEASE)
#define uatomic_xchg(addr, v) __atomic_exchange_n((addr), (v), __ATOMIC_SEQ_CST)
#define uatomic_cmpxchg(addr, old, _new) \
	__extension__({ \
		__typeof__(*(addr)) uatomic_old_ = (old); \
		(void)__atomic_compare_exchange_n((addr), &uatomic_old_, (_new), 0, __ATOMIC_SEQ_CST, \
						  __ATOMIC_SEQ_CST); \
		uatomic_old_; \
	})
#define uatomic_add_return(addr, v) __atomic_add_fetch((addr), (v), __ATOMIC_SEQ_CST)
#define uatomic_sub_return(addr, v) __atomic_sub_fetch((addr), (v), __ATOMIC_SEQ_CST)
#define uatomic_add(addr, v) ((void)__atomic_add_fetch((addr), (v), __ATOMIC_SEQ_CST))
#define uatomic_sub(addr, v) ((void)__atomic_sub_fetch((addr), (v), __ATOMIC_SEQ_CST))
#define uatomic_inc(addr) uatomic_add((addr), 1)
#define uatomic_dec(addr) uatomic_sub((addr), 1)
#define uatomic_and(addr, v) ((void)__atomic_and_fetch((addr), (v), __ATOMIC_SEQ_CST))
#define uatomic_or(addr, v) ((void)__atomic_or_fetch((addr), (v), __ATOMIC_SEQ_CST))

void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define VMMRT__TSAN_RELEASE(p) __tsan_release((void *)(p))
#define VMMRT__TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
/* Reads that are racy on purpose (a diagnostic snapshot): not reported. */
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
#define VMMRT__TSAN_IGNORE_READS_BEGIN() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define VMMRT__TSAN_IGNORE_READS_END() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define VMMRT__TSAN_RELEASE(p) ((void)(p))
#define VMMRT__TSAN_ACQUIRE(p) ((void)(p))
#define VMMRT__TSAN_IGNORE_READS_BEGIN() ((void)0)
#define VMMRT__TSAN_IGNORE_READS_END() ((void)0)
#endif

#endif /* VMMRT__TSAN_H */
