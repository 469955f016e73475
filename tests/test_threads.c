/* SPDX-License-Identifier: MIT */
/*
 * test_threads.c - the multi-worker workload in threads of one process, so
 * that ThreadSanitizer sees every access: each block's data is written by
 * one worker and read by others, and only the allocator's acquire/release
 * pairs order them. Under TSan a missing or misplaced barrier is a report.
 * Afterwards the workers' views must equal the descriptors exactly.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"

#define THREADS 4

struct shared {
	struct kva_arena *a;
	struct tu_board board;
	pthread_barrier_t start, stopped, go;
	struct tu_view *views[THREADS];
	uint32_t steps;
};

struct thread {
	struct shared *sh;
	unsigned n;
	int err;
};

static void *run(void *arg)
{
	struct thread *t = arg;
	struct shared *sh = t->sh;
	static const uint32_t caches[THREADS] = { KVA_CACHE_NONE, 0, 3, 64 };
	struct kva_worker *w;
	struct tu_work work;

	if ((t->err = kva_worker_join(sh->a, "thread", &w)))
		return NULL;
	if (caches[t->n] != 0)
		kva_worker_set_cache(w, caches[t->n] == KVA_CACHE_NONE ? 0 : caches[t->n]);
	tu_work_init(&work, w, &sh->board, 48, 31 + t->n);
	pthread_barrier_wait(&sh->start);
	for (uint32_t s = 0; s < sh->steps; s++)
		tu_work_step(&work);
	tu_view_capture(w, sh->views[t->n]);
	pthread_barrier_wait(&sh->stopped);
	pthread_barrier_wait(&sh->go);
	tu_work_drain(&work);
	tu_work_fini(&work);
	kva_worker_leave(w);
	return NULL;
}

static void workload(uint32_t blocks, uint32_t steps)
{
	struct shared sh = { .steps = steps };
	struct thread t[THREADS];
	pthread_t tid[THREADS];
	struct tu_mismatch m;
	struct kva_stats st;

	sh.a = tu_arena(blocks, 16, 8);
	assert_non_null(sh.a);
	pthread_barrier_init(&sh.start, NULL, THREADS);
	pthread_barrier_init(&sh.stopped, NULL, THREADS + 1);
	pthread_barrier_init(&sh.go, NULL, THREADS + 1);
	for (unsigned n = 0; n < THREADS; n++) {
		sh.views[n] = calloc(1, tu_view_bytes(blocks));
		sh.views[n]->slot = -1;
		t[n] = (struct thread){ .sh = &sh, .n = n };
		assert_int_equal(pthread_create(&tid[n], NULL, run, &t[n]), 0);
	}
	pthread_barrier_wait(&sh.stopped);
	assert_true(tu_views_match(sh.a, sh.views, THREADS, &m));
	assert_int_equal(kva_arena_check(sh.a, NULL), 0);
	pthread_barrier_wait(&sh.go);
	for (unsigned n = 0; n < THREADS; n++) {
		assert_int_equal(pthread_join(tid[n], NULL), 0);
		assert_int_equal(t[n].err, 0);
		free(sh.views[n]);
	}
	fprintf(stderr, "  %u blocks: %llu references taken from the board\n", blocks,
		(unsigned long long)atomic_load(&sh.board.cross_shares));
	assert_int_equal(atomic_load(&sh.board.errors), 0);
	assert_int_equal(atomic_load(&sh.board.unexpected), 0);
	assert_true(atomic_load(&sh.board.cross_shares) > 0);
	assert_int_equal(kva_arena_stats(sh.a, &st), 0);
	assert_int_equal(st.free_blocks, blocks);
	assert_int_equal(kva_arena_check(sh.a, NULL), 0);
	pthread_barrier_destroy(&sh.start);
	pthread_barrier_destroy(&sh.stopped);
	pthread_barrier_destroy(&sh.go);
	kva_arena_close(sh.a);
}

static void test_threads_share_an_ample_arena(void **state)
{
	(void)state;
	workload(2048, 60000);
}

static void test_threads_fight_over_a_full_arena(void **state)
{
	(void)state;
	workload(150, 60000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_share_an_ample_arena),
		cmocka_unit_test(test_threads_fight_over_a_full_arena),
	};

	return cmocka_run_group_tests_name("arena_threads", tests, NULL, NULL);
}
