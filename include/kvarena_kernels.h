/* SPDX-License-Identifier: MIT */
/*
 * kvarena_kernels.h - paged decode attention and KV store over the arena's
 * blocks (or any paged KV cache the descriptor can express). Included by
 * kvarena.h.
 *
 * Layout vocabulary: a page is one block's tokens for one layer. K and V are
 * described separately by a base pointer and three strides in elements:
 * page_stride (page p to p+1), token_stride, head_stride; the head_dim
 * elements of one token and head are contiguous. That expresses the arena's
 * block-major and layer-major layouts (kva_kv_desc_for_arena) and FlashInfer's
 * NHD ([page][token][head][dim]) and HND ([page][head][token][dim]) without
 * copies.
 *
 * Math: for sequence b and query head h (KV head h / group, where group =
 * num_q_heads / num_kv_heads), out = sum_t softmax_t(sm_scale * q.k_t) v_t over
 * the sequence's tokens, accumulated in fp32; lse = log(sum_t exp(sm_scale *
 * q.k_t)) (natural log; -inf for an empty sequence, whose out is 0).
 */
#ifndef KVARENA_KERNELS_H
#define KVARENA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kva_arena;

/* FlashInfer's CSR page table, int32. */
struct kva_page_table {
	int32_t batch, page_size;
	const int32_t *indptr;         /* [batch + 1], indptr[0] == 0, non-decreasing */
	const int32_t *indices;        /* [indptr[batch]] page ids */
	const int32_t *last_page_len;  /* [batch], 1..page_size (0 for a sequence of no page) */
};

#define KVA_KV_SCALE_PER_TENSOR 0x1u /* fp8: one scale, k_scale[0] / v_scale[0] */

/* One layer's K and V, any layout; strides in elements. */
struct kva_kv_desc {
	const void *k, *v;
	int64_t page_stride, token_stride, head_stride;
	int32_t num_kv_heads, head_dim;
	enum kva_dtype dtype;          /* KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_INT8 */
	/* fp8: one float per KV head (or one, with KVA_KV_SCALE_PER_TENSOR);
	 * int8: one float per token and head, at the scale strides below.
	 * A stored value x means x * scale. kva_store_kv writes int8 scales. */
	const float *k_scale, *v_scale;
	/* added to FlashInfer's shape: */
	int32_t page_size;             /* tokens per page */
	int32_t num_pages;             /* valid page ids are 0..num_pages-1 */
	uint32_t flags;                /* KVA_KV_* */
	int64_t scale_page_stride, scale_token_stride, scale_head_stride; /* int8, in floats */
};

enum kva_isa {
	KVA_ISA_AUTO = 0,    /* the best this CPU has */
	KVA_ISA_SCALAR = 1,  /* portable C */
	KVA_ISA_AVX2 = 2,    /* AVX2 + FMA + F16C */
	KVA_ISA_AVX512 = 3,  /* AVX-512 F/BW/VL */
};

struct kva_decode_opts {
	int32_t threads;       /* 0: kva_kernel_threads(), else 1..256 */
	int32_t split_tokens;  /* tokens per split of a sequence; 0: 512 */
	int32_t max_splits;    /* splits per sequence at most; 0: 64 */
	enum kva_isa isa;      /* KVA_ISA_AUTO, or one to force (-ENOTSUP if the CPU lacks it) */
	/* the AVX2 tile (the AVX2 path, and the AVX-512 path where it runs
	 * that tile: kva_decode_tile()): tokens of one query head's output (a
	 * group of 1, or the head a group leaves past a multiple of 4) between
	 * prefetch steps, 1..48; 0: kva_decode_pf_step()'s, chosen for this
	 * CPU. Any value computes the same result; the other tiles ignore it */
	int32_t pf_step;
};

/*
 * kva_decode - one decode step of attention for a batch of sequences.
 * @q, @out: [batch][num_q_heads][head_dim], contiguous, in @q_dtype (f32, f16
 * or bf16); @lse: optional [batch][num_q_heads].
 * Work is split into (sequence, KV head, split of the sequence) tiles; each
 * K/V element is read once for the whole query-head group; splits are merged
 * by log-sum-exp. The split plan depends on the options, never on the thread
 * count, so results do not change with the number of threads.
 * Return: 0, -EINVAL (an argument inconsistent with the others; kva_errmsg()
 * says which), -ENOTSUP (a forced ISA the CPU lacks), -ENOMEM.
 */
int kva_decode(const struct kva_kv_desc *kv, const struct kva_page_table *pt, const void *q,
	       enum kva_dtype q_dtype, int32_t num_q_heads, float sm_scale, void *out, float *lse,
	       const struct kva_decode_opts *opts);

