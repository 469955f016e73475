/* SPDX-License-Identifier: MIT */
/*
 * kernels_pvt.h - what the decode driver (decode.c) and the per-ISA tile
 * kernels (tile_*.c) agree on.
 *
 * A tile is one (sequence, KV head, split): a run of whole pages of one
 * sequence, read once for the whole group of query heads that share the KV
 * head. Its kernel leaves, per query head of the group, the log2-domain
 * online-softmax state (m, l) and the unnormalised output acc; the driver
 * merges the splits (decode_math.h) and normalises.
 */
#ifndef KVA_KERNELS_PVT_H
#define KVA_KERNELS_PVT_H

#include <stdbool.h>
#include <stdint.h>

#include "decode_math.h"
#include "kvarena.h"

#define KVA__MAX_GROUP 64      /* query heads per KV head */
#define KVA__MAX_HEAD_DIM 1024
#define KVA__BLOCK_TOKENS 32   /* tokens a tile scores before it updates its softmax state */

struct kva__tile {
	const struct kva_kv_desc *kv;
	const int32_t *pages;  /* the sequence's page ids, all checked < num_pages */
	int32_t t0, t1;        /* its tokens [t0, t1), t0 < t1; t0 is page-aligned */
	int32_t kv_head;
	int32_t group;         /* 1..KVA__MAX_GROUP */
	const float *q;        /* [group][head_dim]: q * sm_scale * log2(e), fp32 */
	float *acc;            /* [group][head_dim] out */
	float *m, *l;          /* [group] out */
};

typedef void (*kva__tile_fn)(const struct kva__tile *t);

/* tile_scalar.c: any dtype, any head_dim */
void kva__tile_scalar(const struct kva__tile *t);
/* tile_avx2.c, tile_avx512.c: head_dim a multiple of 8 / 16 */
void kva__tile_avx2(const struct kva__tile *t);
void kva__tile_avx512(const struct kva__tile *t);

/* Scale of token @t's head in int8 K (or V), or the fp8 scale; 1 otherwise. */
static inline float kva__scale(const struct kva_kv_desc *kv, const float *base, int32_t page,
			       int32_t t, int32_t head)
{
	if (kv->dtype == KVA_INT8)
		return base[(int64_t)page * kv->scale_page_stride + (int64_t)t * kv->scale_token_stride +
			    (int64_t)head * kv->scale_head_stride];
	if (kv->dtype == KVA_FP8_E4M3)
		return base[kv->flags & KVA_KV_SCALE_PER_TENSOR ? 0 : head];
	return 1.0f;
}

/* bytes per element, inline (kva_dtype_size is a library call) */
static inline size_t kva__esize(enum kva_dtype t)
{
	return t == KVA_F32 ? 4 : t == KVA_F16 || t == KVA_BF16 ? 2 : 1;
}

/* The address of token @t (in the sequence) of the tile's head in K or V. */
static inline const void *kva__row(const struct kva__tile *tl, const void *base, int32_t t)
{
	const struct kva_kv_desc *kv = tl->kv;
	int64_t e = kva_kv_index(kv->page_stride, kv->token_stride, kv->head_stride,
				 tl->pages[t / kv->page_size], t % kv->page_size, tl->kv_head);

	return (const char *)base + e * (int64_t)kva__esize(kv->dtype);
}

/*
 * The rows of a block of the tile's tokens: K and V addresses and scales,
 * walked page by page without a division per token (the vector paths call
 * this once per block of KVA__BLOCK_TOKENS).
 */
struct kva__rows {
	const char *k[KVA__BLOCK_TOKENS], *v[KVA__BLOCK_TOKENS];
	float ks[KVA__BLOCK_TOKENS], vs[KVA__BLOCK_TOKENS];
	int n;
};

static inline void kva__rows_at(const struct kva__tile *t, int32_t tb, struct kva__rows *r)
{
	const struct kva_kv_desc *kv = t->kv;
	const int64_t esize = (int64_t)kva__esize(kv->dtype);
	const int64_t head = (int64_t)t->kv_head * kv->head_stride, tok_bytes = kv->token_stride * esize;
	int32_t pi = tb / kv->page_size, off = tb % kv->page_size, n;
	const char *kp = NULL, *vp = NULL;

	n = t->t1 - tb < KVA__BLOCK_TOKENS ? t->t1 - tb : KVA__BLOCK_TOKENS;
	r->n = n > 0 ? n : 0;
	for (int i = 0; i < r->n; i++, off++) {
		int32_t page;

		if (off == kv->page_size) {
			off = 0;
			pi++;
		}
		page = t->pages[pi];
		if (i == 0 || off == 0) {
			int64_t e = (int64_t)page * kv->page_stride + head;

			kp = (const char *)kv->k + e * esize;
			vp = (const char *)kv->v + e * esize;
		}
		r->k[i] = kp + off * tok_bytes;
		r->v[i] = vp + off * tok_bytes;
		r->ks[i] = kva__scale(kv, kv->k_scale, page, off, t->kv_head);
		r->vs[i] = kva__scale(kv, kv->v_scale, page, off, t->kv_head);
	}
	for (int i = r->n; i < KVA__BLOCK_TOKENS; i++)
		r->vs[i] = 0.0f; /* p is 0 past the end: so must p * vs be */
}

/* decode.c: argument checks shared with the CUDA entry points */
int kva__kv_desc_check(const struct kva_kv_desc *kv);
int kva__decode_args_check(const struct kva_kv_desc *kv, const struct kva_page_table *pt,
			   const void *q, enum kva_dtype q_dtype, int32_t num_q_heads,
			   float sm_scale, const void *out, const struct kva_decode_opts *o);

/* pool.c */

/*
 * kva__parallel - fn(ctx, task) for every task in [0, n), on up to @threads
 * threads, the caller one of them. Tasks are handed out one at a time by an
 * atomic counter, so uneven tasks balance; which thread runs a task never
 * changes what it computes.
 */
int kva__parallel(int threads, uint32_t n, void (*fn)(void *ctx, uint32_t task), void *ctx);

/* isa.c */
bool kva__isa_supported(enum kva_isa isa);

#endif /* KVA_KERNELS_PVT_H */
