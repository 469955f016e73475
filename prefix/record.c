/* SPDX-License-Identifier: MIT */
/*
 * record.c - the record format of the tiers below the arena (arena_pvt.h,
 * struct kva__rec_hdr): its header, the geometry's fingerprint, and a
 * block's bytes copied to and from a record in canonical order, with their
 * XXH3-64 computed on the way. The agent writes records (tiers/); a worker
 * reads the host tier's (read-only) and checks every block it is given.
 *
 * The copies go in pieces of at most CHUNK bytes: each piece is copied,
 * then hashed while it is still in the cache, so the bytes cross the memory
 * bus once each way.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "devmem_pvt.h"
#include "prefix_pvt.h"


uint64_t kva__rec_fingerprint(const struct kva_arena_info *info)
{
	const struct kva_geometry *g = &info->geometry;
	const struct kva_block_layout *l = &info->layout;
	/* everything that decides what the bytes mean; not the layout, which
	 * only decides where they lie in the arena (the record's order is
	 * the same for both) */
	uint64_t v[] = { KVA__REC_FORMAT, g->block_tokens, g->layers, g->kv_heads, g->head_dim,
			 (uint64_t)g->dtype, l->block_bytes, l->page_bytes, l->scale_bytes };

	return XXH3_64bits_withSeed(v, sizeof(v), 0x6b76612d74696572ull);
}

void kva__rec_hdr_fill(struct kva__rec_hdr *h, uint64_t fp, const uint64_t key[2],
		       uint64_t length, uint64_t data_hash, uint64_t seq)
{
	memset(h, 0, sizeof(*h));
	atomic_init(&h->magic, KVA__REC_MAGIC);
	h->format = KVA__REC_FORMAT;
	h->hdr_bytes = KVA__REC_HDR_BYTES;
	h->fingerprint = fp;
	h->key[0] = key[0];
	h->key[1] = key[1];
	h->length = length;
	h->data_hash = data_hash;
	h->seq = seq;
	h->hdr_hash = XXH3_64bits(h, offsetof(struct kva__rec_hdr, hdr_hash));
}

const char *kva__rec_hdr_check(const struct kva__rec_hdr *h, uint64_t fp, const uint64_t *key,
			       uint64_t length)
{
	if (atomic_load_explicit(&h->magic, memory_order_relaxed) != KVA__REC_MAGIC)
		return "not a record (magic)";
	if (h->hdr_hash != XXH3_64bits(h, offsetof(struct kva__rec_hdr, hdr_hash)))
		return "header checksum";
	if (h->format != KVA__REC_FORMAT || h->hdr_bytes != KVA__REC_HDR_BYTES)
		return "another format";
	if (h->fingerprint != fp)
		return "another geometry";
	if (h->length != length)
		return "length";
	if (key && (h->key[0] != key[0] || h->key[1] != key[1]))
		return "another key";
	return NULL;
}

uint32_t kva__rec_pieces_max(const struct kva_arena_info *info)
{
	if (info->layout.block_stride)
		return 1;
	return 2 * info->geometry.layers * (info->layout.scale_bytes ? 2 : 1);
}

uint32_t kva__rec_pieces(const struct kva_arena_info *info, uint32_t block, struct kva__piece *p)
{
	const struct kva_geometry *g = &info->geometry;
	const struct kva_block_layout *l = &info->layout;
	uint32_t n = 0;

	if (l->block_stride) {
		p[0].off = kva_kv_offset(g, l, info->blocks, block, 0, 0, 0);
		p[0].len = l->block_bytes;
		return 1;
	}
	for (uint32_t layer = 0; layer < g->layers; layer++)
		for (int kv = 0; kv < 2; kv++) {
			p[n].off = kva_kv_offset(g, l, info->blocks, block, layer, kv, 0);
			p[n++].len = l->page_bytes;
		}
	if (l->scale_bytes)
		for (uint32_t layer = 0; layer < g->layers; layer++)
			for (int kv = 0; kv < 2; kv++) {
				p[n].off = kva_kv_offset(g, l, info->blocks, block, layer, kv, 1);
				p[n++].len = l->scale_bytes;
			}
	return n;
}

