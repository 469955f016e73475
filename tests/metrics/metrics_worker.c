/* SPDX-License-Identifier: MIT */
/*
 * metrics_worker - a worker process the metrics tests drive line by line
 * on stdin, to put blocks of the arena in known states. One answer line
 * per command on stdout: "ok ..." or "err -ERRNO message".
 *
 *   attach NAME          kva_attach (the socket: $KVARENA_SOCKET); later
 *                        commands act on the newest worker
 *   join HEX             kva_worker_join the newest worker's arena on our own,
 *                        named by the bytes HEX spells (any bytes: the agent
 *                        learns the name from shared memory)
 *   cache N              its cache capacity
 *   own N                N blocks held alone
 *   share N              N blocks of its own, shared (each held twice)
 *   publish SEED N       a sequence of N full blocks of tokens from SEED,
 *                        published and closed: N cached prefix blocks
 *   hold SEED N KIND     the same, kept open (KIND inference, training or
 *                        pinned; tenant 7)
 *   match SEED N         a sequence matching N blocks of SEED's tokens, kept
 *                        open ("ok TOKENS" matched)
 *   evict                allocate every block there is, free them: the
 *                        cached prefix blocks are evicted
 *   backed N             wait (10 s at most) for the agent to have copied N
 *                        blocks below
 *   fetch SEED N         match SEED's N blocks, fetch what is below, wait
 *                        ("ok FETCHED_TOKENS")
 *   release              close every sequence, free every block held
 *   detach               kva_detach the newest worker
 * End of input: detach all, exit 0. The agent's SHUTDOWN: detach that
 * worker, say "shutdown" on stdout.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvarena.h"

#define MAX_WORKERS 8
#define MAX_HELD 4096
#define MAX_SEQS 64

struct worker {
	struct kva_worker *w;
	bool joined;         /* by kva_worker_join: no agent connection */
	uint32_t held[MAX_HELD];
	unsigned n_held;
	struct kva_seq *seqs[MAX_SEQS];
	unsigned n_seqs;
};

static struct worker workers[MAX_WORKERS];
static unsigned n_workers;

static int32_t *tokens_of(unsigned seed, size_t n)
{
	int32_t *t = malloc(n * sizeof(*t));

	for (size_t i = 0; t && i < n; i++)
		t[i] = (int32_t)(((uint64_t)seed * 1000003u + i * 7919u) & 0x7fffffff);
	return t;
}

static uint32_t block_tokens(struct worker *wk)
{
	return kva_arena_info(kva_worker_arena(wk->w))->geometry.block_tokens;
}

static int err(int ret)
{
	printf("err %d %s\n", ret, kva_errmsg());
	return 0;
}

static void release(struct worker *wk)
{
	while (wk->n_seqs)
		kva_seq_close(wk->seqs[--wk->n_seqs]);
	if (wk->n_held)
		kva_free(wk->w, wk->held, wk->n_held);
	wk->n_held = 0;
}

static void detach(struct worker *wk)
{
	release(wk);
	if (wk->joined)
		kva_worker_leave(wk->w);
	else
		kva_detach(wk->w);
	*wk = workers[--n_workers];
}

static int seq_of(struct worker *wk, unsigned seed, size_t blocks, enum kva_owner_kind kind,
		  bool keep)
{
	struct kva_seq_opts o = { .kind = kind, .model = "metrics-test", .tenant = 7 };
	size_t n = blocks * block_tokens(wk);
	int32_t *t = tokens_of(seed, n);
	struct kva_seq *s;
	int ret;

	if (!t)
		return err(-ENOMEM);
	if ((ret = kva_seq_open(wk->w, &o, &s)) < 0 || (ret = kva_seq_append(s, t, n)) < 0) {
		free(t);
		return err(ret);
	}
	free(t);
	if (keep && wk->n_seqs < MAX_SEQS)
		wk->seqs[wk->n_seqs++] = s;
	else
		kva_seq_close(s);
	printf("ok\n");
	return 0;
}

static int match(struct worker *wk, unsigned seed, size_t blocks, bool fetch)
{
	struct kva_seq_opts o = { .kind = KVA_OWNER_INFERENCE, .model = "metrics-test",
				  .tenant = 7 };
	size_t n = blocks * block_tokens(wk), got = 0;
	int32_t *t = tokens_of(seed, n);
	struct kva_match m;
	struct kva_fetch_result r;
	struct kva_seq *s;
	int ret;

	if (!t)
		return err(-ENOMEM);
	if ((ret = kva_seq_open(wk->w, &o, &s)) < 0) {
		free(t);
		return err(ret);
	}
	ret = fetch ? kva_seq_match_tiers(s, t, n, &m) : kva_seq_match(s, t, n, &got);
	free(t);
	if (ret == 0 && fetch) {
		if ((ret = kva_seq_fetch_start(s, 0)) == 0)
			ret = kva_seq_fetch_wait(s, 10000, &r);
		got = ret == 0 ? r.fetched_tokens : 0;
	}
	if (ret < 0) {
		kva_seq_close(s);
		return err(ret);
	}
	if (!fetch && wk->n_seqs < MAX_SEQS)
		wk->seqs[wk->n_seqs++] = s;
	else
		kva_seq_close(s);
	printf("ok %zu\n", got);
	return 0;
}

