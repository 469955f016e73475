/* SPDX-License-Identifier: MIT */
/*
 * test_geometry.c - block shape to bytes: known layouts, every page inside
 * the region and disjoint from every other, bad fields and overflow refused.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

static struct kva_geometry geo(uint32_t t, uint32_t l, uint32_t h, uint32_t d, enum kva_dtype dt,
			       enum kva_layout lay)
{
	return (struct kva_geometry){ t, l, h, d, dt, lay };
}

static void test_block_major_f16_layout(void **state)
{
	struct kva_geometry g = geo(16, 2, 2, 64, KVA_F16, KVA_LAYOUT_BLOCK_MAJOR);
	struct kva_block_layout l;

	(void)state;
	assert_int_equal(kva_geometry_layout(&g, 10, &l), 0);
	assert_int_equal(l.elem_bytes, 2);
	assert_int_equal(l.token_stride, 64 * 2);
	assert_int_equal(l.head_stride, 16 * 64 * 2);
	assert_int_equal(l.page_bytes, 2 * 16 * 64 * 2);
	assert_int_equal(l.block_bytes, 4 * 4096);
	assert_int_equal(l.block_stride, 4 * 4096);
	assert_int_equal(l.page_stride, l.block_stride);
	assert_int_equal(l.data_bytes, 10 * 4 * 4096);
	assert_int_equal(l.scale_bytes, 0);
	/* layer 1's V of block 3: past block 0..2, then K0 V0 K1 */
	assert_int_equal(kva_kv_offset(&g, &l, 10, 3, 1, 1, 0), 3 * 16384 + 3 * 4096);
	assert_int_equal(kva_kv_offset(&g, &l, 10, 0, 0, 0, 0), 0);
}

static void test_block_major_int8_has_scales_inside_the_block(void **state)
{
	struct kva_geometry g = geo(16, 2, 2, 64, KVA_INT8, KVA_LAYOUT_BLOCK_MAJOR);
	struct kva_block_layout l;

	(void)state;
	assert_int_equal(kva_geometry_layout(&g, 4, &l), 0);
	assert_int_equal(l.page_bytes, 16 * 2 * 64);
	assert_int_equal(l.scale_bytes, 16 * 2 * 4);      /* a float per token and head */
	assert_int_equal(l.block_bytes, 4 * 2048 + 4 * 128);
	assert_int_equal(l.block_stride, 12288);          /* 4 KiB aligned */
	assert_int_equal(kva_kv_offset(&g, &l, 4, 1, 1, 0, 1), 12288 + 4 * 2048 + 2 * 128);
}

static void test_layer_major_pools(void **state)
{
	struct kva_geometry g = geo(16, 3, 8, 128, KVA_BF16, KVA_LAYOUT_LAYER_MAJOR);
	struct kva_block_layout l;
	uint64_t page = 16 * 8 * 128 * 2;

	(void)state;
	assert_int_equal(kva_geometry_layout(&g, 100, &l), 0);
	assert_int_equal(l.page_bytes, page);
	assert_int_equal(l.page_stride, page);
	assert_int_equal(l.block_stride, 0);
	assert_int_equal(l.pool_bytes, 100 * page);
	assert_int_equal(l.data_bytes, 6 * 100 * page);
	assert_int_equal(kva_kv_offset(&g, &l, 100, 7, 2, 1, 0), 5 * 100 * page + 7 * page);
}

static void test_pages_are_aligned_even_for_odd_shapes(void **state)
{
	struct kva_geometry g = geo(3, 1, 1, 5, KVA_F32, KVA_LAYOUT_BLOCK_MAJOR);
	struct kva_block_layout l;

	(void)state;
	assert_int_equal(kva_geometry_layout(&g, 1, &l), 0);
	assert_int_equal(l.head_stride, 3 * 5 * 4);
	assert_int_equal(l.page_bytes, 64);
	assert_int_equal(l.block_stride, 4096);
}

struct span {
	uint64_t lo, hi;
};

