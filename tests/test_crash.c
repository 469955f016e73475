/* SPDX-License-Identifier: MIT */
/*
 * test_crash.c - workers SIGKILLed at random moments of alloc, free and
 * share; each dead slot reclaimed by a surviving worker while the others go
 * on. At the end the survivors' own accounts must equal the descriptors
 * exactly (0 leaked, 0 double-owned, holder sets exact), no data may have
 * changed under a reference, and once everyone leaves every block is free.
 *
 * KVA_TEST_KILLS sets the number of kills (default 600).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#define WORKERS 5
#define BLOCKS 1024u

/* One per worker process, in shared memory. */
struct cell {
	_Atomic uint32_t joined;
	_Atomic uint32_t phase;        /* enum tu_phase, written by the worker */
	_Atomic int32_t reclaim_slot;  /* parent -> worker: slot + 1 to reclaim */
	_Atomic int32_t reclaim_rc;    /* worker -> parent */
	_Atomic uint32_t reclaim_done; /* bumped when reclaim_rc is valid */
	struct kva_reclaim_report report;
	_Atomic uint32_t stop;         /* parent -> worker: capture the view, wait */
	_Atomic uint32_t stopped;
};

struct shared {
	struct tu_board board;
	struct cell cells[WORKERS];
};

static void worker(struct kva_arena *a, struct shared *sh, struct cell *c, struct tu_view *view,
		   uint64_t seed, int go_fd)
{
	struct kva_worker *w;
	struct tu_work t;
	static const uint32_t caches[] = { 0, 2, 8, 32 };
	char ch;

	if (kva_worker_join(a, "crashy", &w) ||
	    kva_worker_set_cache(w, caches[seed % 4]))
		_exit(1);
	atomic_store_explicit(&c->joined, 1, memory_order_release);
	tu_work_init(&t, w, &sh->board, 40, seed);
	t.phase = &c->phase;
	while (!atomic_load_explicit(&c->stop, memory_order_acquire)) {
		int32_t slot = atomic_load_explicit(&c->reclaim_slot, memory_order_acquire);

		if (slot) {
			atomic_store(&c->phase, TU_RECLAIM);
			atomic_store(&c->reclaim_rc, kva_arena_reclaim(a, (uint32_t)slot - 1,
								       &c->report));
			atomic_store(&c->phase, TU_IDLE);
			atomic_store(&c->reclaim_slot, 0);
			atomic_fetch_add_explicit(&c->reclaim_done, 1, memory_order_release);
		}
		tu_work_step(&t);
	}
	tu_view_capture(w, view);
	atomic_store_explicit(&c->stopped, 1, memory_order_release);
	if (read(go_fd, &ch, 1) != 1)
		_exit(2);
	tu_work_drain(&t);
	tu_work_fini(&t);
	kva_worker_leave(w);
	_exit(0);
}

static void sleep_us(long us)
{
	struct timespec ts = { 0, us * 1000 };

	nanosleep(&ts, NULL);
}

