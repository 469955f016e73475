/* SPDX-License-Identifier: MIT */
/*
 * test_alloc.c - the allocator's contract in one process: edge cases of
 * alloc, free and share, all-or-nothing, ownership errors, leave, reclaim
 * refusals, stats and the block map.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#define BLOCKS 1000u /* not a multiple of 64: the last hint word is partial */

struct fixture {
	struct kva_arena *a;
	struct kva_worker *w, *v;
};

static int setup_cached(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	f->a = tu_arena(BLOCKS, 32, 8);
	assert_non_null(f->a);
	assert_int_equal(kva_worker_join(f->a, "w", &f->w), 0);
	assert_int_equal(kva_worker_join(f->a, "v", &f->v), 0);
	*state = f;
	return 0;
}

static int setup_uncached(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	f->a = tu_arena(BLOCKS, KVA_CACHE_NONE, 8);
	assert_non_null(f->a);
	assert_int_equal(kva_worker_join(f->a, "w", &f->w), 0);
	assert_int_equal(kva_worker_join(f->a, "v", &f->v), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	struct kva_stats st;

	kva_worker_leave(f->w);
	kva_worker_leave(f->v);
	/* whatever a test did, leaving gives everything back */
	assert_int_equal(kva_arena_stats(f->a, &st), 0);
	assert_int_equal(st.free_blocks, BLOCKS);
	assert_int_equal(kva_arena_check(f->a, NULL), 0);
	kva_arena_close(f->a);
	free(f);
	return 0;
}

static uint32_t free_blocks(struct kva_arena *a)
{
	struct kva_stats st;

	assert_int_equal(kva_arena_stats(a, &st), 0);
	return st.free_blocks;
}

/* free, or idle in a worker's cache */
static uint32_t unheld_blocks(struct kva_arena *a)
{
	struct kva_stats st;

	assert_int_equal(kva_arena_stats(a, &st), 0);
	return st.free_blocks + st.cached_blocks;
}

static void test_alloc_zero_is_a_noop(void **state)
{
	struct fixture *f = *state;
	uint32_t id = 12345;

	assert_int_equal(kva_alloc(f->w, 0, &id), 0);
	assert_int_equal(id, 12345);
	assert_int_equal(kva_alloc(f->w, 0, NULL), 0);
	assert_int_equal(kva_free(f->w, NULL, 0), 0);
	assert_int_equal(kva_share(f->w, NULL, 0), 0);
	assert_int_equal(free_blocks(f->a), BLOCKS);
}

static void test_null_arguments_are_einval(void **state)
{
	struct fixture *f = *state;
	uint32_t id;

	assert_int_equal(kva_alloc(NULL, 1, &id), -EINVAL);
	assert_int_equal(kva_alloc(f->w, 1, NULL), -EINVAL);
	assert_int_equal(kva_free(NULL, &id, 1), -EINVAL);
	assert_int_equal(kva_free(f->w, NULL, 1), -EINVAL);
	assert_int_equal(kva_share(NULL, &id, 1), -EINVAL);
	assert_int_equal(kva_share(f->w, NULL, 1), -EINVAL);
	assert_int_equal(kva_stats(NULL, NULL), -EINVAL);
	assert_null(kva_block_data(NULL, 0));
	assert_null(kva_block_data(f->w, BLOCKS));
	assert_int_equal(kva_worker_join(NULL, "x", NULL), -EINVAL);
	kva_worker_leave(NULL);
}

static void test_alloc_all_then_one_more_is_enospc(void **state)
{
	struct fixture *f = *state;
	uint32_t *ids = malloc(BLOCKS * sizeof(*ids)), extra;
	uint8_t *seen = calloc(BLOCKS, 1);

	assert_int_equal(kva_alloc(f->w, BLOCKS, ids), 0);
	for (uint32_t k = 0; k < BLOCKS; k++) {
		assert_true(ids[k] < BLOCKS);
		assert_int_equal(seen[ids[k]]++, 0);
	}
	assert_int_equal(free_blocks(f->a), 0);
	assert_int_equal(kva_alloc(f->w, 1, &extra), -ENOSPC);
	assert_int_equal(kva_alloc(f->v, 1, &extra), -ENOSPC);
	assert_int_equal(kva_arena_check(f->a, NULL), 0);
	assert_int_equal(kva_free(f->w, ids, BLOCKS), 0);
	assert_int_equal(kva_arena_check(f->a, NULL), 0);
	free(ids);
	free(seen);
}

static void test_alloc_to_full_across_workers_loses_nothing(void **state)
{
	struct fixture *f = *state;
	uint32_t *ids = malloc(BLOCKS * sizeof(*ids)), n = 0, extra;
	uint8_t *by = malloc(BLOCKS);
	struct kva_worker *who[2] = { f->w, f->v };
	bool done[2] = { false, false };

	/* one block at a time, in turn, until both are refused: when the first
	 * is refused, the other may still have blocks in its cache, which it
	 * then uses; in the end every block was handed out exactly once */
	for (unsigned t = 0; !done[0] || !done[1]; t ^= 1) {
		int ret;

		if (done[t])
			continue;
		assert_true(n <= BLOCKS);
		ret = kva_alloc(who[t], 1, &ids[n < BLOCKS ? n : 0]);
		if (ret == -ENOSPC) {
			done[t] = true;
			continue;
		}
		assert_int_equal(ret, 0);
		by[n++] = (uint8_t)t;
	}
	assert_int_equal(n, BLOCKS);
	assert_int_equal(kva_alloc(f->w, 1, &extra), -ENOSPC);
	assert_int_equal(kva_arena_check(f->a, NULL), 0);
	for (uint32_t k = 0; k < BLOCKS; k++)
		assert_int_equal(kva_free(who[by[k]], &ids[k], 1), 0);
	free(ids);
	free(by);
}

/* LIFO: the blocks given back last are taken first, with or without a cache
 * (the cache is a stack; without one, the worker remembers what it freed) */
static void test_the_block_freed_last_is_taken_first(void **state)
{
	struct fixture *f = *state;
	uint32_t ids[3], got;

	for (unsigned k = 0; k < 3; k++)
		assert_int_equal(kva_alloc(f->w, 1, &ids[k]), 0);
	for (unsigned k = 0; k < 3; k++)
		assert_int_equal(kva_free(f->w, &ids[k], 1), 0);
	for (unsigned k = 3; k-- > 0;) {
		assert_int_equal(kva_alloc(f->w, 1, &got), 0);
		assert_int_equal(got, ids[k]);
	}
	/* the same when they go back in one call */
	assert_int_equal(kva_free(f->w, ids, 3), 0);
	for (unsigned k = 3; k-- > 0;) {
		assert_int_equal(kva_alloc(f->w, 1, &got), 0);
		assert_int_equal(got, ids[k]);
	}
	assert_int_equal(kva_free(f->w, ids, 3), 0);
}

/*
 * Without a cache, the blocks a worker freed are free to all: another worker
 * takes them, and the first, whose memory still names them, must find them
 * taken (one CAS), neither take them twice nor miss the blocks freed since.
 */
static void test_freed_blocks_another_took_are_not_taken_twice(void **state)
{
	struct fixture *f = *state;
	uint32_t *ids = malloc(BLOCKS * sizeof(*ids)), v_ids[4], got;

	assert_int_equal(kva_alloc(f->w, BLOCKS, ids), 0);
	for (unsigned k = 0; k < 4; k++)
		assert_int_equal(kva_free(f->w, &ids[k], 1), 0);
	for (unsigned k = 0; k < 4; k++)
		assert_int_equal(kva_alloc(f->v, 1, &v_ids[k]), 0);
	assert_int_equal(free_blocks(f->a), 0);
	/* w remembers the four; v holds them all */
	assert_int_equal(kva_alloc(f->w, 1, &got), -ENOSPC);
	for (unsigned k = 0; k < 4; k++)
		assert_int_equal(kva_free(f->w, &v_ids[k], 1), -EPERM);
	/* v gives two back: w finds them, though it forgot what it freed */
	assert_int_equal(kva_free(f->v, &v_ids[1], 1), 0);
	assert_int_equal(kva_free(f->v, &v_ids[3], 1), 0);
	assert_int_equal(kva_alloc(f->w, 1, &ids[0]), 0);
	assert_int_equal(kva_alloc(f->w, 1, &ids[1]), 0);
	assert_true((ids[0] == v_ids[1] && ids[1] == v_ids[3]) ||
		    (ids[0] == v_ids[3] && ids[1] == v_ids[1]));
	assert_int_equal(kva_alloc(f->w, 1, &got), -ENOSPC);
	assert_int_equal(kva_arena_check(f->a, NULL), 0);
	assert_int_equal(kva_free(f->v, &v_ids[0], 1), 0);
	assert_int_equal(kva_free(f->v, &v_ids[2], 1), 0);
	/* ids[2], ids[3] went to v and came back free: w holds the rest */
	assert_int_equal(kva_free(f->w, ids, 2), 0);
	assert_int_equal(kva_free(f->w, ids + 4, BLOCKS - 4), 0);
	free(ids);
}

static void test_alloc_capacity_plus_one_takes_nothing(void **state)
{
	struct fixture *f = *state;
	uint32_t *ids = malloc((BLOCKS + 1) * sizeof(*ids));

	assert_int_equal(kva_alloc(f->w, BLOCKS + 1, ids), -ENOSPC);
	assert_int_equal(free_blocks(f->a), BLOCKS);
	free(ids);
}

static void test_alloc_is_all_or_nothing(void **state)
{
	struct fixture *f = *state;
	uint32_t *ids = malloc(BLOCKS * sizeof(*ids)), more[10];

	/* the other worker holds all but 5 */
	assert_int_equal(kva_alloc(f->v, BLOCKS - 5, ids), 0);
	assert_int_equal(kva_alloc(f->w, 10, more), -ENOSPC);
	assert_int_equal(free_blocks(f->a), 5);
	assert_int_equal(kva_alloc(f->w, 5, more), 0);
	assert_int_equal(free_blocks(f->a), 0);
	assert_int_equal(kva_free(f->w, more, 5), 0);
	assert_int_equal(kva_free(f->v, ids, BLOCKS - 5), 0);
	free(ids);
}

static void test_free_twice_is_eperm(void **state)
{
	struct fixture *f = *state;
	uint32_t id, pair[2];

	assert_int_equal(kva_alloc(f->w, 1, &id), 0);
	assert_int_equal(kva_free(f->w, &id, 1), 0);
	assert_int_equal(kva_free(f->w, &id, 1), -EPERM);
	/* twice in one call: nothing is freed */
	assert_int_equal(kva_alloc(f->w, 1, &id), 0);
	pair[0] = pair[1] = id;
	assert_int_equal(kva_free(f->w, pair, 2), -EPERM);
	assert_int_equal(kva_free(f->w, &id, 1), 0);
}

static void test_free_of_a_never_allocated_block_is_eperm(void **state)
{
	struct fixture *f = *state;

	for (uint32_t id = 0; id < BLOCKS; id += 97)
		assert_int_equal(kva_free(f->w, &id, 1), -EPERM);
}

static void test_foreign_free_is_eperm(void **state)
{
	struct fixture *f = *state;
	uint32_t id;

	assert_int_equal(kva_alloc(f->w, 1, &id), 0);
	assert_int_equal(kva_free(f->v, &id, 1), -EPERM);
	assert_int_equal(kva_free(f->w, &id, 1), 0);
}

static void test_out_of_range_is_einval(void **state)
{
	struct fixture *f = *state;
	uint32_t bad[] = { BLOCKS, BLOCKS + 1, UINT32_MAX, 0x80000000u };

	for (unsigned k = 0; k < 4; k++) {
		assert_int_equal(kva_free(f->w, &bad[k], 1), -EINVAL);
		assert_int_equal(kva_share(f->w, &bad[k], 1), -EINVAL);
	}
}

static void test_free_is_all_or_nothing(void **state)
{
	struct fixture *f = *state;
	uint32_t ids[4], list[5], more[16], before;

	assert_int_equal(kva_alloc(f->w, 4, ids), 0);
	before = free_blocks(f->a);
	memcpy(list, ids, sizeof(ids));
	list[4] = BLOCKS + 7;
	assert_int_equal(kva_free(f->w, list, 5), -EINVAL);
	list[4] = ids[2]; /* a repeat of an exclusive block */
	assert_int_equal(kva_free(f->w, list, 5), -EPERM);
	assert_int_equal(free_blocks(f->a), before);
	/* the failed frees put nothing into the cache: what it hands out
	 * next is none of the blocks still held (the inline free writes ids
	 * above the cache's top as it checks them, and must not count them) */
	for (int k = 0; k < 16; k++) {
		assert_int_equal(kva_alloc(f->w, 1, &more[k]), 0);
		for (int j = 0; j < 4; j++)
			assert_int_not_equal(more[k], ids[j]);
	}
	assert_int_equal(kva_free(f->w, more, 16), 0);
	/* nothing was freed: each still frees, once */
	assert_int_equal(kva_free(f->w, ids, 4), 0);
	assert_int_equal(kva_free(f->w, ids, 1), -EPERM);
}

static void test_share_own_block_gives_two_references(void **state)
{
	struct fixture *f = *state;
	uint32_t id;
	struct kva_stats st;

	assert_int_equal(kva_alloc(f->w, 1, &id), 0);
	assert_int_equal(kva_share(f->w, &id, 1), 0);
	assert_int_equal(kva_arena_stats(f->a, &st), 0);
	assert_int_equal(st.shared_blocks, 1);
	assert_int_equal(st.shared_refs, 1); /* one holder, with two references */
	assert_int_equal(kva_free(f->w, &id, 1), 0);
	assert_int_equal(kva_arena_stats(f->a, &st), 0);
	assert_int_equal(st.shared_blocks, 1);
	assert_int_equal(kva_free(f->w, &id, 1), 0);
	assert_int_equal(kva_free(f->w, &id, 1), -EPERM);
	assert_int_equal(unheld_blocks(f->a), BLOCKS);
}

static void test_share_across_workers_keeps_block_until_last_holder(void **state)
{
	struct fixture *f = *state;
	uint32_t id, twice[2];
	struct kva_stats st;

	assert_int_equal(kva_alloc(f->w, 1, &id), 0);
	memset(kva_block_data(f->w, id), 0x5a, 64);
	/* exclusive: nobody else may reference it yet */
	assert_int_equal(kva_share(f->v, &id, 1), -EPERM);
	assert_int_equal(kva_share(f->w, &id, 1), 0);
	twice[0] = twice[1] = id;
	assert_int_equal(kva_share(f->v, twice, 2), 0); /* v: two references */
	assert_int_equal(kva_arena_stats(f->a, &st), 0);
	assert_int_equal(st.shared_refs, 2);
	assert_int_equal(st.slots[kva_worker_slot(f->v)].shared, 1);
	assert_int_equal(kva_free(f->w, twice, 2), 0); /* w is done */
	assert_int_equal(kva_free(f->w, &id, 1), -EPERM);
	assert_int_equal(((uint8_t *)kva_block_data(f->v, id))[63], 0x5a);
	assert_int_equal(kva_free(f->v, &id, 1), 0);
	assert_int_equal(unheld_blocks(f->a), BLOCKS - 1);
	assert_int_equal(kva_free(f->v, &id, 1), 0);
	assert_int_equal(kva_arena_check(f->a, NULL), 0);
}

static void test_share_of_free_or_cached_block_is_eperm(void **state)
{
	struct fixture *f = *state;
	uint32_t id;

	assert_int_equal(kva_alloc(f->w, 1, &id), 0);
	assert_int_equal(kva_free(f->w, &id, 1), 0); /* now in w's cache, or free */
	assert_int_equal(kva_share(f->w, &id, 1), -EPERM);
	assert_int_equal(kva_share(f->v, &id, 1), -EPERM);
	for (uint32_t k = 0; k < BLOCKS; k += 101)
		if (k != id)
			assert_int_equal(kva_share(f->v, &k, 1), -EPERM);
}

static void test_share_is_all_or_nothing(void **state)
{
	struct fixture *f = *state;
	uint32_t ids[3], list[4];
	struct kva_stats st;

	assert_int_equal(kva_alloc(f->w, 3, ids), 0);
	assert_int_equal(kva_share(f->w, &ids[0], 1), 0); /* ids[0]: shared, 2 refs */
	list[0] = ids[0];           /* +1 on a shared block */
	list[1] = ids[1];           /* exclusive -> shared */
	list[2] = ids[1];           /* and once more */
	list[3] = BLOCKS;           /* fails */
	assert_int_equal(kva_share(f->w, list, 4), -EINVAL);
	assert_int_equal(kva_arena_stats(f->a, &st), 0);
	assert_int_equal(st.shared_blocks, 1);       /* ids[1] back to exclusive */
	/* exactly the references from before: 2 on ids[0], 1 on ids[1] and [2] */
	assert_int_equal(kva_free(f->w, ids, 3), 0);
	assert_int_equal(kva_free(f->w, &ids[0], 1), 0);
	assert_int_equal(kva_free(f->w, &ids[0], 1), -EPERM);
	assert_int_equal(kva_free(f->w, &ids[1], 1), -EPERM);
	/* a failure in the middle after joining someone else's block */
	assert_int_equal(kva_alloc(f->w, 1, ids), 0);
	assert_int_equal(kva_share(f->w, ids, 1), 0);
	list[0] = ids[0];
	list[1] = BLOCKS + 1;
	assert_int_equal(kva_share(f->v, list, 2), -EINVAL);
	assert_int_equal(kva_arena_stats(f->a, &st), 0);
	assert_int_equal(st.shared_refs, 1);
	assert_int_equal(kva_free(f->v, ids, 1), -EPERM);
	assert_int_equal(kva_free(f->w, list, 1), 0);
	assert_int_equal(kva_free(f->w, list, 1), 0);
}

static void test_leave_returns_cache_blocks_and_references(void **state)
{
	struct fixture *f = *state;
	struct kva_worker *x;
	uint32_t ids[40], shared;
	struct kva_stats st;

	assert_int_equal(kva_worker_join(f->a, "x", &x), 0);
	assert_int_equal(kva_alloc(x, 40, ids), 0);
	assert_int_equal(kva_free(x, ids, 10), 0);   /* some into its cache */
	assert_int_equal(kva_alloc(f->w, 1, &shared), 0);
	assert_int_equal(kva_share(f->w, &shared, 1), 0);
	assert_int_equal(kva_share(x, &shared, 1), 0);
	assert_int_equal(kva_share(x, &ids[20], 1), 0); /* its own, made shared */
	kva_worker_leave(x);
	assert_int_equal(kva_arena_stats(f->a, &st), 0);
	assert_int_equal(st.free_blocks + st.cached_blocks, BLOCKS - 1);
	assert_int_equal(st.shared_refs, 1);
	assert_int_equal(kva_arena_check(f->a, NULL), 0);
	assert_int_equal(kva_free(f->w, &shared, 1), 0);
	assert_int_equal(kva_free(f->w, &shared, 1), 0);
}

static void test_join_beyond_max_workers_is_eusers(void **state)
{
	struct fixture *f = *state;
	struct kva_worker *more[8];
	unsigned n = 0;
	int ret;

	while ((ret = kva_worker_join(f->a, "more", &more[n])) == 0)
		n++;
	assert_int_equal(ret, -EUSERS);
	assert_int_equal(n, 6); /* 8 slots, two taken by the fixture */
	kva_worker_leave(more[0]);
	assert_int_equal(kva_worker_join(f->a, "again", &more[0]), 0);
	while (n--)
		kva_worker_leave(more[n]);
}

static void test_reclaim_refuses_live_free_and_missing_slots(void **state)
{
	struct fixture *f = *state;
	struct kva_reclaim_report r;

	assert_int_equal(kva_arena_reclaim(f->a, (uint32_t)kva_worker_slot(f->w), &r), -EBUSY);
	assert_int_equal(kva_arena_reclaim(f->a, 7, &r), -ENOENT);
	assert_int_equal(kva_arena_reclaim(f->a, 8, &r), -EINVAL);
	assert_int_equal(kva_arena_reclaim(f->a, 1000, &r), -EINVAL);
	assert_int_equal(kva_arena_reclaim(NULL, 0, &r), -EINVAL);
}

static void test_stale_handle_after_reclaim_is_estale(void **state)
{
	struct fixture *f = *state;
	struct kva_reclaim_report r;
	struct kva_stats st;
	int go[2], result[2], status, ok = 0;
	uint32_t slot = KVA_MAX_WORKERS;
	pid_t child;

	/* A child joins and forks a grandchild that inherits the handle; the
	 * child exits, its slot is reclaimed, and the grandchild's handle must
	 * then refuse to touch shared memory. */
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(result), 0);
	child = tu_fork();
	if (child == 0) {
		struct kva_worker *x;
		uint32_t ids[8];

		if (kva_worker_join(f->a, "parent-of-stale", &x) || kva_alloc(x, 8, ids))
			_exit(1);
		/* plain fork: this grandchild must outlive its parent */
		if (fork() == 0) {
			char c;

			if (read(go[0], &c, 1) != 1)
				_exit(2);
			ok = kva_alloc(x, 100, ids) == -ESTALE && kva_share(x, ids, 1) == -ESTALE;
			_exit(write(result[1], &ok, sizeof(ok)) == sizeof(ok) ? 0 : 3);
		}
		_exit(0);
	}
	assert_int_equal(waitpid(child, &status, 0), child);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	kva_arena_stats(f->a, &st);
	for (uint32_t s = 0; s < st.max_workers; s++)
		if (!strcmp(st.slots[s].name, "parent-of-stale"))
			slot = s;
	assert_true(slot < KVA_MAX_WORKERS);
	assert_int_equal(kva_arena_reclaim(f->a, slot, &r), 0);
	assert_int_equal(r.pid, child);
	assert_int_equal(r.owned_freed, 8 + st.slots[slot].cached);
	assert_int_equal(write(go[1], "g", 1), 1);
	assert_int_equal(read(result[0], &ok, sizeof(ok)), sizeof(ok));
	assert_int_equal(ok, 1);
	close(go[0]);
	close(go[1]);
	close(result[0]);
	close(result[1]);
}

