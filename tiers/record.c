/* SPDX-License-Identifier: MIT */
/*
 * record.c - the record format both tiers share (tiers_pvt.h): its header,
 * the geometry's fingerprint, and a block's bytes copied to and from a
 * record in canonical order with their XXH3-64 computed on the way.
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

#include "tiers_pvt.h"

#define CHUNK (32u << 10)

uint64_t tier_fingerprint(const struct kva_arena_info *info)
{
	const struct kva_geometry *g = &info->geometry;
	const struct kva_block_layout *l = &info->layout;
	/* everything that decides what the bytes mean; not the layout, which
	 * only decides where they lie in the arena (the record's order is
	 * the same for both) */
	uint64_t v[] = { TIER_FORMAT, g->block_tokens, g->layers, g->kv_heads, g->head_dim,
			 (uint64_t)g->dtype, l->block_bytes, l->page_bytes, l->scale_bytes };

	return XXH3_64bits_withSeed(v, sizeof(v), 0x6b76612d74696572ull);
}

void tier_hdr_fill(struct tier_rec_hdr *h, uint64_t fp, const uint64_t key[2], uint64_t length,
		   uint64_t data_hash, uint64_t seq)
{
	memset(h, 0, sizeof(*h));
	h->magic = TIER_REC_MAGIC;
	h->format = TIER_FORMAT;
	h->hdr_bytes = TIER_HDR_BYTES;
	h->fingerprint = fp;
	h->key[0] = key[0];
	h->key[1] = key[1];
	h->length = length;
	h->data_hash = data_hash;
	h->seq = seq;
	h->hdr_hash = XXH3_64bits(h, offsetof(struct tier_rec_hdr, hdr_hash));
}

const char *tier_hdr_check(const struct tier_rec_hdr *h, uint64_t fp, const uint64_t *key,
			   uint64_t length)
{
	if (h->magic != TIER_REC_MAGIC)
		return "not a record (magic)";
	if (h->hdr_hash != XXH3_64bits(h, offsetof(struct tier_rec_hdr, hdr_hash)))
		return "header checksum";
	if (h->format != TIER_FORMAT || h->hdr_bytes != TIER_HDR_BYTES)
		return "another format";
	if (h->fingerprint != fp)
		return "another geometry";
	if (h->length != length)
		return "length";
	if (key && (h->key[0] != key[0] || h->key[1] != key[1]))
		return "another key";
	return NULL;
}

uint32_t tier_pieces_max(const struct kva_arena_info *info)
{
	if (info->layout.block_stride)
		return 1;
	return 2 * info->geometry.layers * (info->layout.scale_bytes ? 2 : 1);
}

uint32_t tier_pieces(const struct kva_arena_info *info, uint32_t block, struct tier_piece *p)
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

/*
 * Each piece is visited in CHUNK-sized steps. The pieces of a layer-major
 * block number 2 x layers (x 2 with scales); they are computed on the fly
 * rather than stored, one at a time.
 */
static bool piece_at(const struct kva_arena_info *info, uint32_t block, uint32_t i,
		     struct tier_piece *p)
{
	const struct kva_geometry *g = &info->geometry;
	const struct kva_block_layout *l = &info->layout;
	uint32_t pages = 2 * g->layers;

	if (l->block_stride) {
		if (i)
			return false;
		p->off = kva_kv_offset(g, l, info->blocks, block, 0, 0, 0);
		p->len = l->block_bytes;
		return true;
	}
	if (i < pages) {
		p->off = kva_kv_offset(g, l, info->blocks, block, i / 2, (int)(i % 2), 0);
		p->len = l->page_bytes;
		return true;
	}
	i -= pages;
	if (!l->scale_bytes || i >= pages)
		return false;
	p->off = kva_kv_offset(g, l, info->blocks, block, i / 2, (int)(i % 2), 1);
	p->len = l->scale_bytes;
	return true;
}