static void test_sigkill_at_random_moments_loses_nothing(void **state)
{
	struct kva_arena *a = tu_arena(BLOCKS, 16, 8);
	struct shared *sh = tu_shared_alloc(sizeof(*sh));
	size_t vb = tu_view_bytes(BLOCKS);
	uint8_t *views = tu_shared_alloc(vb * WORKERS);
	struct tu_view *vp[WORKERS];
	struct tu_mismatch m;
	struct kva_check_report cr;
	struct kva_stats st;
	const char *env = getenv("KVA_TEST_KILLS");
	unsigned target = env ? (unsigned)atoi(env) : 600, kills = 0, before_join = 0;
	unsigned phase_hist[TU_NPHASE] = { 0 };
	uint64_t owned = 0, refs = 0, last = 0, repaired = 0, rng = 99, seed = 1;
	int go[2], status;
	pid_t pids[WORKERS];

	(void)state;
	assert_non_null(a);
	assert_int_equal(pipe(go), 0);
	for (unsigned n = 0; n < WORKERS; n++) {
		vp[n] = (struct tu_view *)(views + n * vb);
		vp[n]->slot = -1;
	}

	/* start (and later restart) one worker process per cell */
#define SPAWN(n)                                                                             \
	do {                                                                                 \
		memset(&sh->cells[n], 0, sizeof(sh->cells[n]));                              \
		pids[n] = tu_fork();                                                            \
		assert_true(pids[n] >= 0);                                                   \
		if (pids[n] == 0)                                                            \
			worker(a, sh, &sh->cells[n], vp[n], seed, go[0]);                    \
		seed++;                                                                      \
	} while (0)
	for (unsigned n = 0; n < WORKERS; n++)
		SPAWN(n);

	while (kills < target) {
		unsigned victim = (unsigned)(tu_rand(&rng) % WORKERS), rescuer;
		int slot;
		uint32_t done;

		sleep_us((long)(tu_rand(&rng) % 1500));
		phase_hist[atomic_load(&sh->cells[victim].phase)]++;
		kill(pids[victim], SIGKILL);
		assert_int_equal(waitpid(pids[victim], &status, 0), pids[victim]);
		assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
		kills++;

		slot = tu_slot_of(a, pids[victim]);
		if (slot < 0) {
			before_join++; /* killed before it took a slot: nothing to take back */
		} else {
			/* a survivor reclaims it, between two of its own calls */
			rescuer = (victim + 1 + (unsigned)(tu_rand(&rng) % (WORKERS - 1))) % WORKERS;
			done = atomic_load(&sh->cells[rescuer].reclaim_done);
			atomic_store(&sh->cells[rescuer].reclaim_slot, slot + 1);
			while (atomic_load_explicit(&sh->cells[rescuer].reclaim_done,
						    memory_order_acquire) == done) {
				if (waitpid(pids[rescuer], &status, WNOHANG) == pids[rescuer])
					fail_msg("the rescuer died: status %#x", status);
				sleep_us(20);
			}
			if (atomic_load(&sh->cells[rescuer].reclaim_rc) != 0)
				fail_msg("reclaim of slot %d by a survivor: %d", slot,
					 atomic_load(&sh->cells[rescuer].reclaim_rc));
			owned += sh->cells[rescuer].report.owned_freed;
			refs += sh->cells[rescuer].report.shared_dropped;
			last += sh->cells[rescuer].report.shared_freed;
			repaired += sh->cells[rescuer].report.hints_repaired;
			assert_int_equal(sh->cells[rescuer].report.pid, pids[victim]);
			assert_int_equal(tu_slot_of(a, pids[victim]), -1);
		}
		/* Invariants that hold even while the others run, once nobody
		 * is half-way through joining (a join after the check read the
		 * slot table would look like a stale owner). */
		for (unsigned n = 0; n < WORKERS; n++)
			while (n != victim && !atomic_load_explicit(&sh->cells[n].joined,
								    memory_order_acquire))
				sleep_us(20);
		kva_arena_check(a, &cr);
		if (cr.bad_descriptors || cr.stale_owners || cr.dead_holders)
			fail_msg("after kill %u: %s", kills, kva_errmsg());
		SPAWN(victim);
	}

	/* stop everyone between two calls and compare, block for block */
	for (unsigned n = 0; n < WORKERS; n++)
		atomic_store(&sh->cells[n].stop, 1);
	for (unsigned n = 0; n < WORKERS; n++)
		while (!atomic_load_explicit(&sh->cells[n].stopped, memory_order_acquire))
			sleep_us(100);
	assert_true(tu_views_match(a, vp, WORKERS, &m));
	assert_int_equal(kva_arena_check(a, &cr), 0);
	assert_int_equal(cr.dead_slots, 0);

	for (unsigned n = 0; n < WORKERS; n++)
		assert_int_equal(write(go[1], "g", 1), 1);
	for (unsigned n = 0; n < WORKERS; n++) {
		assert_int_equal(waitpid(pids[n], &status, 0), pids[n]);
		assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	assert_int_equal(atomic_load(&sh->board.errors), 0);
	assert_int_equal(atomic_load(&sh->board.unexpected), 0);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.free_blocks, BLOCKS);
	assert_int_equal(st.workers, 0);
	assert_int_equal(kva_arena_check(a, NULL), 0);

	fprintf(stderr, "  %u kills (%u before joining); killed while in:", kills, before_join);
	for (unsigned p = 0; p < TU_NPHASE; p++)
		fprintf(stderr, " %s %u", tu_phase_name[p], phase_hist[p]);
	fprintf(stderr, "\n  reclaimed by survivors: %llu owned blocks, %llu references (%llu "
		"last holders), %llu hints repaired\n", (unsigned long long)owned,
		(unsigned long long)refs, (unsigned long long)last, (unsigned long long)repaired);
	assert_true(kills >= target);
	close(go[0]);
	close(go[1]);
	tu_shared_free(views, vb * WORKERS);
	tu_shared_free(sh, sizeof(*sh));
	kva_arena_close(a);
}

