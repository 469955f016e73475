/* SPDX-License-Identifier: MIT */
/*
 * isa.c - which vector paths this CPU can run, decided at run time.
 */
#include <cpuid.h>
#include <stdatomic.h>

#include "kernels_pvt.h"

/*
 * F16C (CPUID.1:ECX bit 29): clang 14's __builtin_cpu_supports does not know
 * it. Asked once: CPUID traps to the hypervisor in a virtual machine, a few
 * microseconds that a short decode call would pay every time. Racing first
 * callers all store the same answer (relaxed: nothing else hangs on it).
 */
static bool has_f16c(void)
{
	static _Atomic int known; /* 0 unknown, 1 no, 2 yes */
	int v = atomic_load_explicit(&known, memory_order_relaxed);

	if (v == 0) {
		unsigned a, b, c, d;

		v = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 2 : 1;
		atomic_store_explicit(&known, v, memory_order_relaxed);
	}
	return v == 2;
}

bool kva__isa_supported(enum kva_isa isa)
{
	switch (isa) {
	case KVA_ISA_SCALAR:
		return true;
	case KVA_ISA_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
	case KVA_ISA_AVX512:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
		       __builtin_cpu_supports("fma") && has_f16c();
	default:
		return false;
	}
}

enum kva_isa kva_isa_best(void)
{
	if (kva__isa_supported(KVA_ISA_AVX512))
		return KVA_ISA_AVX512;
	if (kva__isa_supported(KVA_ISA_AVX2))
		return KVA_ISA_AVX2;
	return KVA_ISA_SCALAR;
}

const char *kva_isa_name(enum kva_isa isa)
{
	switch (isa) {
	case KVA_ISA_AUTO:
		return "auto";
	case KVA_ISA_SCALAR:
		return "scalar";
	case KVA_ISA_AVX2:
		return "avx2";
	case KVA_ISA_AVX512:
		return "avx512";
	}
	return "?";
}
