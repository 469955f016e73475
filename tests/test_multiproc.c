/* SPDX-License-Identifier: MIT */
/*
 * test_multiproc.c - many processes, each mapping the arena at its own
 * address, doing random alloc / share / free on the same blocks; afterwards
 * every worker's own account of what it holds must equal the descriptors,
 * block for block, and the data under every reference must be unchanged.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#define PROCS 6

struct run {
	uint32_t blocks, cache, steps, max_refs;
};

/* @go_fd[p]: the pipe that starts phase p. One per phase: with a single one, a
 * child done with phase 0 could take a start byte meant for a child that has
 * not read its own yet, which then waits for good (and so does the parent). */
static int child(struct kva_arena *parent, const struct run *r, struct tu_board *board,
		 struct tu_view *view, int ready_fd, const int go_fd[2], unsigned n)
{
	struct kva_arena *a;
	struct kva_worker *w;
	struct tu_work t;
	char c;

	/* a mapping of our own, at an address of our own */
	if (kva_arena_open(kva_arena_meta_fd(parent), kva_arena_data_fd(parent), &a) ||
	    kva_worker_join(a, "proc", &w))
		return 1;
	if (kva_block_data(w, 0) == NULL)
		return 2;
	/* a mix of cache sizes: the arena's default, none, and a tiny one */
	if (n % 3 && kva_worker_set_cache(w, n % 3 == 1 ? 0 : 3))
		return 3;
	tu_work_init(&t, w, board, r->max_refs, 1000 + n);
	/* everyone joined before anyone starts: the runs overlap */
	if (write(ready_fd, "j", 1) != 1 || read(go_fd[0], &c, 1) != 1)
		return 4;
	for (uint32_t s = 0; s < r->steps; s++)
		tu_work_step(&t);
	atomic_fetch_add(&board->ops, t.ops);
	tu_view_capture(w, view);
	if (write(ready_fd, "r", 1) != 1 || read(go_fd[1], &c, 1) != 1)
		return 4;
	tu_work_drain(&t);
	tu_work_fini(&t);
	kva_worker_leave(w);
	kva_arena_close(a);
	return 0;
}

static void run(const struct run *r)
{
	struct kva_arena *a = tu_arena(r->blocks, r->cache, 8);
	struct tu_board *board = tu_shared_alloc(sizeof(*board));
	size_t vb = tu_view_bytes(r->blocks);
	uint8_t *views = tu_shared_alloc(vb * PROCS);
	struct tu_view *vp[PROCS];
	struct tu_mismatch m;
	struct kva_stats st;
	struct kva_check_report cr;
	int ready[2], go[2][2], go_read[2], status;
	pid_t pids[PROCS];
	char c;

	assert_non_null(a);
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go[0]), 0);
	assert_int_equal(pipe(go[1]), 0);
	go_read[0] = go[0][0];
	go_read[1] = go[1][0];
	for (unsigned n = 0; n < PROCS; n++) {
		vp[n] = (struct tu_view *)(views + n * vb);
		vp[n]->slot = -1;
		pids[n] = tu_fork();
		assert_true(pids[n] >= 0);
		if (pids[n] == 0) {
			int ret = child(a, r, board, vp[n], ready[1], go_read, n);

			/* a child that failed early still answers, so nobody waits */
			if (ret && ret < 4 && write(ready[1], "e", 1) != 1)
				ret = 5;
			_exit(ret);
		}
	}
	for (int phase = 0; phase < 2; phase++) {
		for (unsigned n = 0; n < PROCS; n++) {
			assert_int_equal(read(ready[0], &c, 1), 1);
			if (c == 'e') {
				for (unsigned k = 0; k < PROCS; k++)
					kill(pids[k], SIGKILL);
				fail_msg("a worker process failed to start");
			}
		}
		if (phase == 0) /* all joined: start */
			for (unsigned n = 0; n < PROCS; n++)
				assert_int_equal(write(go[0][1], "g", 1), 1);
	}

	/* all stopped between calls: the views are the whole truth */
	assert_true(tu_views_match(a, vp, PROCS, &m));
	assert_int_equal(kva_arena_check(a, &cr), 0);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_true(st.used_blocks > 0);
	fprintf(stderr, "  %u blocks, %llu ops, %llu references taken across workers; at the "
		"end %u owned, %u shared (%u holders), %u free\n", r->blocks,
		(unsigned long long)atomic_load(&board->ops),
		(unsigned long long)atomic_load(&board->cross_shares), st.owned_blocks,
		st.shared_blocks, st.shared_refs, st.free_blocks);
	assert_true(atomic_load(&board->cross_shares) > 0);

	for (unsigned n = 0; n < PROCS; n++)
		assert_int_equal(write(go[1][1], "g", 1), 1);
	for (unsigned n = 0; n < PROCS; n++) {
		assert_int_equal(waitpid(pids[n], &status, 0), pids[n]);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	assert_int_equal(atomic_load(&board->errors), 0);
	assert_int_equal(atomic_load(&board->unexpected), 0);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.free_blocks, r->blocks);
	assert_int_equal(st.workers, 0);
	assert_int_equal(kva_arena_check(a, NULL), 0);
	close(ready[0]);
	close(ready[1]);
	for (int p = 0; p < 2; p++) {
		close(go[p][0]);
		close(go[p][1]);
	}
	tu_shared_free(views, vb * PROCS);
	tu_shared_free(board, sizeof(*board));
	kva_arena_close(a);
}

static void test_processes_sharing_an_ample_arena(void **state)
{
	struct run r = { .blocks = 4096, .cache = 32, .steps = 200000, .max_refs = 64 };

	(void)state;
	run(&r);
}

static void test_processes_fighting_over_a_full_arena(void **state)
{
	/* 6 x 64 references want more than 200 blocks: alloc fails often and
	 * the pressure path (no caching while full) runs all the time */
	struct run r = { .blocks = 200, .cache = 16, .steps = 200000, .max_refs = 64 };

	(void)state;
	run(&r);
}

static void test_processes_without_caches(void **state)
{
	struct run r = { .blocks = 1000, .cache = KVA_CACHE_NONE, .steps = 200000, .max_refs = 48 };

	(void)state;
	run(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_processes_sharing_an_ample_arena),
		cmocka_unit_test(test_processes_fighting_over_a_full_arena),
		cmocka_unit_test(test_processes_without_caches),
	};

	return cmocka_run_group_tests_name("arena_multiproc", tests, NULL, NULL);
}