static void *sleep_forever(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

/* /proc/<pid>/stat's state letter, or '?' */
static char proc_state(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (!(f = fopen(path, "r")))
		return '?';
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	return p && p[1] == ' ' ? p[2] : '?';
}

/*
 * A process whose main thread called pthread_exit while another thread runs
 * is alive, though /proc shows its leader as a zombie: reclaim refuses its
 * slot and the check does not count it dead. Once it is killed, reclaim
 * takes everything back.
 */
static void test_live_process_whose_main_thread_exited_is_not_reclaimed(void **state)
{
	struct kva_arena *a = tu_arena(256, KVA_CACHE_NONE, 4);
	struct kva_check_report cr;
	struct kva_stats st;
	int ready[2], slot;
	char c;
	pid_t pid;

	(void)state;
	assert_non_null(a);
	assert_int_equal(pipe(ready), 0);
	pid = tu_fork();
	if (pid == 0) {
		struct kva_worker *w;
		uint32_t ids[40];
		pthread_t th;

		close(ready[0]);
		if (kva_worker_join(a, "half-exited", &w) || kva_alloc(w, 40, ids) ||
		    pthread_create(&th, NULL, sleep_forever, NULL))
			_exit(1);
		if (write(ready[1], "r", 1) != 1)
			_exit(1);
		pthread_exit(NULL); /* the process lives on in sleep_forever */
	}
	close(ready[1]);
	assert_int_equal(read(ready[0], &c, 1), 1);
	close(ready[0]);
	for (int i = 0; i < 500 && proc_state(pid) != 'Z'; i++)
		usleep(10000);
	assert_int_equal(proc_state(pid), 'Z');
	slot = tu_slot_of(a, pid);
	assert_true(slot >= 0);

	assert_int_equal(kva_arena_reclaim(a, (uint32_t)slot, NULL), -EBUSY);
	kva_arena_check(a, &cr);
	assert_int_equal(cr.dead_slots, 0);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.slots[slot].state, KVA_SLOT_LIVE);
	assert_int_equal(st.slots[slot].owned, 40);

	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, NULL, 0), pid);
	assert_int_equal(kva_arena_reclaim(a, (uint32_t)slot, NULL), 0);
	assert_int_equal(kva_arena_check(a, &cr), 0);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.free_blocks, 256);
	kva_arena_close(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_live_process_whose_main_thread_exited_is_not_reclaimed),
		cmocka_unit_test(test_sigkill_at_random_moments_loses_nothing),
	};

	return cmocka_run_group_tests_name("arena_crash", tests, NULL, NULL);
}
