/* SPDX-License-Identifier: MIT */
/* bench_roofline.h - the arithmetic a decode needs (apart from bench.h, which
 * bench_dpdk.c includes without kvarena's headers) */
#ifndef KVA_BENCH_ROOFLINE_H
#define KVA_BENCH_ROOFLINE_H

#include <stdint.h>

#include "kvarena.h"
#include "kvarena_kernels.h"

/*
 * bench_roofline - bytes of KV cache a second that @threads threads could
 * decode with @isa (KVA_ISA_AVX2 or KVA_ISA_AVX512) at query group @group if
 * memory cost nothing: each stored @dt element converted to fp32 once and
 * multiplied into @group accumulators, over an L1-resident buffer,
 * @bytes_per_thread each (rounded up to whole passes).
 * Return: 0, -EINVAL, -ENOMEM, or pthread_create's -errno.
 */
int bench_roofline(enum kva_isa isa, enum kva_dtype dt, unsigned group, unsigned threads,
		   uint64_t bytes_per_thread, double *gbps);

#endif