static void test_block_data_is_the_same_memory_in_another_mapping(void **state)
{
	struct fixture *f = *state;
	struct kva_arena *b;
	struct kva_worker *y;
	uint32_t id;
	void *k, *v, *k2, *v2;
	const struct kva_arena_info *info = kva_arena_info(f->a);

	assert_int_equal(kva_arena_open(kva_arena_meta_fd(f->a), kva_arena_data_fd(f->a), &b), 0);
	assert_int_equal(kva_worker_join(b, "y", &y), 0);
	assert_int_equal(kva_alloc(f->w, 1, &id), 0);
	assert_ptr_not_equal(kva_block_data(f->w, id), kva_block_data(y, id));
	memset(kva_block_data(f->w, id), 0xab, info->layout.block_bytes);
	assert_int_equal(kva_block_kv(y, id, 1, &k, &v), 0);
	assert_int_equal(((uint8_t *)v)[info->layout.page_bytes - 1], 0xab);
	assert_int_equal(kva_block_kv(f->w, id, 1, &k2, &v2), 0);
	assert_int_equal((uint8_t *)v2 - (uint8_t *)k2, (long)info->layout.page_bytes);
	assert_int_equal(kva_block_kv(y, id, 2, &k, &v), -EINVAL);
	assert_int_equal(kva_block_kv(y, BLOCKS, 0, &k, &v), -EINVAL);
	/* the two handles see one arena */
	assert_int_equal(free_blocks(b), free_blocks(f->a));
	assert_int_equal(kva_free(f->w, &id, 1), 0);
	kva_worker_leave(y);
	kva_arena_close(b);
}