/* the paths (record_isa.h; declared in prefix_pvt.h), and the one this CPU runs */
struct rec_ops {
	uint64_t (*gather)(struct kva_arena *a, uint32_t id, uint8_t *dst);
	bool (*scatter)(struct kva_arena *a, uint32_t id, const uint8_t *src, uint64_t hash);
	uint64_t (*hash)(struct kva_arena *a, uint32_t id);
};

static const struct rec_ops ops_sse2 = { kva__rec_gather_sse2, kva__rec_scatter_sse2,
					 kva__rec_hash_sse2 };
static const struct rec_ops ops_avx2 = { kva__rec_gather_avx2, kva__rec_scatter_avx2,
					 kva__rec_hash_avx2 };
static const struct rec_ops ops_avx512 = { kva__rec_gather_avx512, kva__rec_scatter_avx512,
					   kva__rec_hash_avx512 };

/*
 * The best path this CPU has, or the one KVA_RECORD_ISA names (sse2, avx2,
 * avx512: to measure and test each path on one machine; a path the CPU
 * lacks is not taken). Racing first callers store the same pointer
 * (relaxed: nothing else hangs on it).
 */
static const struct rec_ops *ops(void)
{
	static const struct rec_ops *_Atomic chosen;
	const struct rec_ops *o = atomic_load_explicit(&chosen, memory_order_relaxed);

	if (!o) {
		bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
		bool avx2 = __builtin_cpu_supports("avx2");
		const char *want = getenv("KVA_RECORD_ISA");

		o = avx512 ? &ops_avx512 : avx2 ? &ops_avx2 : &ops_sse2;
		if (want && !strcmp(want, "sse2"))
			o = &ops_sse2;
		else if (want && !strcmp(want, "avx2") && avx2)
			o = &ops_avx2;
		atomic_store_explicit(&chosen, o, memory_order_relaxed);
	}
	return o;
}

uint64_t kva__rec_gather(struct kva_arena *a, uint32_t id, uint8_t *dst)
{
	return ops()->gather(a, id, dst);
}

bool kva__rec_scatter(struct kva_arena *a, uint32_t id, const uint8_t *src, uint64_t hash)
{
	return ops()->scatter(a, id, src, hash);
}

uint64_t kva__block_hash(struct kva_arena *a, uint32_t id)
{
	return ops()->hash(a, id);
}

void kva__rec_put(struct kva_arena *a, uint32_t id, const uint8_t *src)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	struct kva__piece p;

	for (uint32_t i = 0; kva__block_piece_at(info, id, i, &p); i++) {
		memcpy(a->data + p.off, src, p.len);
		src += p.len;
	}
}

int kva__rec_gather_dev(struct kva_arena *a, struct kva__dev_queue *q, uint32_t id, uint8_t *dst,
			uint64_t *hash)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	struct kva__piece p;
	uint64_t at = 0;
	int ret;

	/* every piece queued, then one wait: the copies overlap on the bus;
	 * a failed one makes the rest refuse and the wait say why */
	for (uint32_t i = 0; kva__block_piece_at(info, id, i, &p); i++) {
		kva__dev_queue_to_host(q, dst + at, p.off, p.len);
		at += p.len;
	}
	if ((ret = kva__dev_queue_wait(q)) < 0)
		return ret;
	/* the canonical bytes' XXH3-64, as the host paths give it */
	*hash = XXH3_64bits(dst, info->layout.block_bytes);
	return 0;
}

int kva__rec_put_dev(struct kva_arena *a, struct kva__dev_queue *q, uint32_t id,
		     const uint8_t *src, uint64_t hash)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	struct kva__piece p;

	if (XXH3_64bits(src, info->layout.block_bytes) != hash)
		return -EBADMSG;
	for (uint32_t i = 0; kva__block_piece_at(info, id, i, &p); i++) {
		kva__dev_queue_from_host(q, p.off, src, p.len);
		src += p.len;
	}
	/* in device memory before the caller lets go and says DONE */
	return kva__dev_queue_wait(q);
}

uint64_t kva_tier_record_bytes(uint64_t block_bytes)
{
	return KVA__REC_HDR_BYTES + (block_bytes + KVA__REC_ALIGN - 1) / KVA__REC_ALIGN * KVA__REC_ALIGN;
}
