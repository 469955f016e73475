/* SPDX-License-Identifier: MIT */
/*
 * test_record.c - the record copy paths (prefix/record_isa.h: SSE2, AVX2,
 * AVX-512, one picked at run time, KVA_RECORD_ISA to force one) agree with
 * each other and with the definition: a block's bytes in canonical order,
 * and their XXH3-64. Every dtype and both layouts; a gather into a
 * destination at every alignment a vector path cares about; a scatter that
 * must refuse bytes with one bit flipped anywhere (first, last, inside a
 * vector, in a tail). Every path this CPU has runs; the others are said.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "prefix_pvt.h"
#include "testutil.h"

static const struct path {
	const char *name;
	uint64_t (*gather)(struct kva_arena *a, uint32_t id, uint8_t *dst);
	bool (*scatter)(struct kva_arena *a, uint32_t id, const uint8_t *src, uint64_t hash);
	uint64_t (*hash)(struct kva_arena *a, uint32_t id);
} paths[] = {
	{ "sse2", kva__rec_gather_sse2, kva__rec_scatter_sse2, kva__rec_hash_sse2 },
	{ "avx2", kva__rec_gather_avx2, kva__rec_scatter_avx2, kva__rec_hash_avx2 },
	{ "avx512", kva__rec_gather_avx512, kva__rec_scatter_avx512, kva__rec_hash_avx512 },
};

static bool have(unsigned p)
{
	if (p == 1)
		return __builtin_cpu_supports("avx2");
	if (p == 2)
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
	return true;
}

/* block @id's bytes in canonical order, by the pieces (the definition) */
static void canonical(struct kva_arena *a, uint32_t id, uint8_t *out)
{
	struct kva__piece p;

	for (uint32_t i = 0; kva__block_piece_at(&a->info, id, i, &p); i++) {
		memcpy(out, a->data + p.off, p.len);
		out += p.len;
	}
}

static void fill(struct kva_arena *a, uint32_t id, uint64_t *seed)
{
	struct kva__piece p;

	for (uint32_t i = 0; kva__block_piece_at(&a->info, id, i, &p); i++)
		for (uint64_t b = 0; b < p.len; b++)
			a->data[p.off + b] = (uint8_t)tu_rand(seed);
}

static void one_geometry(enum kva_dtype dt, enum kva_layout lay, uint32_t head_dim, uint64_t *seed)
{
	struct kva_geometry g = { .block_tokens = 16, .layers = 3, .kv_heads = 2,
				  .head_dim = head_dim, .dtype = dt, .layout = lay };
	struct kva_arena_opts ao = { .blocks = 8, .cache_blocks = KVA_CACHE_NONE, .max_workers = 2,
				     .numa_node = -1, .name = "rec" };
	struct kva_arena *a;
	uint64_t bb, want;
	uint8_t *ref, *buf, *bad;

	assert_int_equal(kva_arena_create(&g, &ao, &a), 0);
	bb = a->info.layout.block_bytes;
	ref = malloc(bb);
	bad = malloc(bb);
	assert_int_equal(posix_memalign((void **)&buf, 4096, bb + 4096), 0);
	fill(a, 1, seed);
	canonical(a, 1, ref);
	want = XXH3_64bits(ref, bb);
	for (unsigned p = 0; p < 3; p++) {
		const struct path *P = &paths[p];

		if (!have(p))
			continue;
		/* gather: to a record's page-aligned data, and to odd addresses */
		for (unsigned mis = 0; mis < 4; mis++) {
			static const unsigned off[] = { 0, 1, 17, 4096 - 8 };

			memset(buf, 0xa5, bb + 4096);
			if (P->gather(a, 1, buf + off[mis]) != want)
				fail_msg("%s: dtype %d layout %d head_dim %u: gather hash", P->name,
					 (int)dt, (int)lay, head_dim);
			if (memcmp(buf + off[mis], ref, bb))
				fail_msg("%s: dtype %d layout %d head_dim %u: gather bytes at +%u",
					 P->name, (int)dt, (int)lay, head_dim, off[mis]);
		}
		assert_true(P->hash(a, 1) == want);
		/* scatter: right bytes land and verify */
		fill(a, 2, seed);
		assert_true(P->scatter(a, 2, ref, want));
		canonical(a, 2, buf);
		assert_memory_equal(buf, ref, bb);
		/* one bit flipped anywhere: refused */
		for (unsigned k = 0; k < 6; k++) {
			uint64_t at = k == 0 ? 0 : k == 1 ? bb - 1 : tu_rand(seed) % bb;

			memcpy(bad, ref, bb);
			bad[at] ^= (uint8_t)(1u << (tu_rand(seed) % 8));
			if (P->scatter(a, 3, bad, want))
				fail_msg("%s: a flipped bit at byte %llu of %llu verified", P->name,
					 (unsigned long long)at, (unsigned long long)bb);
		}
		/* and a wrong hash for right bytes */
		assert_false(P->scatter(a, 3, ref, want ^ 1));
	}
	free(ref);
	free(bad);
	free(buf);
	kva_arena_close(a);
}

static void test_every_path_agrees_with_the_definition(void **state)
{
	static const enum kva_dtype dts[] = { KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_INT8 };
	static const uint32_t dims[] = { 64, 128, 40 };
	uint64_t seed = 42;

	(void)state;
	for (unsigned p = 0; p < 3; p++)
		if (!have(p))
			fprintf(stderr, "  (this CPU has no %s: that path not run)\n", paths[p].name);
	for (unsigned d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
		for (unsigned l = 0; l < 2; l++)
			for (unsigned h = 0; h < 3; h++)
				one_geometry(dts[d], l ? KVA_LAYOUT_LAYER_MAJOR : KVA_LAYOUT_BLOCK_MAJOR,
					     dims[h], &seed);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_path_agrees_with_the_definition),
	};

	return cmocka_run_group_tests_name("record", tests, NULL, NULL);
}