static void test_set_cache_moves_blocks_back(void **state)
{
	struct fixture *f = *state;
	uint32_t ids[64];
	struct kva_stats st;

	assert_int_equal(kva_worker_set_cache(f->w, 64), 0);
	assert_int_equal(kva_alloc(f->w, 64, ids), 0);
	assert_int_equal(kva_free(f->w, ids, 64), 0);
	assert_int_equal(kva_stats(f->w, &st), 0);
	assert_true(st.slots[kva_worker_slot(f->w)].cached > 0);
	assert_int_equal(kva_worker_set_cache(f->w, 0), 0);
	assert_int_equal(kva_stats(f->w, &st), 0);
	assert_int_equal(st.slots[kva_worker_slot(f->w)].cached, 0);
	assert_int_equal(st.free_blocks, BLOCKS);
	assert_int_equal(kva_worker_set_cache(f->w, 1u << 20), -EINVAL);
	assert_int_equal(kva_alloc(f->w, 3, ids), 0);
	assert_int_equal(kva_free(f->w, ids, 3), 0);
	assert_int_equal(free_blocks(f->a), BLOCKS);
}

static void test_stats_and_map_show_owners(void **state)
{
	struct fixture *f = *state;
	uint32_t ids[10], shared;
	struct kva_stats st;
	char map[BLOCKS + 1], small[11];
	int w = kva_worker_slot(f->w), v = kva_worker_slot(f->v);
	uint32_t count_w = 0, count_hash = 0;

	assert_int_equal(kva_alloc(f->w, 10, ids), 0);
	assert_int_equal(kva_alloc(f->v, 1, &shared), 0);
	assert_int_equal(kva_share(f->v, &shared, 1), 0);
	assert_int_equal(kva_share(f->w, &shared, 1), 0);
	assert_int_equal(kva_stats(f->w, &st), 0);
	assert_int_equal(st.total_blocks, BLOCKS);
	assert_int_equal(st.shared_blocks, 1);
	assert_int_equal(st.shared_refs, 2);
	assert_int_equal(st.used_blocks, st.owned_blocks + st.shared_blocks);
	assert_int_equal(st.free_blocks + st.used_blocks, BLOCKS);
	assert_int_equal(st.workers, 2);
	assert_string_equal(st.slots[w].name, "w");
	assert_int_equal(st.slots[w].pid, getpid());
	assert_int_equal(st.slots[w].owned, 10 + st.slots[w].cached);
	assert_int_equal(st.slots[v].shared, 1);

	assert_int_equal(kva_arena_map(f->a, map, sizeof(map), BLOCKS), BLOCKS);
	for (uint32_t k = 0; k < BLOCKS; k++) {
		count_w += map[k] == kva_slot_char((uint32_t)w);
		count_hash += map[k] == '#';
	}
	assert_int_equal(count_w, st.slots[w].owned);
	assert_int_equal(count_hash, 1);
	assert_int_equal(map[shared], '#');
	assert_int_equal(map[ids[3]], kva_slot_char((uint32_t)w));
	assert_int_equal(kva_arena_map(f->a, small, sizeof(small), 10), 10);
	assert_int_equal(strlen(small), 10);
	assert_int_equal(kva_arena_map(f->a, small, 10, 10), -EINVAL);
	assert_int_equal(kva_slot_char(0), '0');
	assert_int_equal(kva_slot_char(47), 'L');
	assert_int_equal(kva_slot_char(48), '?');

	assert_int_equal(kva_free(f->w, ids, 10), 0);
	assert_int_equal(kva_free(f->w, &shared, 1), 0);
	assert_int_equal(kva_free(f->v, &shared, 1), 0);
	assert_int_equal(kva_free(f->v, &shared, 1), 0);
}

