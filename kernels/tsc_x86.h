/* SPDX-License-Identifier: MIT */
/*
 * tsc_x86.h - one load timed by the time stamp counter, with nothing else
 * overlapping it: how the prefetch probes (kva_cpu_prefetch_kept in isa.c,
 * and kvarena-bench's bench_readbw_prefetch_kept) tell a line in the cache
 * from one in memory. RDTSC between LFENCEs, which every x86-64 core has,
 * not RDTSCP: some KVM guests (Zen 5, thirty-ninth session) do not offer
 * it in CPUID, and the library's probe then never measured.
 */
#ifndef KVA_TSC_X86_H
#define KVA_TSC_X86_H

#include <stdint.h>
#include <x86intrin.h>

static inline uint64_t kva__timed_load(const char *p)
{
	uint64_t t0, t1;

	/* each LFENCE waits for what came before it: the counter is read
	 * after everything earlier, the load after that, and the counter
	 * again once the load has its data */
	_mm_lfence();
	t0 = __rdtsc();
	_mm_lfence();
	(void)*(const volatile char *)p;
	_mm_lfence();
	t1 = __rdtsc();
	_mm_lfence();
	return t1 - t0;
}

#endif /* KVA_TSC_X86_H */