/*
 * kva_store_kv - write @n_tokens tokens' K and V ([n][num_kv_heads][head_dim],
 * contiguous, in @in_dtype: f32, f16 or bf16) to their slots: slot_mapping[i]
 * = page * page_size + offset in the page (vLLM's convention), < 0 = skip.
 * Converts to the cache's dtype: fp8 divides by the head's scale and rounds
 * to nearest even, saturating at +-448; int8 picks a scale per token and head
 * (max |x| / 127) and writes it. Every slot is checked before anything is
 * written. Return: 0 or -EINVAL.
 */
int kva_store_kv(const struct kva_kv_desc *kv, const void *k, const void *v,
		 enum kva_dtype in_dtype, const int64_t *slot_mapping, int32_t n_tokens);

/*
 * kva_page_table_from_block_table - vLLM's padded block table ([batch][row_stride]
 * page ids, of which sequence b uses ceil(seq_lens[b] / page_size)) to CSR.
 * @indices must have room for the sum of those counts. Entries past a
 * sequence's pages are never read. Return: the number of indices written, or
 * -EINVAL.
 */
int kva_page_table_from_block_table(const int32_t *block_table, int64_t row_stride,
				    const int32_t *seq_lens, int32_t batch, int32_t page_size,
				    int32_t *indptr, int32_t *indices, int32_t *last_page_len);

/*
 * kva_kv_desc_for_arena - the descriptor of layer @layer of an arena mapped
 * in this process (block ids are page ids). int8 arenas get their in-block
 * scales; fp8 needs the caller's k_scale/v_scale. Return: 0 or -EINVAL.
 */
int kva_kv_desc_for_arena(const struct kva_arena *a, uint32_t layer, struct kva_kv_desc *out);

/* kva_kernel_threads - the default thread count (the CPUs this process may
 * run on, or $KVARENA_THREADS). */
int kva_kernel_threads(void);

enum kva_isa kva_isa_best(void);
const char *kva_isa_name(enum kva_isa isa);

/*
 * kva_cpu_prefetch_kept - of a burst of 64 software prefetches (prefetcht1,
 * the decode tiles' hint on most CPUs) to lines in no cache, how many this
 * core keeps: a core that queues what it cannot start keeps them all, one
 * that drops the rest about as many as it has misses in flight (measured:
 * Zen 4 63-64, Zen 3 21-26). Measured at the first call, on the calling
 * thread (the first kva_decode on the AVX2 path makes it): bursts to a
 * MiB of fresh memory, each line timed 5 us later, the median of 16 rounds,
 * about a millisecond. A round whose T1 burst kept none asks for another
 * with prefetcht0, whose count stands in where it kept some (some hosts
 * drop every T1 prefetch for a while). Rounds in which the core kept
 * next to none either way do not count (a host's spell, see the README); a
 * probe that saw only those leaves the count unknown, and a call 10 ms
 * later probes again, then 20, 40 ms ... later, 16 probes at most;
 * meanwhile other threads' calls return 0 at once. Thread-safe, and
 * fork-safe: a child forked while a thread of its parent probes probes
 * again itself. Return: 1..64, the same for the rest of the process once
 * known; 0 while not known, and for good where it cannot be told (16
 * probes that saw only spells, or memory no slower than twice the cache).
 */
int32_t kva_cpu_prefetch_kept(void);

/*
 * kva_decode_tile - which tile kva_decode runs for @isa (KVA_ISA_AUTO: the
 * path it picks) at @head_dim with @group query heads per KV head on this
 * CPU: "avx512", "avx2" or "scalar". A path is not always its own tile: on
 * a core that runs each 512-bit operation as two 256-bit halves (AMD Zen 4)
 * the AVX-512 path runs the AVX2 tile for the groups it computes faster
 * there (3, 4, 6, 7 and 8 at head_dim up to 256; README "Kernels"). The
 * results of the two tiles differ only in rounding. Return: the name (a
 * static string); NULL with kva_errmsg() set for an isa this CPU lacks, a
 * head_dim the path does not take (AVX-512 a multiple of 16, AVX2 of 8), or
 * a head_dim out of 1..1024 or group out of 1..64.
 */
const char *kva_decode_tile(enum kva_isa isa, int32_t head_dim, int32_t group);

/*
 * kva_decode_pf_step - the pf_step kva_decode's AVX2 tile (isa avx2, auto on
 * a CPU without AVX-512, or avx512 where kva_decode_tile() says "avx2")
 * takes when the options leave it 0, for a
 * cache of @dtype and @head_dim read by @group query heads per KV head on
 * this CPU: 8 where the lines a step asks for (the next turn's
 * K and V rows, spread over this turn's steps) are no more than
 * kva_cpu_prefetch_kept(), else 4 (so 4 while the count is not known: the
 * step can change once in a process, from 4 to 8; any step computes the
 * same result). Return: the step; 0 where this CPU has no AVX2 path;
 * -EINVAL for a head_dim not a multiple of 8 in 8..1024, a group out of
 * 1..64 or an unknown dtype.
 */