static void test_every_slot_can_hold_one_shared_block(void **state)
{
	struct kva_arena *a = tu_arena(256, 0, KVA_MAX_WORKERS);
	struct kva_worker *w[KVA_MAX_WORKERS];
	struct kva_stats st;
	uint32_t id;
	char map[257];
	FILE *f;
	char *text = NULL;
	size_t len = 0;

	(void)state;
	assert_non_null(a);
	for (unsigned k = 0; k < KVA_MAX_WORKERS; k++)
		assert_int_equal(kva_worker_join(a, "many", &w[k]), 0);
	assert_int_equal(kva_worker_slot(w[KVA_MAX_WORKERS - 1]), KVA_MAX_WORKERS - 1);
	assert_int_equal(kva_alloc(w[0], 1, &id), 0);
	assert_int_equal(kva_share(w[0], &id, 1), 0);
	for (unsigned k = 1; k < KVA_MAX_WORKERS; k++)
		assert_int_equal(kva_share(w[k], &id, 1), 0);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.shared_refs, KVA_MAX_WORKERS);
	assert_int_equal(kva_arena_map(a, map, sizeof(map), 256), 256);
	assert_int_equal(map[id], '#');
	f = open_memstream(&text, &len);
	assert_int_equal(kva_arena_map_print(a, f, 32, 0), 0);
	fclose(f);
	assert_non_null(strstr(text, "legend"));
	assert_non_null(strstr(text, "L many")); /* slot 47's character */
	free(text);
	for (unsigned k = 0; k < KVA_MAX_WORKERS; k++)
		kva_worker_leave(w[k]); /* w[0] holds two references: both go */
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.free_blocks, 256);
	assert_int_equal(kva_arena_check(a, NULL), 0);
	kva_arena_close(a);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup_cached, teardown), \
	      cmocka_unit_test_setup_teardown(fn, setup_uncached, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_alloc_zero_is_a_noop),
		T(test_null_arguments_are_einval),
		T(test_alloc_all_then_one_more_is_enospc),
		T(test_alloc_to_full_across_workers_loses_nothing),
		T(test_the_block_freed_last_is_taken_first),
		cmocka_unit_test_setup_teardown(test_freed_blocks_another_took_are_not_taken_twice,
						setup_uncached, teardown),
		T(test_alloc_capacity_plus_one_takes_nothing),
		T(test_alloc_is_all_or_nothing),
		T(test_free_twice_is_eperm),
		T(test_free_of_a_never_allocated_block_is_eperm),
		T(test_foreign_free_is_eperm),
		T(test_out_of_range_is_einval),
		T(test_free_is_all_or_nothing),
		T(test_share_own_block_gives_two_references),
		T(test_share_across_workers_keeps_block_until_last_holder),
		T(test_share_of_free_or_cached_block_is_eperm),
		T(test_share_is_all_or_nothing),
		T(test_leave_returns_cache_blocks_and_references),
		T(test_join_beyond_max_workers_is_eusers),
		T(test_reclaim_refuses_live_free_and_missing_slots),
		T(test_stale_handle_after_reclaim_is_estale),
		T(test_block_data_is_the_same_memory_in_another_mapping),
		T(test_set_cache_moves_blocks_back),
		T(test_stats_and_map_show_owners),
		cmocka_unit_test(test_every_slot_can_hold_one_shared_block),
	};

	return cmocka_run_group_tests_name("arena_alloc", tests, NULL, NULL);
}