static int span_cmp(const void *x, const void *y)
{
	const struct span *a = x, *b = y;

	return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Every K, V and scale array of every block and layer lies inside the data
 * region and overlaps no other, for many shapes, in both layouts. */
static void test_every_page_is_inside_and_disjoint(void **state)
{
	uint64_t rng = 7;

	(void)state;
	for (int round = 0; round < 300; round++) {
		enum kva_dtype dt = (enum kva_dtype)(1 + tu_rand(&rng) % 5);
		struct kva_geometry g = geo(1 + (uint32_t)(tu_rand(&rng) % 40),
					    1 + (uint32_t)(tu_rand(&rng) % 5),
					    1 + (uint32_t)(tu_rand(&rng) % 9),
					    1 + (uint32_t)(tu_rand(&rng) % 150), dt,
					    (enum kva_layout)(tu_rand(&rng) % 2));
		uint32_t blocks = 1 + (uint32_t)(tu_rand(&rng) % 17), n = 0;
		struct kva_block_layout l;
		struct span *s;
		uint64_t unpadded = (uint64_t)g.block_tokens * g.kv_heads * g.head_dim *
				    kva_dtype_size(dt);

		assert_int_equal(kva_geometry_layout(&g, blocks, &l), 0);
		s = calloc((size_t)blocks * g.layers * 4, sizeof(*s));
		for (uint32_t b = 0; b < blocks; b++)
			for (uint32_t layer = 0; layer < g.layers; layer++)
				for (int kv = 0; kv < 2; kv++) {
					uint64_t o = kva_kv_offset(&g, &l, blocks, b, layer, kv, 0);

					assert_int_equal(o % 64, 0);
					s[n++] = (struct span){ o, o + unpadded };
					if (dt == KVA_INT8) {
						o = kva_kv_offset(&g, &l, blocks, b, layer, kv, 1);
						s[n++] = (struct span){
							o, o + 4ull * g.block_tokens * g.kv_heads };
					}
				}
		qsort(s, n, sizeof(*s), span_cmp);
		for (uint32_t k = 0; k < n; k++) {
			assert_true(s[k].hi <= l.data_bytes);
			if (k)
				assert_true(s[k - 1].hi <= s[k].lo);
		}
		free(s);
	}
}

static void test_bad_fields_are_einval_and_named(void **state)
{
	struct kva_block_layout l;
	struct {
		struct kva_geometry g;
		uint32_t blocks;
		const char *names;
	} bad[] = {
		{ geo(0, 1, 1, 64, KVA_F16, 0), 1, "block_tokens" },
		{ geo(65537, 1, 1, 64, KVA_F16, 0), 1, "block_tokens" },
		{ geo(16, 0, 1, 64, KVA_F16, 0), 1, "layers" },
		{ geo(16, 4097, 1, 64, KVA_F16, 0), 1, "layers" },
		{ geo(16, 1, 0, 64, KVA_F16, 0), 1, "kv_heads" },
		{ geo(16, 1, 1, 0, KVA_F16, 0), 1, "head_dim" },
		{ geo(16, 1, 1, 64, (enum kva_dtype)0, 0), 1, "dtype" },
		{ geo(16, 1, 1, 64, (enum kva_dtype)9, 0), 1, "dtype" },
		{ geo(16, 1, 1, 64, KVA_F16, (enum kva_layout)2), 1, "layout" },
		{ geo(16, 1, 1, 64, KVA_F16, 0), 0, "blocks" },
		{ geo(16, 1, 1, 64, KVA_F16, 0), 0x80000000u, "blocks" },
	};

	(void)state;
	for (unsigned k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		assert_int_equal(kva_geometry_layout(&bad[k].g, bad[k].blocks, &l), -EINVAL);
		assert_non_null(strstr(kva_errmsg(), bad[k].names));
	}
	assert_int_equal(kva_geometry_layout(NULL, 1, &l), -EINVAL);
}

static void test_overflow_is_eoverflow(void **state)
{
	struct kva_geometry g = geo(65536, 4096, 4096, 65536, KVA_F32, KVA_LAYOUT_BLOCK_MAJOR);
	struct kva_block_layout l;

	(void)state;
	assert_int_equal(kva_geometry_layout(&g, 1, &l), 0);     /* 2^59 bytes: fits */
	assert_int_equal(kva_geometry_layout(&g, 16, &l), -EOVERFLOW);
	g = geo(4096, 64, 64, 256, KVA_F32, KVA_LAYOUT_BLOCK_MAJOR); /* 2^35 per block */
	assert_int_equal(kva_geometry_layout(&g, 1, &l), 0);
	assert_int_equal(kva_geometry_layout(&g, KVA_MAX_BLOCKS, &l), -EOVERFLOW);
	g.layout = KVA_LAYOUT_LAYER_MAJOR;
	assert_int_equal(kva_geometry_layout(&g, KVA_MAX_BLOCKS, &l), -EOVERFLOW);
}

static void test_dtype_names_round_trip(void **state)
{
	enum kva_dtype t;

	(void)state;
	for (int k = KVA_F32; k <= KVA_INT8; k++) {
		assert_int_equal(kva_dtype_parse(kva_dtype_name((enum kva_dtype)k), &t), 0);
		assert_int_equal(t, k);
	}
	assert_int_equal(kva_dtype_size(KVA_F32), 4);
	assert_int_equal(kva_dtype_size(KVA_BF16), 2);
	assert_int_equal(kva_dtype_size(KVA_FP8_E4M3), 1);
	assert_int_equal(kva_dtype_size((enum kva_dtype)42), 0);
	assert_string_equal(kva_dtype_name((enum kva_dtype)42), "?");
	assert_int_equal(kva_dtype_parse("fp8", &t), 0);
	assert_int_equal(t, KVA_FP8_E4M3);
	assert_int_equal(kva_dtype_parse("f64", &t), -EINVAL);
	assert_int_equal(kva_dtype_parse(NULL, &t), -EINVAL);
}

static void test_create_refuses_bad_options(void **state)
{
	struct kva_geometry g = tu_geometry();
	struct kva_arena_opts o = { .blocks = 64, .numa_node = -1 };
	struct kva_arena *a = NULL;

	(void)state;
	o.max_workers = KVA_MAX_WORKERS + 1;
	assert_int_equal(kva_arena_create(&g, &o, &a), -EINVAL);
	assert_non_null(strstr(kva_errmsg(), "max_workers"));
	o.max_workers = 0;
	o.cache_blocks = 1u << 20;
	assert_int_equal(kva_arena_create(&g, &o, &a), -EINVAL);
	o.cache_blocks = 0;
	o.flags = 0x80;
	assert_int_equal(kva_arena_create(&g, &o, &a), -EINVAL);
	o.flags = 0;
	o.numa_node = 4095; /* no such node */
	assert_int_equal(kva_arena_create(&g, &o, &a), -EINVAL);
	assert_non_null(strstr(kva_errmsg(), "NUMA"));
	o.blocks = 0;
	o.numa_node = -1;
	assert_int_equal(kva_arena_create(&g, &o, &a), -EINVAL);
	assert_null(a);
	assert_int_equal(kva_arena_create(NULL, &o, &a), -EINVAL);
}

static void test_create_binds_numa_node_zero_and_asks_for_huge_pages(void **state)
{
	struct kva_geometry g = tu_geometry();
	struct kva_arena_opts o = { .blocks = 256, .numa_node = 0, .flags = KVA_ARENA_HUGETLB };
	struct kva_arena *a;
	struct kva_worker *w;
	uint32_t id;

	(void)state;
	assert_int_equal(kva_arena_create(&g, &o, &a), 0);
	assert_int_equal(kva_arena_info(a)->numa_node, 0);
	/* huge pages only if the system has them reserved: either way it works */
	assert_true(kva_arena_info(a)->hugetlb == 0 || kva_arena_info(a)->hugetlb == 1);
	assert_int_equal(kva_worker_join(a, "w", &w), 0);
	assert_int_equal(kva_alloc(w, 1, &id), 0);
	memset(kva_block_data(w, id), 1, kva_arena_info(a)->layout.block_bytes);
	kva_worker_leave(w);
	kva_arena_close(a);
}

/*
 * The VmFlags of the mapping of this process that holds @p ("hg": it asked
 * for transparent huge pages) into @flags, and the bytes 2 MiB pages map of
 * it (ShmemPmdMapped). false if no mapping holds @p.
 */
static bool mapping_of(const void *p, char *flags, size_t len, uint64_t *huge)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[512];
	bool in = false, found = false;

	*huge = 0;
	flags[0] = '\0';
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi, kb;
		char c;

		if (sscanf(line, "%lx-%lx %c", &lo, &hi, &c) == 3) {
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
			found |= in;
		} else if (in && sscanf(line, "ShmemPmdMapped: %lu kB", &kb) == 1) {
			*huge = (uint64_t)kb << 10;
		} else if (in && !strncmp(line, "VmFlags:", 8)) {
			snprintf(flags, len, "%.*s", (int)(len - 1), line + 8);
		}
	}
	fclose(f);
	return found;
}