int32_t kva_decode_pf_step(enum kva_dtype dtype, int32_t head_dim, int32_t group);

/* ------------------------------------------------------------------ CUDA */
/*
 * The same decode and store on an NVIDIA GPU (the library carries sm_80 and
 * sm_90 code and PTX the driver compiles for newer GPUs). libcuda is loaded
 * at run time, never linked: on a machine without a driver these calls
 * return -ENODEV and everything else works.
 *
 * Pointers: every data pointer - in @kv (k, v, k_scale, v_scale), in @pt
 * (indptr, indices, last_page_len), @q, @out, @lse, @k, @v, @slot_mapping -
 * is a DEVICE pointer of the calling thread's current CUDA context (with
 * none current, device 0's primary context, the one the CUDA runtime uses);
 * the structs kva_kv_desc and kva_page_table themselves are in host memory.
 * Work is queued on @stream (a CUstream; NULL: the legacy default stream)
 * and the calls return before it runs: past the first call in a context,
 * which loads the kernels, nothing in them waits for the device.
 * Scratch memory comes from the device's stream-ordered pool
 * (cuMemAllocAsync) and is freed on the same stream.
 *
 * Checked on the host, as kva_decode / kva_store_kv check them (-EINVAL,
 * kva_errmsg() says which): the descriptor, dtypes, group, sm_scale, batch,
 * page_size agreement, NULL pointers, the options. Not checked on the host,
 * because they live on the device: the page table's contents, slot_mapping
 * and the fp8 scales. The kernels check those instead: a sequence whose
 * indptr / last_page_len are inconsistent or which names a page id outside
 * 0..num_pages-1 reads nothing outside the cache and gets NaN in every out
 * and lse element of its query heads; a store with a slot past the last page
 * or a bad fp8 scale writes nothing at all. Either sets a bit below in the
 * context's error word (kva_cuda_take_errors).
 */
#define KVA_CUDA_ERR_PAGE_TABLE 0x1u /* indptr or last_page_len inconsistent, indices NULL */
#define KVA_CUDA_ERR_PAGE_ID 0x2u    /* a page id outside 0..num_pages-1 */
#define KVA_CUDA_ERR_SLOT 0x4u       /* store: a slot past the last page */
#define KVA_CUDA_ERR_SCALE 0x8u      /* store: an fp8 scale not positive and finite */

/*
 * kva_cuda_available - whether the CUDA calls can run here: the library was
 * built with nvcc, libcuda.so.1 loads, and there is a device. Safe to call
 * anywhere, any number of times (the driver is loaded once).
 * Return: 0, -ENOTSUP (built without nvcc) or -ENODEV (no driver, a driver
 * too old, or no device); kva_errmsg() says which.
 */
int kva_cuda_available(void);

/*
 * kva_decode_cuda - kva_decode on the GPU (see the pointer rules above).
 * Same arguments and results as kva_decode, to fp32 rounding: the split plan
 * is the same for the same options; @opts->threads is range-checked as
 * kva_decode checks it, and neither it nor @opts->isa has an effect.
 * Scratch is batch * num_kv_heads * max_splits * group * (head_dim + 2)
 * floats plus q in fp32: lower @opts->max_splits to bound it.
 * Return: 0 (queued), -EINVAL, -ENOTSUP or -ENODEV as kva_cuda_available,
 * -ENOMEM (scratch), -ENOSPC (kernels already loaded in 64 contexts), -EIO
 * (another driver failure; kva_errmsg() names it).
 */
int kva_decode_cuda(const struct kva_kv_desc *kv, const struct kva_page_table *pt,
		    const void *q, enum kva_dtype q_dtype, int32_t num_q_heads, float sm_scale,
		    void *out, float *lse, const struct kva_decode_opts *opts, void *stream);

/*
 * kva_store_kv_cuda - kva_store_kv on the GPU (see the pointer rules above),
 * writing the same bytes (and int8 scales) as kva_store_kv. The slots and
 * fp8 scales are checked by one kernel before the next writes anything.
 * Return: 0 (queued), -EINVAL, -ENOTSUP, -ENODEV, -ENOMEM, -ENOSPC, -EIO.
 */
int kva_store_kv_cuda(const struct kva_kv_desc *kv, const void *k, const void *v,
		      enum kva_dtype in_dtype, const int64_t *slot_mapping, int32_t n_tokens,
		      void *stream);

/*
 * kva_cuda_take_errors - the KVA_CUDA_ERR_* bits the kernels of the calling
 * thread's context set since the last call, in *@errors, and clears them.
 * Waits for the context's queued work first, so it is for checks and
 * debugging, not for every step. Return: 0, -EINVAL (NULL @errors),
 * -ENOTSUP, -ENODEV, -ENOSPC, -EIO.
 */
int kva_cuda_take_errors(uint32_t *errors);

#ifdef __cplusplus
}
#endif
#endif /* KVARENA_KERNELS_H */