static int command(char *line)
{
	char name[64], kind[16];
	unsigned a, b;
	struct worker *wk = n_workers ? &workers[n_workers - 1] : NULL;
	int ret;

	if (sscanf(line, "attach %63s", name) == 1) {
		if (n_workers == MAX_WORKERS)
			return err(-ENOSPC);
		wk = &workers[n_workers];
		*wk = (struct worker){ 0 };
		if ((ret = kva_attach(NULL, name, &wk->w)) < 0)
			return err(ret);
		n_workers++;
		printf("ok %d\n", kva_worker_slot(wk->w));
		return 0;
	}
	if (!wk)
		return err(-ENOTCONN);
	if (sscanf(line, "join %63s", name) == 1) {
		char bytes[32] = "";
		size_t n = strlen(name) / 2;
		struct worker *j = &workers[n_workers];

		if (n_workers == MAX_WORKERS || n >= sizeof(bytes))
			return err(-ENOSPC);
		for (size_t k = 0; k < n; k++)
			if (sscanf(name + 2 * k, "%2hhx", (unsigned char *)&bytes[k]) != 1)
				return err(-EINVAL);
		*j = (struct worker){ .joined = true };
		if ((ret = kva_worker_join(kva_worker_arena(wk->w), bytes, &j->w)) < 0)
			return err(ret);
		n_workers++;
		printf("ok %d\n", kva_worker_slot(j->w));
		return 0;
	}
	if (sscanf(line, "cache %u", &a) == 1) {
		if ((ret = kva_worker_set_cache(wk->w, a)) < 0)
			return err(ret);
	} else if (sscanf(line, "own %u", &a) == 1 || sscanf(line, "share %u", &b) == 1) {
		bool share = !strncmp(line, "share", 5);

		a = share ? b : a;
		if (wk->n_held + a > MAX_HELD)
			return err(-ENOSPC);
		if ((ret = kva_alloc(wk->w, a, wk->held + wk->n_held)) < 0)
			return err(ret);
		if (share && (ret = kva_share(wk->w, wk->held + wk->n_held, a)) < 0)
			return err(ret);
		wk->n_held += a;
		if (share) { /* each held twice: freed twice */
			if (wk->n_held + a > MAX_HELD)
				return err(-ENOSPC);
			memcpy(wk->held + wk->n_held, wk->held + wk->n_held - a, a * sizeof(uint32_t));
			wk->n_held += a;
		}
	} else if (sscanf(line, "publish %u %u", &a, &b) == 2) {
		return seq_of(wk, a, b, KVA_OWNER_INFERENCE, false);
	} else if (sscanf(line, "hold %u %u %15s", &a, &b, kind) == 3) {
		return seq_of(wk, a, b, !strcmp(kind, "training") ? KVA_OWNER_TRAINING
					: !strcmp(kind, "pinned") ? KVA_OWNER_PINNED
								  : KVA_OWNER_INFERENCE, true);
	} else if (sscanf(line, "match %u %u", &a, &b) == 2) {
		return match(wk, a, b, false);
	} else if (sscanf(line, "fetch %u %u", &a, &b) == 2) {
		return match(wk, a, b, true);
	} else if (!strncmp(line, "evict", 5)) {
		uint32_t blocks = kva_arena_info(kva_worker_arena(wk->w))->blocks, *ids, n = 0;

		if (!(ids = malloc(sizeof(*ids) * blocks)))
			return err(-ENOMEM);
		while (n < blocks && kva_alloc(wk->w, 1, ids + n) == 0)
			n++;
		ret = kva_free(wk->w, ids, n);
		free(ids);
		if (ret < 0)
			return err(ret);
	} else if (sscanf(line, "backed %u", &a) == 1) {
		struct kva_tiers_stats ts;
		struct timespec d = { 0, 20000000 };

		for (int k = 0; k < 500; k++) {
			if (kva_arena_tier_stats(kva_worker_arena(wk->w), &ts) == 0 && ts.backed >= a)
				break;
			nanosleep(&d, NULL);
		}
		if (ts.backed < a)
			return err(-ETIMEDOUT);
	} else if (!strncmp(line, "release", 7)) {
		release(wk);
	} else if (!strncmp(line, "detach", 6)) {
		detach(wk);
	} else {
		return err(-EINVAL);
	}
	printf("ok\n");
	return 0;
}

int main(void)
{
	char line[256];

	/* stdin unbuffered: poll() must see every line fgets() has not read */
	setvbuf(stdin, NULL, _IONBF, 0);
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (;;) {
		struct pollfd p[MAX_WORKERS + 1] = { { .fd = STDIN_FILENO, .events = POLLIN } };

		/* a joined worker has no connection: fd -1, which poll() skips */
		for (unsigned k = 0; k < n_workers; k++)
			p[k + 1] = (struct pollfd){ .fd = workers[k].joined ? -1 : kva_worker_fd(workers[k].w),
						    .events = POLLIN };
		if (poll(p, n_workers + 1, -1) < 0)
			continue;
		for (unsigned k = n_workers; k > 0; k--)
			if (p[k].revents && !workers[k - 1].joined &&
			    kva_worker_poll(workers[k - 1].w) < 0) {
				detach(&workers[k - 1]);
				printf("shutdown\n");
			}
		if (!p[0].revents)
			continue;
		if (!fgets(line, sizeof(line), stdin))
			break;
		command(line);
	}
	while (n_workers)
		detach(&workers[n_workers - 1]);
	return 0;
}
