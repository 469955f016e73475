/* SPDX-License-Identifier: MIT */
#include "testutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include "arena_pvt.h"

const char *const tu_phase_name[TU_NPHASE] = {
	"idle", "alloc", "free", "share-own", "share-other", "reclaim",
};

struct kva_geometry tu_geometry(void)
{
	return (struct kva_geometry){
		.block_tokens = 16, .layers = 2, .kv_heads = 2, .head_dim = 64,
		.dtype = KVA_F16, .layout = KVA_LAYOUT_BLOCK_MAJOR,
	};
}

struct kva_arena *tu_arena(uint32_t blocks, uint32_t cache, uint32_t max_workers)
{
	struct kva_geometry g = tu_geometry();
	struct kva_arena_opts o = {
		.blocks = blocks, .cache_blocks = cache, .max_workers = max_workers,
		.numa_node = -1, .name = "test",
	};
	struct kva_arena *a = NULL;
	int ret = kva_arena_create(&g, &o, &a);

	if (ret < 0) {
		fprintf(stderr, "kva_arena_create: %s (%s)\n", strerror(-ret), kva_errmsg());
		return NULL;
	}
	return a;
}

void *tu_shared_alloc(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

void tu_shared_free(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes);
}

size_t tu_view_bytes(uint32_t blocks)
{
	return sizeof(struct tu_view) + (size_t)blocks * sizeof(struct tu_hold);
}

void tu_view_capture(struct kva_worker *w, struct tu_view *v)
{
	v->slot = (int32_t)w->slot_id;
	v->n = 0;
	for (uint32_t id = 0; id < w->c.blocks; id++) {
		uint32_t p = w->c.held[id];

		if (p)
			v->e[v->n++] = (struct tu_hold){
				id, p == KVA__HELD_EXCL ? TU_EXCL : p & KVA__HELD_MAXREF };
	}
	for (uint32_t k = 0; k < w->c.len; k++)
		v->e[v->n++] = (struct tu_hold){ w->c.ids[k], TU_CACHED };
}

bool tu_views_match(struct kva_arena *a, struct tu_view *const *views, uint32_t n,
		    struct tu_mismatch *m)
{
	uint8_t *owners = calloc(a->blocks, 1);
	uint8_t *owner_slot = calloc(a->blocks, 1);
	uint64_t *holders = calloc(a->blocks, sizeof(uint64_t));
	uint32_t shown = 0;

	memset(m, 0, sizeof(*m));
	for (uint32_t k = 0; k < n; k++) {
		const struct tu_view *v = views[k];

		if (!v || v->slot < 0)
			continue;
		for (uint32_t j = 0; j < v->n; j++) {
			uint32_t id = v->e[j].id;

			if (v->e[j].refs == TU_EXCL || v->e[j].refs == TU_CACHED) {
				owners[id]++;
				owner_slot[id] = (uint8_t)v->slot;
			} else {
				holders[id] |= 1ull << v->slot;
			}
		}
	}
	for (uint32_t id = 0; id < a->blocks; id++) {
		uint64_t d = atomic_load(&a->desc[id]);
		uint64_t p = kva__d_payload(d);
		uint32_t *bad = NULL;

		switch (kva__d_kind(d)) {
		case KVA__D_FREE:
			if (owners[id] || holders[id])
				bad = &m->lost;
			break;
		case KVA__D_OWNED:
			if (!owners[id] && !holders[id])
				bad = &m->leaked;
			else if (owners[id] > 1 || holders[id])
				bad = &m->double_owned;
			else if (owner_slot[id] != kva__tag_slot(p))
				bad = &m->lost;
			break;
		case KVA__D_SHARED:
			if (owners[id])
				bad = &m->double_owned;
			else if (!holders[id])
				bad = &m->leaked;
			else if (holders[id] != p)
				bad = &m->refcount;
			break;
		case KVA__D_CACHED: /* published, nobody holds it */
			if (owners[id] || holders[id])
				bad = &m->lost;
			break;
		default:
			bad = &m->lost;
		}
		if (bad) {
			(*bad)++;
			if (shown++ < 8)
				fprintf(stderr, "block %u: descriptor %#llx, owners %u (slot %u), "
					"holders %#llx\n", id, (unsigned long long)d, owners[id],
					owner_slot[id], (unsigned long long)holders[id]);
		}
	}
	free(owners);
	free(owner_slot);
	free(holders);
	return !m->leaked && !m->double_owned && !m->refcount && !m->lost;
}

