/* SPDX-License-Identifier: MIT */
/*
 * record_isa.h - a block's bytes copied to or from a record, and their
 * XXH3-64, in one pass over memory: each piece goes in chunks small enough
 * to stay in the L1 cache between the copy and the hash, so the bytes cross
 * the memory bus once each way and the hash costs cache bandwidth only.
 *
 * The copy streams its stores past the caches (non-temporal stores: no
 * read for ownership of the destination, which a plain memcpy pays for),
 * and the hash reads the source chunk the copy just loaded, from L1: so a
 * copy and its checksum together cost about what memcpy alone does.
 *
 * Included once per instruction set, with its -m flags and REC_ISA set
 * (record_sse2.c, the x86-64 baseline; record_avx2.c, record_avx512.c);
 * xxHash is inlined with the matching XXH_VECTOR, so each path hashes with
 * its widest vectors. Every path gives the same hash (XXH3's specification).
 * record.c picks one at run time.
 */
#ifndef REC_ISA
#error "REC_ISA: sse2, avx2 or avx512"
#endif

#include <immintrin.h>
#include <string.h>

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "prefix_pvt.h"

#define REC_CHUNK (16u << 10)
#define REC_CAT2(a, b) a##_##b
#define REC_CAT(a, b) REC_CAT2(a, b)
#define REC_FN(x) REC_CAT(kva__rec_##x, REC_ISA)

#if defined(__AVX512F__)
typedef __m512i rec_vec;
#define REC_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define REC_STREAM(p, v) _mm512_stream_si512((void *)(p), v)
#elif defined(__AVX2__)
typedef __m256i rec_vec;
#define REC_LOAD(p) _mm256_loadu_si256((const void *)(p))
#define REC_STREAM(p, v) _mm256_stream_si256((void *)(p), v)
#else
typedef __m128i rec_vec;
#define REC_LOAD(p) _mm_loadu_si128((const void *)(p))
#define REC_STREAM(p, v) _mm_stream_si128((void *)(p), v)
#endif

/*
 * copy_nt - @n bytes, the destination's stores non-temporal where it is
 * aligned to the vector; the caller fences (sfence) before anyone may read
 * the destination from another core.
 */
static inline void copy_nt(uint8_t *dst, const uint8_t *src, uint64_t n)
{
	enum { V = sizeof(rec_vec) };
	uint64_t head = ((uintptr_t)-(uintptr_t)dst) & (V - 1);

	if (head > n)
		head = n;
	memcpy(dst, src, head);
	dst += head;
	src += head;
	n -= head;
	/* four loads, then four streams: the loads in flight together */
	for (; n >= 4 * V; n -= 4 * V, dst += 4 * V, src += 4 * V) {
		rec_vec a = REC_LOAD(src), b = REC_LOAD(src + V), c = REC_LOAD(src + 2 * V),
			d = REC_LOAD(src + 3 * V);

		REC_STREAM(dst, a);
		REC_STREAM(dst + V, b);
		REC_STREAM(dst + 2 * V, c);
		REC_STREAM(dst + 3 * V, d);
	}
	memcpy(dst, src, n);
}

uint64_t REC_FN(gather)(struct kva_arena *a, uint32_t id, uint8_t *dst)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	const uint8_t *data = a->data;
	struct kva__piece p;
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (uint32_t i = 0; kva__block_piece_at(info, id, i, &p); i++)
		for (uint64_t o = 0; o < p.len; o += REC_CHUNK) {
			uint64_t n = p.len - o < REC_CHUNK ? p.len - o : REC_CHUNK;

			copy_nt(dst, data + p.off + o, n);
			XXH3_64bits_update(&st, data + p.off + o, n); /* from L1 */
			dst += n;
		}
	_mm_sfence();
	return XXH3_64bits_digest(&st);
}

bool REC_FN(scatter)(struct kva_arena *a, uint32_t id, const uint8_t *src, uint64_t hash)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	uint8_t *data = a->data;
	struct kva__piece p;
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (uint32_t i = 0; kva__block_piece_at(info, id, i, &p); i++)
		for (uint64_t o = 0; o < p.len; o += REC_CHUNK) {
			uint64_t n = p.len - o < REC_CHUNK ? p.len - o : REC_CHUNK;

			/* the hash is the source's, as it was copied: a source
			 * changed under us is the caller's to notice (host_copy's
			 * seqlock) */
			copy_nt(data + p.off + o, src, n);
			XXH3_64bits_update(&st, src, n); /* from L1 */
			src += n;
		}
	_mm_sfence();
	return XXH3_64bits_digest(&st) == hash;
}

uint64_t REC_FN(hash)(struct kva_arena *a, uint32_t id)
{
	const struct kva_arena_info *info = kva_arena_info(a);
	const uint8_t *data = a->data;
	struct kva__piece p;
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (uint32_t i = 0; kva__block_piece_at(info, id, i, &p); i++)
		XXH3_64bits_update(&st, data + p.off, p.len);
	return XXH3_64bits_digest(&st);
}