/* a counter of /proc/vmstat (0 if there is none) */
static uint64_t vmstat(const char *name)
{
	FILE *f = fopen("/proc/vmstat", "re");
	char key[64];
	unsigned long long v;
	uint64_t out = 0;

	if (!f)
		return 0;
	while (fscanf(f, "%63s %llu", key, &v) == 2)
		if (!strcmp(key, name))
			out = v;
	fclose(f);
	return out;
}

/* the system's choice for shmem's transparent huge pages ("" if none) */
static void thp_shmem(char *out, size_t len)
{
	static const char *const files[] = {
		"/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled",
		"/sys/kernel/mm/transparent_hugepage/shmem_enabled",
	};

	out[0] = '\0';
	for (int i = 0; i < 2; i++) {
		char buf[256], *l, *r;
		FILE *f = fopen(files[i], "re");

		if (!f)
			continue;
		if (fgets(buf, sizeof(buf), f) && (l = strchr(buf, '[')) && (r = strchr(l, ']'))) {
			*r = '\0';
			snprintf(out, len, "%s", l + 1);
		}
		fclose(f);
		if (out[0] && strcmp(out, "inherit"))
			return;
	}
}

/*
 * A host arena's data asks for transparent huge pages in every process that
 * maps it, the agent's and a worker's in another process (the kernel makes
 * a page huge where the mapping that first touches it asked, and maps it
 * whole only where the mapping asked too). Where the system gives shmem
 * huge pages to those who ask ("advise", "always", "within_size", "force"),
 * the worker's touched blocks are mapped by 2 MiB pages (unless the kernel
 * found no free 2 MiB and says so in thp_file_fallback); where it does not
 * ("never", the default), only the asking is checked; a kernel without
 * transparent huge pages (no /sys/kernel/mm/transparent_hugepage) has no
 * flag to show.
 */
