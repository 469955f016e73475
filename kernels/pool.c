/* SPDX-License-Identifier: MIT */
/*
 * pool.c - the threads decode runs on.
 *
 * Why a pool of our own: a decode call is short (tens of microseconds to a
 * few milliseconds per layer) and comes once per layer per step, so threads
 * must outlive calls; tasks are uneven (sequences of different lengths), so
 * they are handed out one at a time by an atomic counter rather than in
 * fixed shares; the caller works too rather than sleep; and the workers
 * that call us fork (engines spawn processes), which an OpenMP runtime does
 * not survive reliably. After fork() the child starts with no pool and
 * builds one on its first call.
 *
 * One job at a time: concurrent callers queue on the pool lock.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels_pvt.h"

#define MAX_THREADS 256

struct job {
	void (*fn)(void *ctx, uint32_t task);
	void (*ahead)(void *ctx, uint32_t task, uint32_t next, bool warm); /* or this */
	void *ctx;
	uint32_t n;
	int wanted;                /* workers asked to help (the caller is one more) */
	_Atomic uint32_t next;     /* the next task to hand out */
};

struct pool {
	pthread_mutex_t lock;
	pthread_cond_t wake;       /* a job is posted */
	pthread_cond_t done;       /* the last helper left a job, or the pool is free */
	struct job *job;           /* the job in progress, NULL if none */
	uint64_t gen;              /* bumped per job */
	int running;               /* helpers inside the job */
	int nthreads;
};

static struct pool *pool;
static pthread_mutex_t pool_init = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

struct helper {
	struct pool *p;
	int index;
};

static void run(struct job *j)
{
	uint32_t t;

	/* relaxed: the job's fields were published under the pool lock, and
	 * tasks write disjoint results the caller reads after the lock again */
	if (!j->ahead) {
		while ((t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n)
			j->fn(j->ctx, t);
		return;
	}
	/* kva__parallel_ahead: the next task claimed before this one runs */
	t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
	for (bool warm = false; t < j->n; warm = true) {
		uint32_t u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);

		j->ahead(j->ctx, t, u < j->n ? u : UINT32_MAX, warm);
		t = u;
	}
}

static void *helper_main(void *arg)
{
	struct helper h = *(struct helper *)arg;
	struct pool *p = h.p;
	uint64_t seen = 0;

	free(arg);
	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct job *j;

		while (!p->job || p->gen == seen || h.index >= p->job->wanted) {
			if (p->job)
				seen = p->gen; /* a job not for us */
			pthread_cond_wait(&p->wake, &p->lock);
		}
		seen = p->gen;
		j = p->job;
		p->running++;
		pthread_mutex_unlock(&p->lock);
		run(j);
		pthread_mutex_lock(&p->lock);
		if (--p->running == 0)
			pthread_cond_broadcast(&p->done);
	}
	return NULL;
}

static void forget_pool(void)
{
	/* in the child of a fork: the helpers did not come along, and the lock
	 * may have been held by one of them. Leak the old pool, start afresh. */
	pool = NULL;
	pthread_mutex_init(&pool_init, NULL);
}

static void register_atfork(void)
{
	pthread_atfork(NULL, NULL, forget_pool);
}

static struct pool *get_pool(void)
{
	struct pool *p;

	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&pool_init);
	p = pool;
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (p) {
			pthread_mutex_init(&p->lock, NULL);
			pthread_cond_init(&p->wake, NULL);
			pthread_cond_init(&p->done, NULL);
			pool = p;
		}
	}
	pthread_mutex_unlock(&pool_init);
	return p;
}

/* grow to @want helpers; under p->lock. Fewer is not an error: we run with
 * what we have. */
static void grow(struct pool *p, int want)
{
	while (p->nthreads < want && p->nthreads < MAX_THREADS - 1) {
		struct helper *h = malloc(sizeof(*h));
		pthread_attr_t attr;
		pthread_t tid;

		if (!h)
			return;
		*h = (struct helper){ p, p->nthreads };
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&tid, &attr, helper_main, h)) {
			pthread_attr_destroy(&attr);
			free(h);
			return;
		}
		pthread_attr_destroy(&attr);
		p->nthreads++;
	}
}

static int parallel(int threads, struct job *jp)
{
	struct job j = *jp;
	struct pool *p;
	uint32_t n = j.n;

	if (threads <= 1 || n <= 1 || !(p = get_pool())) {
		for (uint32_t t = 0; t < n; t++)
			if (j.ahead)
				j.ahead(j.ctx, t, t + 1 < n ? t + 1 : UINT32_MAX, t > 0);
			else
				j.fn(j.ctx, t);
		return 0;
	}
	pthread_mutex_lock(&p->lock);
	while (p->job) /* another caller's job */
		pthread_cond_wait(&p->done, &p->lock);
	grow(p, threads - 1);
	j.wanted = (int)(n - 1 < (uint32_t)(threads - 1) ? n - 1 : (uint32_t)(threads - 1));
	if (j.wanted > p->nthreads)
		j.wanted = p->nthreads;
	p->job = &j;
	p->gen++;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);

	run(&j);

	pthread_mutex_lock(&p->lock);
	/* helpers still inside hold a pointer to j, which is on our stack */
	while (p->running)
		pthread_cond_wait(&p->done, &p->lock);
	p->job = NULL;
	pthread_cond_broadcast(&p->done); /* for callers queued behind us */
	pthread_mutex_unlock(&p->lock);
	return 0;
}

int kva__parallel(int threads, uint32_t n, void (*fn)(void *ctx, uint32_t task), void *ctx)
{
	struct job j = { .fn = fn, .ctx = ctx, .n = n };

	return parallel(threads, &j);
}

int kva__parallel_ahead(int threads, uint32_t n,
			void (*fn)(void *ctx, uint32_t task, uint32_t next, bool warm), void *ctx)
{
	struct job j = { .ahead = fn, .ctx = ctx, .n = n };

	return parallel(threads, &j);
}

int kva_kernel_threads(void)
{
	const char *env = getenv("KVARENA_THREADS");
	cpu_set_t set;

	if (env && atoi(env) > 0)
		return atoi(env) > MAX_THREADS ? MAX_THREADS : atoi(env);
	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		return CPU_COUNT(&set) > MAX_THREADS ? MAX_THREADS : CPU_COUNT(&set);
	return 1;
}