uint64_t tier_gather(struct kva_arena *a, uint32_t id, uint8_t *dst)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	const uint8_t *data = a->data;
	struct tier_piece p;
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (uint32_t i = 0; piece_at(info, id, i, &p); i++)
		for (uint64_t o = 0; o < p.len; o += CHUNK) {
			uint64_t n = p.len - o < CHUNK ? p.len - o : CHUNK;

			memcpy(dst, data + p.off + o, n);
			XXH3_64bits_update(&st, dst, n);
			dst += n;
		}
	return XXH3_64bits_digest(&st);
}

bool tier_scatter(struct kva_arena *a, uint32_t id, const uint8_t *src, uint64_t hash)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	uint8_t *data = a->data;
	struct tier_piece p;
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (uint32_t i = 0; piece_at(info, id, i, &p); i++)
		for (uint64_t o = 0; o < p.len; o += CHUNK) {
			uint64_t n = p.len - o < CHUNK ? p.len - o : CHUNK;

			memcpy(data + p.off + o, src, n);
			XXH3_64bits_update(&st, data + p.off + o, n);
			src += n;
		}
	return XXH3_64bits_digest(&st) == hash;
}

uint64_t tier_hash_block(struct kva_arena *a, uint32_t id)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	const uint8_t *data = a->data;
	struct tier_piece p;
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (uint32_t i = 0; piece_at(info, id, i, &p); i++)
		XXH3_64bits_update(&st, data + p.off, p.len);
	return XXH3_64bits_digest(&st);
}

void tier_super_fill(struct tier_super *s, uint64_t fp, uint64_t record_bytes, uint64_t records,
		     const char *arena)
{
	memset(s, 0, sizeof(*s));
	s->magic = TIER_SUPER_MAGIC;
	s->format = TIER_FORMAT;
	s->super_bytes = sizeof(*s);
	s->fingerprint = fp;
	s->record_bytes = record_bytes;
	s->records = records;
	s->data_off = TIER_ALIGN;
	snprintf(s->arena, sizeof(s->arena), "%s", arena);
	s->hash = XXH3_64bits(s, offsetof(struct tier_super, hash));
}

const char *tier_super_check(const struct tier_super *s)
{
	if (s->magic != TIER_SUPER_MAGIC)
		return "no superblock";
	if (s->hash != XXH3_64bits(s, offsetof(struct tier_super, hash)))
		return "superblock checksum";
	if (s->format != TIER_FORMAT || s->super_bytes != sizeof(*s) || s->data_off != TIER_ALIGN)
		return "another format";
	if (!memchr(s->arena, 0, sizeof(s->arena)))
		return "arena name";
	return NULL;
}

int tier_inject_parse(const char *spec, struct tier_inject *inj, char *err, size_t len)
{
	static const char *const names[INJ_N] = {
		[INJ_WRITE_EIO] = "write-eio", [INJ_READ_EIO] = "read-eio",
		[INJ_WRITE_SHORT] = "write-short", [INJ_READ_SHORT] = "read-short",
		[INJ_WRITE_ENOSPC] = "write-enospc",
	};
	char buf[256], *save = NULL, *tok;

	memset(inj, 0, sizeof(*inj));
	if (!spec || !*spec)
		return 0;
	snprintf(buf, sizeof(buf), "%s", spec);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':'), *end;
		unsigned long long n = 1;
		int k;

		if (!strcmp(tok, "nodirect")) {
			inj->nodirect = inj->any = true;
			continue;
		}
		if (colon) {
			*colon = 0;
			n = strtoull(colon + 1, &end, 10);
			if (*end || !n) {
				snprintf(err, len, "KVA_TIER_INJECT: '%s': a count from 1", colon + 1);
				return -EINVAL;
			}
		}
		for (k = 0; k < INJ_N && strcmp(tok, names[k]); k++)
			;
		if (k == INJ_N) {
			snprintf(err, len, "KVA_TIER_INJECT: '%s': write-eio, read-eio, write-short, "
				 "read-short, write-enospc (:N) or nodirect", tok);
			return -EINVAL;
		}
		inj->from[k] = n;
		inj->any = true;
	}
	return 0;
}