static void test_data_asks_for_transparent_huge_pages_in_every_process(void **state)
{
	struct kva_geometry g = tu_geometry();
	struct kva_arena_opts o = { .blocks = 1024, .numa_node = -1 }; /* 16 MiB */
	struct kva_arena *a;
	char flags[512], thp[32];
	uint64_t huge;
	bool gives;
	pid_t pid;
	int st;

	(void)state;
	thp_shmem(thp, sizeof(thp));
	gives = !strcmp(thp, "advise") || !strcmp(thp, "always") || !strcmp(thp, "within_size") ||
		!strcmp(thp, "force");
	print_message("shmem transparent huge pages: \"%s\"\n", thp);
	assert_int_equal(kva_arena_create(&g, &o, &a), 0);
	assert_false(kva_arena_info(a)->hugetlb);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct kva_arena *b;
		struct kva_worker *w;
		uint32_t ids[256];
		int code = 0;

		if (kva_arena_open(kva_arena_meta_fd(a), kva_arena_data_fd(a), &b) < 0 ||
		    kva_worker_join(b, "thp", &w) < 0 || kva_alloc(w, 256, ids) < 0)
			_exit(10);
		uint64_t fallback = vmstat("thp_file_fallback");

		for (int i = 0; i < 256; i++) /* 4 MiB: at least one whole 2 MiB page */
			memset(kva_block_data(w, ids[i]), i, kva_arena_info(b)->layout.block_bytes);
		if (!mapping_of(kva_block_data(w, ids[0]), flags, sizeof(flags), &huge))
			code = 11;
		else if (thp[0] && !strstr(flags, " hg"))
			code = 12; /* the worker's mapping did not ask (a kernel
				    * without THP has nothing to ask: thp "") */
		else if (gives && huge < (2u << 20) && vmstat("thp_file_fallback") == fallback)
			code = 13; /* asked, and the system gives them, but none,
				    * and not for want of a free 2 MiB (the kernel
				    * counts a fallback to small pages) */
		kva_worker_leave(w);
		kva_arena_close(b);
		_exit(code);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	{ /* the creator's own mapping asked too, and sees the worker's writes */
		struct kva_worker *w;
		uint32_t id;

		assert_int_equal(kva_worker_join(a, "creator", &w), 0);
		assert_int_equal(kva_alloc(w, 1, &id), 0);
		assert_true(mapping_of(kva_block_data(w, id), flags, sizeof(flags), &huge));
		assert_true(!thp[0] || strstr(flags, " hg"));
		kva_worker_leave(w);
	}
	kva_arena_close(a);
}