int tu_evict_all(struct kva_worker *w)
{
	uint32_t blocks = kva_arena_info(kva_worker_arena(w))->blocks, *ids, n = 0;
	int ret;

	if (!(ids = malloc(sizeof(*ids) * blocks)))
		return -ENOMEM;
	while (n < blocks && kva_alloc(w, 1, ids + n) == 0)
		n++;
	ret = kva_free(w, ids, n);
	free(ids);
	return ret;
}

pid_t tu_fork(void)
{
	pid_t parent = getpid(), pid = fork();

	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent) /* the parent died before prctl */
			_exit(1);
	}
	return pid;
}

int tu_slot_of(struct kva_arena *a, pid_t pid)
{
	struct kva_stats st;

	kva_arena_stats(a, &st);
	for (uint32_t s = 0; s < st.max_workers; s++)
		if (st.slots[s].state != KVA_SLOT_FREE && st.slots[s].pid == pid)
			return (int)s;
	return -1;
}

uint64_t tu_rand(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The stamp at the start of every block the workload touches. */
struct stamp {
	uint32_t id, seq;
	uint64_t check;
};

static uint64_t stamp_check(uint32_t id, uint32_t seq)
{
	uint32_t v[2] = { id, seq };

	return XXH64(v, sizeof(v), 42);
}

static void unexpected(struct tu_work *t, const char *what, int ret)
{
	atomic_fetch_add(&t->board->unexpected, 1);
	fprintf(stderr, "pid %d: %s: %s (%s)\n", (int)getpid(), what, strerror(-ret),
		kva_errmsg());
}

/* through kva_block_write and kva_block_read: the workload runs on any
 * arena, a GPU's included */
static void stamp_write(struct tu_work *t, uint32_t id, uint32_t seq)
{
	struct stamp s = { id, seq, stamp_check(id, seq) };

	if (kva_block_write(t->w, id, 0, &s, sizeof(s)) < 0)
		unexpected(t, "block write", -EIO);
}

/* Read a stamp; false if the block does not carry a whole one for @id. */
static bool stamp_read(struct tu_work *t, uint32_t id, uint32_t *seq)
{
	struct stamp s = { 0 };

	if (kva_block_read(t->w, id, 0, &s, sizeof(s)) < 0)
		unexpected(t, "block read", -EIO);
	*seq = s.seq;
	return s.id == id && s.check == stamp_check(id, s.seq);
}

static void verify(struct tu_work *t, const struct tu_ref *r)
{
	uint32_t seq;

	if (!stamp_read(t, r->id, &seq) || seq != r->seq) {
		atomic_fetch_add(&t->board->errors, 1);
		fprintf(stderr, "pid %d: block %u changed under a reference (seq %u, now %u)\n",
			(int)getpid(), r->id, r->seq, seq);
	}
}

void tu_work_init(struct tu_work *t, struct kva_worker *w, struct tu_board *b, uint32_t max_refs,
		  uint64_t seed)
{
	static _Atomic uint32_t none;

	memset(t, 0, sizeof(*t));
	t->w = w;
	t->board = b;
	t->max_refs = max_refs;
	t->refs = calloc(max_refs, sizeof(*t->refs));
	t->rng = seed;
	t->phase = &none;
	t->seq = (uint32_t)(seed << 20);
}

void tu_work_fini(struct tu_work *t)
{
	free(t->refs);
	t->refs = NULL;
}

static void phase(struct tu_work *t, enum tu_phase p)
{
	atomic_store_explicit(t->phase, p, memory_order_relaxed);
}

static void do_alloc(struct tu_work *t)
{
	uint32_t ids[4], k = 1 + (uint32_t)(tu_rand(&t->rng) % 4);
	int ret;

	if (k > t->max_refs - t->n_refs)
		k = t->max_refs - t->n_refs;
	if (!k)
		return;
	phase(t, TU_ALLOC);
	ret = kva_alloc(t->w, k, ids);
	phase(t, TU_IDLE);
	if (ret == -ENOSPC) {
		t->enospc++;
		return;
	}
	if (ret < 0) {
		unexpected(t, "alloc", ret);
		return;
	}
	for (uint32_t j = 0; j < k; j++) {
		uint32_t seq = ++t->seq;

		stamp_write(t, ids[j], seq);
		t->refs[t->n_refs++] = (struct tu_ref){ ids[j], seq, true };
	}
}

static void do_free(struct tu_work *t)
{
	uint32_t ids[3], k = 1 + (uint32_t)(tu_rand(&t->rng) % 3);
	int ret;

	if (k > t->n_refs)
		k = t->n_refs;
	/* take k random references off the list (an id may repeat: we hold
	 * that many references to it) */
	for (uint32_t j = 0; j < k; j++) {
		uint32_t at = (uint32_t)(tu_rand(&t->rng) % t->n_refs);

		verify(t, &t->refs[at]);
		ids[j] = t->refs[at].id;
		t->refs[at] = t->refs[--t->n_refs];
	}
	phase(t, TU_FREE);
	ret = kva_free(t->w, ids, k);
	phase(t, TU_IDLE);
	if (ret < 0)
		unexpected(t, "free", ret);
}

static void do_share_own(struct tu_work *t)
{
	uint32_t at = (uint32_t)(tu_rand(&t->rng) % t->n_refs), slot;
	struct tu_ref *r = &t->refs[at];
	int ret;

	if (!r->excl || t->n_refs == t->max_refs)
		return;
	phase(t, TU_SHARE_OWN);
	ret = kva_share(t->w, &r->id, 1);
	phase(t, TU_IDLE);
	if (ret < 0) {
		unexpected(t, "share own", ret);
		return;
	}
	r->excl = false;
	t->refs[t->n_refs++] = *r;
	slot = atomic_fetch_add(&t->board->next, 1) % TU_BOARD_SIZE;
	atomic_store(&t->board->ids[slot], r->id + 1);
}

static void do_share_other(struct tu_work *t)
{
	uint32_t id = atomic_load(&t->board->ids[tu_rand(&t->rng) % TU_BOARD_SIZE]), seq;
	int ret;

	if (!id--)
		return;
	phase(t, TU_SHARE_OTHER);
	ret = kva_share(t->w, &id, 1);
	phase(t, TU_IDLE);
	if (ret == -EPERM) /* the board is old news: freed, or someone's again */
		return;
	if (ret < 0) {
		unexpected(t, "share other", ret);
		return;
	}
	if (!stamp_read(t, id, &seq)) {
		atomic_fetch_add(&t->board->errors, 1);
		fprintf(stderr, "pid %d: shared block %u carries no whole stamp\n", (int)getpid(),
			id);
	}
	t->refs[t->n_refs++] = (struct tu_ref){ id, seq, false };
	atomic_fetch_add_explicit(&t->board->cross_shares, 1, memory_order_relaxed);
}

void tu_work_step(struct tu_work *t)
{
	uint32_t r = (uint32_t)(tu_rand(&t->rng) % 100);

	t->ops++;
	if (t->n_refs == t->max_refs || (r >= 35 && r < 65 && t->n_refs))
		do_free(t);
	else if (r < 35 || !t->n_refs)
		do_alloc(t);
	else if (r < 80)
		do_share_own(t);
	else
		do_share_other(t);
}

void tu_work_drain(struct tu_work *t)
{
	while (t->n_refs) {
		struct tu_ref r = t->refs[--t->n_refs];
		int ret;

		verify(t, &r);
		ret = kva_free(t->w, &r.id, 1);
		if (ret < 0)
			unexpected(t, "drain free", ret);
	}
}

int tu_agent_start(struct tu_agent *ag, const char *path, const char *const *args)
{
	return tu_agent_start_ex(ag, path, args, NULL, NULL);
}

int tu_agent_start_ex(struct tu_agent *ag, const char *path, const char *const *args,
		      void (*pre_exec)(void *), void *arg)
{
	const char *argv[32] = { path, "--socket", ag->socket, "--log-level", "debug" };
	unsigned n = 5;

	memset(ag, 0, sizeof(*ag));
	argv[2] = ag->socket;
	snprintf(ag->dir, sizeof(ag->dir), "/tmp/kva-test-XXXXXX");
	if (!mkdtemp(ag->dir))
		return -errno;
	chmod(ag->dir, 0755); /* so that a test can connect as another user */
	snprintf(ag->socket, sizeof(ag->socket), "%s/agent.sock", ag->dir);
	snprintf(ag->log, sizeof(ag->log), "%s/agent.log", ag->dir);
	for (; args && *args && n < 31; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	ag->pid = tu_fork();
	if (ag->pid < 0)
		return -errno;
	if (ag->pid == 0) {
		int fd = open(ag->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

		if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
			_exit(126);
		if (pre_exec)
			pre_exec(arg);
		execv(path, (char *const *)argv);
		_exit(127);
	}
	for (int k = 0; k < 500; k++) { /* 5 s */
		struct kva_arena *a;
		int status;

		if (kva_observe(ag->socket, &a, NULL) == 0) {
			kva_arena_close(a);
			return 0;
		}
		if (waitpid(ag->pid, &status, WNOHANG) == ag->pid) {
			ag->pid = 0;
			return -ECHILD;
		}
		usleep(10000);
	}
	return -ETIMEDOUT;
}

int tu_agent_stop(struct tu_agent *ag, int sig, int timeout_ms, int *status)
{
	if (ag->pid <= 0)
		return -ECHILD;
	kill(ag->pid, sig);
	for (int waited = 0; waited <= timeout_ms; waited += 10) {
		if (waitpid(ag->pid, status, WNOHANG) == ag->pid) {
			ag->pid = 0;
			return 0;
		}
		usleep(10000);
	}
	kill(ag->pid, SIGKILL);
	waitpid(ag->pid, status, 0);
	ag->pid = 0;
	return -ETIMEDOUT;
}

unsigned tu_agent_log_count(const struct tu_agent *ag, const char *needle)
{
	FILE *f = fopen(ag->log, "r");
	char line[2048];
	unsigned n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

void tu_agent_cleanup(struct tu_agent *ag)
{
	int status;

	if (ag->pid > 0)
		tu_agent_stop(ag, SIGKILL, 1000, &status);
	if (getenv("TU_KEEP_LOGS")) { /* to read what the agent said */
		fprintf(stderr, "  (agent log kept: %s)\n", ag->log);
		unlink(ag->socket);
		return;
	}
	unlink(ag->log);
	unlink(ag->socket);
	rmdir(ag->dir);
}

int tu_run(const char *const *argv, char *out, size_t len)
{
	int p[2], status;
	size_t got = 0;
	pid_t pid;

	if (pipe(p) < 0)
		return -1;
	pid = tu_fork();
	if (pid == 0) {
		dup2(p[1], STDOUT_FILENO);
		close(p[0]);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	for (;;) {
		ssize_t n = read(p[0], out + got, len - 1 - got);

		if (n <= 0 || (got += (size_t)n) == len - 1)
			break;
	}
	out[got] = '\0';
	close(p[0]);
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
