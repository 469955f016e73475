/* SPDX-License-Identifier: MIT */
/*
 * tsc_x86.h - one load timed by the time stamp counter, with nothing else
 * overlapping it: how the prefetch probes (kva_cpu_prefetch_kept in isa.c,
 * and kvarena-bench's bench_readbw_prefetch_kept) tell a line in the cache
 * from one in memory. Needs RDTSCP (CPUID.80000001H:EDX bit 27).
 */
#ifndef KVA_TSC_X86_H
#define KVA_TSC_X86_H

#include <stdint.h>
#include <x86intrin.h>

static inline uint64_t kva__timed_load(const char *p)
{
	unsigned aux;
	uint64_t t0, t1;

	_mm_lfence();
	t0 = __rdtscp(&aux);
	(void)*(const volatile char *)p;
	/* rdtscp waits until the load before it has its data */
	t1 = __rdtscp(&aux);
	_mm_lfence();
	return t1 - t0;
}

#endif /* KVA_TSC_X86_H */