static void test_default_cache_scales_with_the_arena(void **state)
{
	struct kva_geometry g = tu_geometry();
	struct kva_arena_opts o = { .blocks = 64, .numa_node = -1 };
	struct kva_arena *a;

	(void)state;
	assert_int_equal(kva_arena_create(&g, &o, &a), 0);
	assert_int_equal(kva_arena_info(a)->cache_blocks, 0); /* too small to cache */
	assert_int_equal(kva_arena_info(a)->max_workers, KVA_MAX_WORKERS);
	kva_arena_close(a);
	o.blocks = 2048;
	assert_int_equal(kva_arena_create(&g, &o, &a), 0);
	assert_int_equal(kva_arena_info(a)->cache_blocks, 32);
	kva_arena_close(a);
	o.blocks = 1u << 20;
	o.max_workers = 8;
	assert_int_equal(kva_arena_create(&g, &o, &a), 0);
	assert_int_equal(kva_arena_info(a)->cache_blocks, 256);
	/* the allocator's own state stays within 16 bytes a block */
	assert_true(kva_arena_info(a)->alloc_meta_bytes <= 16ull * (1u << 20));
	kva_arena_close(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_block_major_f16_layout),
		cmocka_unit_test(test_block_major_int8_has_scales_inside_the_block),
		cmocka_unit_test(test_layer_major_pools),
		cmocka_unit_test(test_pages_are_aligned_even_for_odd_shapes),
		cmocka_unit_test(test_every_page_is_inside_and_disjoint),
		cmocka_unit_test(test_bad_fields_are_einval_and_named),
		cmocka_unit_test(test_overflow_is_eoverflow),
		cmocka_unit_test(test_dtype_names_round_trip),
		cmocka_unit_test(test_create_refuses_bad_options),
		cmocka_unit_test(test_create_binds_numa_node_zero_and_asks_for_huge_pages),
		cmocka_unit_test(test_data_asks_for_transparent_huge_pages_in_every_process),
		cmocka_unit_test(test_default_cache_scales_with_the_arena),
	};

	return cmocka_run_group_tests_name("arena_geometry", tests, NULL, NULL);
}
