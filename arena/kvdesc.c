/* SPDX-License-Identifier: MIT */
/*
 * kvdesc.c - the kernels' descriptor of one layer of an arena mapped in this
 * process: block ids are page ids.
 */
#include <errno.h>
#include <string.h>

#include "arena_pvt.h"

int kva_kv_desc_for_arena(const struct kva_arena *a, uint32_t layer, struct kva_kv_desc *out)
{
	const struct kva_geometry *g;
	const struct kva_block_layout *l;
	int64_t esize;

	if (!a || !out)
		return -EINVAL;
	g = &a->info.geometry;
	l = &a->info.layout;
	if (layer >= g->layers)
		return kva__err(-EINVAL, "kv_desc: no layer %u (%u layers)", layer, g->layers);
	esize = (int64_t)kva_dtype_size(g->dtype);
	memset(out, 0, sizeof(*out));
	out->k = a->data + kva_kv_offset(g, l, a->blocks, 0, layer, 0, 0);
	out->v = a->data + kva_kv_offset(g, l, a->blocks, 0, layer, 1, 0);
	out->page_stride = (int64_t)l->page_stride / esize;  /* 64-byte aligned: exact */
	out->head_stride = (int64_t)l->head_stride / esize;  /* [kv_head][token][dim] */
	out->token_stride = (int64_t)l->token_stride / esize;
	out->num_kv_heads = (int32_t)g->kv_heads;
	out->head_dim = (int32_t)g->head_dim;
	out->dtype = g->dtype;
	out->page_size = (int32_t)g->block_tokens;
	out->num_pages = (int32_t)a->blocks;
	if (g->dtype == KVA_INT8) { /* scales in the block: [kv_head][token] floats */
		out->k_scale = (const float *)(a->data + kva_kv_offset(g, l, a->blocks, 0, layer, 0, 1));
		out->v_scale = (const float *)(a->data + kva_kv_offset(g, l, a->blocks, 0, layer, 1, 1));
		out->scale_page_stride = (int64_t)l->scale_stride / (int64_t)sizeof(float);
		out->scale_token_stride = 1;
		out->scale_head_stride = g->block_tokens;
	}
	return 0;
}
