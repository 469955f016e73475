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

/*
 * The same arithmetic over memory: bench_arith_chunk() is a
 * bench_readbw_run_over() reader (bench.h) that converts each stored @dt
 * element of a chunk once and multiplies it into @group accumulators, as
 * bench_roofline()'s loop does, asking for the lines of the chunk ahead as
 * it reads. Read over the 4 KiB order from memory, it says how fast this
 * machine runs the decode's arithmetic and its reads together, when the
 * reads are a plain prefetched stream: where neither is the bound alone,
 * what overlapping them leaves. Threads [0, @threads) each have their own
 * query vectors and sink. open: 0, -EINVAL, -ENOMEM.
 */
struct bench_arith;
int bench_arith_open(enum kva_isa isa, enum kva_dtype dt, unsigned group, unsigned threads,
		     struct bench_arith **out);
void bench_arith_close(struct bench_arith *a);
void bench_arith_chunk(void *ctx, unsigned thread, const char *p, const char *pf, size_t len);

#endif
