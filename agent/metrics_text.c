/* SPDX-License-Identifier: MIT */
/*
 * metrics_text.c - what /metrics says: the agent's state in the Prometheus
 * text exposition format, made on the agent's one thread from
 *
 *   - what the agent owns: its slot table (who holds which slot, in which
 *     state), its counters (admitted, refused by reason, reclaims,
 *     repairs, errors logged), its configuration (policy, limits, quotas)
 *     and its private copy of the arena's geometry: believed;
 *   - shared memory, which any admitted worker can write: block counts
 *     from one pass over the descriptors (kva_arena_stats), the prefix
 *     index and the workers' sequence counters (kva_arena_prefix_stats,
 *     kva_arena_seq_stats), the tiers' view (kva_arena_tier_stats) and the
 *     workers' host-tier latency buckets: input. Names from there are
 *     printable UTF-8 ('?' for the rest) and escaped as label values; a
 *     counter is never shown lower than it was (a slot's counts move into
 *     the arena's totals in two steps, and a worker can scribble them: a
 *     counter that went down would make Prometheus see a reset and add the
 *     whole count to its rate); a block partition is clamped so that its
 *     states add up to the arena's blocks.
 *
 * Every family has HELP and TYPE; counters end in _total; units are base
 * units (bytes, seconds); one series per live slot for per-worker families.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "agent_pvt.h"
#include "arena_pvt.h"
#include "metrics.h"
#include "text.h"

const char *const metrics_answer_code[MA_N] = {
	[MA_200] = "200", [MA_404] = "404", [MA_405] = "405", [MA_413] = "413", [MA_503] = "503",
};

/* arena-wide counters read from shared memory, each kept monotonic */
enum {
	M_HITS, M_MISSES, M_PUBLISHED, M_DUPLICATES, M_EVICT_PRESSURE, M_EVICT_STALE,
	M_INDEX_FULL, M_BACKED, M_BACK_SKIPPED, M_UNBACKED, M_BELOW, M_FETCHED, M_FETCH_FAILED,
	M_FETCH_REQUESTS, M_TIER, /* then TM_N per tier */
};
enum {
	TM_HITS, TM_RECORDS_IN, TM_BYTES_IN, TM_BYTES_OUT, TM_IO_ERRORS, TM_VERIFY, TM_STALE,
	TM_DROPPED, TM_N,
};
#define M_N (M_TIER + KVA_TIERS * TM_N)

/* a worker's counters, kept monotonic for one life of its slot */
enum { WM_REFILLS, WM_FLUSHES, WM_SHARES, WM_HITS, WM_MISSES, WM_PUBLISHED, WM_EVICTIONS, WM_N };

/*
 * The host tier's fetch latencies: the workers' own copies, counted in
 * log-linear buckets (kva__hist_bucket, four a power of two) in their
 * fetch areas. Shown as a histogram whose bounds are the powers of two
 * from 2^9 ns to 2^32 ns, each the edge of a kva bucket, so no count is
 * split; the last kva bucket also takes everything longer, so it goes to
 * +Inf alone.
 */
#define HIST_LE_FIRST 9
#define HIST_LE_LAST 32

struct worker_row {
	uint32_t slot;
	const char *state;
	int32_t pid;
	int64_t uid;            /* -1: not known */
	char labels[400];       /* slot="..",name="..",pid="..": a LABEL_MAX name fits */
	uint32_t owned, cached, shared;
	uint64_t v[WM_N];
	struct kva_seq_slot_stats q;
};

struct metrics_text {
	uint64_t mono[M_N];
	struct {
		uint32_t gen;
		int32_t pid;
		uint64_t v[WM_N];
	} slot_mono[KVA_MAX_WORKERS];
	uint64_t hist[KVA__HIST_N];
	double start_time;      /* the process's, seconds since the epoch */
	size_t last_len;        /* the previous text's size: the next buffer's */
	/* scratch, too big for the stack */
	struct kva_stats st;
	struct kva_prefix_stats ps;
	struct kva_tiers_stats ts;
	struct worker_row rows[KVA_MAX_WORKERS];
	unsigned n_rows;
};

/* ------------------------------------------------------------ output */

struct out {
	char *buf;
	size_t len, cap;
	bool oom;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	while (!o->oom) {
		size_t room = o->cap - o->len, cap;
		char *b;

		va_start(ap, fmt);
		n = vsnprintf(o->buf + o->len, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->oom = true;
			return;
		}
		if ((size_t)n < room) {
			o->len += (size_t)n;
			return;
		}
		cap = o->cap * 2 > o->len + (size_t)n + 1 ? o->cap * 2 : o->len + (size_t)n + 1;
		if (!(b = realloc(o->buf, cap))) {
			o->oom = true;
			return;
		}
		o->buf = b;
		o->cap = cap;
	}
}

/* # HELP and # TYPE of a family; every sample of it follows at once */
static void family(struct out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * A label value from outside (a worker's name, a path in shared memory):
 * printable UTF-8 ('?' for any other byte), cut at a character if longer
 * than LABEL_TEXT bytes, then the exposition format's escapes for
 * backslash, double quote and line feed (text_escape leaves no line feed;
 * escaped anyway, as the format says). @out holds LABEL_MAX bytes: twice
 * the text, so the escapes never cut it again (in the middle of a
 * character, which would not be UTF-8).
 */
#define LABEL_TEXT 160
#define LABEL_MAX (2 * LABEL_TEXT)

static const char *label(const char *in, char out[LABEL_MAX])
{
	char clean[LABEL_TEXT];
	size_t o = 0;

	text_escape(in, clean, sizeof(clean), true);
	for (const char *p = clean; *p; p++) {
		if (*p == '\\' || *p == '"' || *p == '\n') {
			out[o++] = '\\';
			out[o++] = *p == '\n' ? 'n' : *p;
		} else {
			out[o++] = *p;
		}
	}
	out[o] = '\0';
	return out;
}

/* a counter read from shared memory: never lower than it was shown */
static uint64_t mono(uint64_t *last, uint64_t now)
{
	if (now > *last)
		*last = now;
	return *last;
}

/* ------------------------------------------------------------ the process */

/* /proc/self/stat's fields after the command (which may hold spaces and
 * parentheses: read from the last ')') */
static bool self_stat(unsigned long long *utime, unsigned long long *stime,
		      unsigned long long *start, unsigned long long *vsize, long long *rss)
{
	char buf[1024], *p;
	FILE *f = fopen("/proc/self/stat", "r");
	bool ok;

	if (!f)
		return false;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	/* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
	 * utime stime cutime cstime priority nice threads itrealvalue starttime
	 * vsize rss */
	ok = p && sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d "
			 "%*d %*d %*d %*d %llu %llu %lld", utime, stime, start, vsize, rss) == 5;
	return ok;
}

static double process_start_time(void)
{
	unsigned long long ut, stt, start, vs, btime = 0;
	long long rss;
	char line[256];
	FILE *f = fopen("/proc/stat", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "btime %llu", &btime) == 1)
			break;
	fclose(f);
	if (!btime || !self_stat(&ut, &stt, &start, &vs, &rss))
		return 0;
	return (double)btime + (double)start / (double)sysconf(_SC_CLK_TCK);
}

static unsigned open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	unsigned n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n > 0 ? n - 1 : 0; /* the directory's own descriptor */
}

static void process(struct out *o, const struct metrics_text *t)
{
	unsigned long long ut, stt, start, vs;
	long long rss;
	struct rlimit rl;
	double tck = (double)sysconf(_SC_CLK_TCK);

	/* the names every Prometheus client library's process collector uses */
	if (self_stat(&ut, &stt, &start, &vs, &rss)) {
		family(o, "process_cpu_seconds_total", "counter",
		       "User and system CPU time the agent spent, in seconds.");
		put(o, "process_cpu_seconds_total %.2f\n", (double)(ut + stt) / tck);
		family(o, "process_resident_memory_bytes", "gauge", "The agent's resident memory.");
		put(o, "process_resident_memory_bytes %lld\n", rss * (long long)sysconf(_SC_PAGESIZE));
		family(o, "process_virtual_memory_bytes", "gauge", "The agent's virtual memory.");
		put(o, "process_virtual_memory_bytes %llu\n", vs);
	}
	family(o, "process_open_fds", "gauge", "File descriptors the agent has open.");
	put(o, "process_open_fds %u\n", open_fds());
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		family(o, "process_max_fds", "gauge", "The agent's limit on open file descriptors.");
		put(o, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
	}
	if (t->start_time) {
		family(o, "process_start_time_seconds", "gauge",
		       "When the agent started, in seconds since the Unix epoch.");
		put(o, "process_start_time_seconds %.2f\n", t->start_time);
	}
}

/* ------------------------------------------------------------ the agent */

static void agent_part(struct out *o, struct metrics_text *t, struct agent *ag)
{
	const struct agent_config *c = ag->cfg;
	const struct kva_arena_info *info = kva_arena_info(ag->a);
	char name[LABEL_MAX], dev[LABEL_MAX], uuid[LABEL_MAX];
	unsigned kinds[6] = { 0 }, workers = 0;
	static const char *const kind_name[6] = { "free", "reserved", "attached", "joined",
						  "reclaim_pending", "agent" };

	family(o, "kvarena_agent_info", "gauge",
	       "The agent and its arena: name, backend, version, eviction policy, block dtype "
	       "and layout; on a GPU arena the device. Always 1.");
	put(o, "kvarena_agent_info{arena=\"%s\",backend=\"%s\",version=\"%d.%d\","
	       "evict_policy=\"%s\",dtype=\"%s\",layout=\"%s\"",
	    label(info->name, name), c->backend, KVA_VERSION_MAJOR, KVA_VERSION_MINOR,
	    kva_evict_policy_name(c->evict_policy), kva_dtype_name(c->geometry.dtype),
	    c->geometry.layout == KVA_LAYOUT_BLOCK_MAJOR ? "block-major" : "layer-major");
	if (info->backend == KVA_BACKEND_CUDA)
		put(o, ",device=\"%s\",device_uuid=\"%s\"",
		    label(info->device_name, dev),
		    label(info->device_uuid, uuid));
	put(o, "} 1\n");
	family(o, "kvarena_agent_start_time_seconds", "gauge",
	       "When the agent started, in seconds since the Unix epoch.");
	put(o, "kvarena_agent_start_time_seconds %.2f\n", t->start_time);
	family(o, "kvarena_agent_stopping", "gauge",
	       "1 while the agent shuts down (SIGTERM: it admits no one and waits for the "
	       "workers to leave), else 0.");
	put(o, "kvarena_agent_stopping %d\n", ag->stopping ? 1 : 0);

	for (uint32_t s = 0; s < ag->n_slots; s++) {
		unsigned k = ag->slots[s].kind;

		kinds[k < 5 ? k : 0]++;
		workers += k == SK_RESERVED || k == SK_ATTACHED || k == SK_JOINED;
	}
	if (ag->self)
		kinds[5]++;
	family(o, "kvarena_worker_slots", "gauge",
	       "The arena's worker slots by state, as the agent's own table has them: free, "
	       "reserved (admitted, not adopted yet), attached, joined (on its own, watched), "
	       "reclaim_pending (dead, reclaim retried), agent (its tier thread's).");
	for (unsigned k = 0; k < 6; k++)
		put(o, "kvarena_worker_slots{state=\"%s\"} %u\n", kind_name[k], kinds[k]);
	family(o, "kvarena_workers", "gauge",
	       "Worker processes in the agent's table: reserved, attached and joined slots.");
	put(o, "kvarena_workers %u\n", workers);
	family(o, "kvarena_connections_waiting", "gauge",
	       "Connections to the agent's socket waiting for their HELLO.");
	put(o, "kvarena_connections_waiting %u\n", agent_conns_waiting(ag));
	family(o, "kvarena_admitted_total", "counter", "Worker processes admitted to a slot.");
	put(o, "kvarena_admitted_total %llu\n", (unsigned long long)ag->admitted);
	family(o, "kvarena_refused_total", "counter",
	       "Connections refused, by reason (each is a REFUSE the peer reads, and a log "
	       "line).");
	for (unsigned r = 0; r < AR_N; r++)
		put(o, "kvarena_refused_total{reason=\"%s\"} %llu\n", agent_refusal_name[r],
		    (unsigned long long)ag->refused_by[r]);
	family(o, "kvarena_reclaims_total", "counter",
	       "Lives of dead workers the agent reclaimed (their blocks, cache and references).");
	put(o, "kvarena_reclaims_total %llu\n", (unsigned long long)ag->reclaimed);
	family(o, "kvarena_reclaimed_blocks_total", "counter",
	       "Blocks the agent's reclaims freed: held by the dead worker alone, or shared with "
	       "no other holder left.");
	put(o, "kvarena_reclaimed_blocks_total %llu\n", (unsigned long long)ag->reclaimed_blocks);
	family(o, "kvarena_reclaims_pending", "gauge",
	       "Dead workers whose reclaim waits for another reclaimer's lease (retried).");
	put(o, "kvarena_reclaims_pending %u\n", ag->reclaims_pending);
	family(o, "kvarena_repairs_total", "counter",
	       "Words in shared memory the agent found overwritten and put back.");
	put(o, "kvarena_repairs_total %llu\n", (unsigned long long)ag->repairs);
	family(o, "kvarena_agent_log_messages_total", "counter",
	       "Errors and warnings the agent logged (those the rate limit or the log level left "
	       "out included).");
	put(o, "kvarena_agent_log_messages_total{level=\"error\"} %llu\n",
	    (unsigned long long)agent_log_events(LOG_ERR));
	put(o, "kvarena_agent_log_messages_total{level=\"warn\"} %llu\n",
	    (unsigned long long)agent_log_events(LOG_WARN));
	if (info->backend == KVA_BACKEND_CUDA) {
		family(o, "kvarena_device_memory_bytes", "gauge",
		       "The GPU's memory as the agent last read it (cuMemGetInfo, once a second).");
		put(o, "kvarena_device_memory_bytes{state=\"free\"} %llu\n",
		    (unsigned long long)ag->dev_free);
		put(o, "kvarena_device_memory_bytes{state=\"total\"} %llu\n",
		    (unsigned long long)ag->dev_total);
	}
}

/* ------------------------------------------------------------ blocks */

static void blocks_part(struct out *o, struct metrics_text *t, struct agent *ag)
{
	const struct kva_arena_info *info = kva_arena_info(ag->a);
	const struct kva_stats *st = &t->st;
	/* worker caches are part of the owned blocks: a count they publish
	 * themselves, clamped to what the descriptors say is owned */
	uint32_t cached = st->cached_blocks < st->owned_blocks ? st->cached_blocks : st->owned_blocks;

	family(o, "kvarena_blocks_capacity", "gauge", "Blocks in the arena.");
	put(o, "kvarena_blocks_capacity %u\n", info->blocks);
	family(o, "kvarena_blocks", "gauge",
	       "Blocks by state, from one pass over the descriptors; the states add up to "
	       "kvarena_blocks_capacity. free; owned: held by one worker (its idle cache apart); "
	       "cached_in_workers: idle in the workers' private caches; shared: held by several "
	       "workers, or published and held; prefix_cached: published, held by none, "
	       "evictable.");
	put(o, "kvarena_blocks{state=\"free\"} %u\n", st->free_blocks);
	put(o, "kvarena_blocks{state=\"owned\"} %u\n", st->owned_blocks - cached);
	put(o, "kvarena_blocks{state=\"cached_in_workers\"} %u\n", cached);
	put(o, "kvarena_blocks{state=\"shared\"} %u\n", st->shared_blocks);
	put(o, "kvarena_blocks{state=\"prefix_cached\"} %u\n", st->prefix_cached_blocks);
	family(o, "kvarena_shared_refs", "gauge",
	       "References on shared blocks: the sum of their holder counts.");
	put(o, "kvarena_shared_refs %u\n", st->shared_refs);
	family(o, "kvarena_block_bytes", "gauge", "Bytes of one block (every layer's K and V).");
	put(o, "kvarena_block_bytes %llu\n", (unsigned long long)info->layout.block_bytes);
	family(o, "kvarena_block_tokens", "gauge", "Tokens one block holds.");
	put(o, "kvarena_block_tokens %u\n", info->geometry.block_tokens);
	family(o, "kvarena_data_bytes", "gauge", "Bytes of the arena's data region (the blocks).");
	put(o, "kvarena_data_bytes %llu\n", (unsigned long long)info->layout.data_bytes);
	family(o, "kvarena_meta_bytes", "gauge",
	       "Bytes of the arena's metadata region (descriptors, slots, prefix index).");
	put(o, "kvarena_meta_bytes %llu\n", (unsigned long long)info->meta_bytes);
}

/* ------------------------------------------------------------ workers */

static const char *slot_state(enum slot_kind k)
{
	switch (k) {
	case SK_RESERVED: return "reserved";
	case SK_ATTACHED: return "attached";
	case SK_JOINED: return "joined";
	case SK_RECLAIM: return "reclaim_pending";
	default: return "free";
	}
}

/* one row per slot the agent's table says is in use, and the agent's own */
static void gather_workers(struct metrics_text *t, struct agent *ag)
{
	uint32_t max = kva_arena_info(ag->a)->max_workers;

	t->n_rows = 0;
	for (uint32_t s = 0; s < max; s++) {
		const struct kva_slot_stats *ss = &t->st.slots[s];
		struct worker_row *r = &t->rows[t->n_rows];
		const char *name;
		char esc[LABEL_MAX];
		uint32_t gen;
		uint64_t raw[WM_N];

		if (ag->self && s == (uint32_t)kva_worker_slot(ag->self)) {
			r->state = "agent";
			r->pid = (int32_t)getpid();
			r->uid = (int64_t)geteuid();
			gen = ag->self->gen;
			name = "agent (tiers)";
		} else if (s < ag->n_slots && ag->slots[s].kind != SK_FREE) {
			const struct slot_entry *e = &ag->slots[s];

			r->state = slot_state(e->kind);
			r->pid = (int32_t)e->pid;
			r->uid = e->uid == (uid_t)-1 ? -1 : (int64_t)e->uid;
			gen = e->gen;
			name = e->name;
		} else {
			continue;
		}
		r->slot = s;
		snprintf(r->labels, sizeof(r->labels), "slot=\"%u\",name=\"%s\",pid=\"%d\"", s,
			 label(name, esc), (int)r->pid);
		r->cached = ss->cached < ss->owned ? ss->cached : ss->owned;
		r->owned = ss->owned - r->cached;
		r->shared = ss->shared;
		if (kva_arena_seq_stats(ag->a, s, &r->q) < 0)
			memset(&r->q, 0, sizeof(r->q));
		/* a new life of the slot starts its counters again */
		if (t->slot_mono[s].gen != gen || t->slot_mono[s].pid != r->pid) {
			memset(&t->slot_mono[s], 0, sizeof(t->slot_mono[s]));
			t->slot_mono[s].gen = gen;
			t->slot_mono[s].pid = r->pid;
		}
		raw[WM_REFILLS] = ss->refills;
		raw[WM_FLUSHES] = ss->flushes;
		raw[WM_SHARES] = ss->shares;
		raw[WM_HITS] = r->q.hits;
		raw[WM_MISSES] = r->q.misses;
		raw[WM_PUBLISHED] = r->q.published;
		raw[WM_EVICTIONS] = r->q.evictions;
		for (unsigned k = 0; k < WM_N; k++)
			r->v[k] = mono(&t->slot_mono[s].v[k], raw[k]);
		t->n_rows++;
	}
}

/* one family over every row: @what picks the value */
static void worker_counter(struct out *o, const struct metrics_text *t, const char *name,
			   const char *help, unsigned k)
{
	family(o, name, "counter", help);
	for (unsigned i = 0; i < t->n_rows; i++)
		put(o, "%s{%s} %llu\n", name, t->rows[i].labels, (unsigned long long)t->rows[i].v[k]);
}

static void workers_part(struct out *o, struct metrics_text *t)
{
	static const char *const kinds[KVA_OWNER_KINDS] = { "inference", "training", "pinned" };
	const struct worker_row *r;

	family(o, "kvarena_worker_info", "gauge",
	       "One series per slot in use: its worker's name and pid (from the agent's table), "
	       "uid and state. Always 1.");
	for (unsigned i = 0; i < t->n_rows; i++) {
		r = &t->rows[i];
		if (r->uid >= 0)
			put(o, "kvarena_worker_info{%s,uid=\"%lld\",state=\"%s\"} 1\n", r->labels,
			    (long long)r->uid, r->state);
		else
			put(o, "kvarena_worker_info{%s,state=\"%s\"} 1\n", r->labels, r->state);
	}
	family(o, "kvarena_worker_blocks", "gauge",
	       "Blocks a worker holds: owned (alone, its idle cache apart), cached (idle in its "
	       "cache), shared (held with others, or published: counted once per holder).");
	for (unsigned i = 0; i < t->n_rows; i++) {
		r = &t->rows[i];
		put(o, "kvarena_worker_blocks{%s,state=\"owned\"} %u\n", r->labels, r->owned);
		put(o, "kvarena_worker_blocks{%s,state=\"cached\"} %u\n", r->labels, r->cached);
		put(o, "kvarena_worker_blocks{%s,state=\"shared\"} %u\n", r->labels, r->shared);
	}
	worker_counter(o, t, "kvarena_worker_cache_refills_total",
		       "Batches a worker's cache took from the arena.", WM_REFILLS);
	worker_counter(o, t, "kvarena_worker_cache_flushes_total",
		       "Batches a worker's cache gave back to the arena.", WM_FLUSHES);
	worker_counter(o, t, "kvarena_worker_shares_total", "References a worker took.", WM_SHARES);
	family(o, "kvarena_worker_sequences", "gauge", "A worker's open sequences.");
	for (unsigned i = 0; i < t->n_rows; i++)
		put(o, "kvarena_worker_sequences{%s} %u\n", t->rows[i].labels, t->rows[i].q.open_seqs);
	family(o, "kvarena_worker_sequence_blocks", "gauge",
	       "Blocks a worker's sequences hold, by owner kind.");
	for (unsigned i = 0; i < t->n_rows; i++)
		for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
			put(o, "kvarena_worker_sequence_blocks{%s,kind=\"%s\"} %llu\n",
			    t->rows[i].labels, kinds[k], (unsigned long long)t->rows[i].q.kind_blocks[k]);
	worker_counter(o, t, "kvarena_worker_prefix_hits_total",
		       "Full blocks a worker's matches found in the prefix index.", WM_HITS);
	worker_counter(o, t, "kvarena_worker_prefix_misses_total",
		       "Full blocks a worker's matches did not find.", WM_MISSES);
	worker_counter(o, t, "kvarena_worker_prefix_published_total",
		       "Blocks a worker published to the prefix index.", WM_PUBLISHED);
	worker_counter(o, t, "kvarena_worker_prefix_evictions_total",
		       "Cached blocks a worker's allocations evicted.", WM_EVICTIONS);
}

/* ------------------------------------------------------------ prefix cache */

static void prefix_part(struct out *o, struct metrics_text *t, struct agent *ag)
{
	static const char *const kinds[KVA_OWNER_KINDS] = { "inference", "training", "pinned" };
	const struct agent_config *c = ag->cfg;
	const struct kva_prefix_stats *ps = &t->ps;
	uint64_t *m = t->mono;

	family(o, "kvarena_prefix_hits_total", "counter",
	       "Full blocks matches found in the prefix index (every worker, those gone too).");
	put(o, "kvarena_prefix_hits_total %llu\n", (unsigned long long)mono(&m[M_HITS], ps->hits));
	family(o, "kvarena_prefix_misses_total", "counter", "Full blocks matches did not find.");
	put(o, "kvarena_prefix_misses_total %llu\n",
	    (unsigned long long)mono(&m[M_MISSES], ps->misses));
	family(o, "kvarena_prefix_published_total", "counter",
	       "Blocks published to the prefix index.");
	put(o, "kvarena_prefix_published_total %llu\n",
	    (unsigned long long)mono(&m[M_PUBLISHED], ps->published));
	family(o, "kvarena_prefix_duplicates_total", "counter",
	       "Publications that lost a race to the same block (the index keeps one).");
	put(o, "kvarena_prefix_duplicates_total %llu\n",
	    (unsigned long long)mono(&m[M_DUPLICATES], ps->duplicates));
	family(o, "kvarena_prefix_publish_skipped_total", "counter",
	       "Publications skipped: no free index entry in reach, or the cache limit reached "
	       "with nothing evictable.");
	put(o, "kvarena_prefix_publish_skipped_total %llu\n",
	    (unsigned long long)mono(&m[M_INDEX_FULL], ps->index_full));
	family(o, "kvarena_prefix_evictions_total", "counter",
	       "pressure: cached blocks taken by allocation under pressure (or past the cache "
	       "limit); stale_entry: index entries removed because their block changed.");
	put(o, "kvarena_prefix_evictions_total{cause=\"pressure\"} %llu\n",
	    (unsigned long long)mono(&m[M_EVICT_PRESSURE], ps->evictions));
	put(o, "kvarena_prefix_evictions_total{cause=\"stale_entry\"} %llu\n",
	    (unsigned long long)mono(&m[M_EVICT_STALE], ps->stale_entries));
	family(o, "kvarena_prefix_index_capacity", "gauge", "Entries of the prefix index.");
	put(o, "kvarena_prefix_index_capacity %llu\n", (unsigned long long)ps->index_entries);
	family(o, "kvarena_prefix_index_entries", "gauge",
	       "Prefix index entries in use: valid (naming a block), tombstone, ghost (the keys "
	       "of recent evictions, kept as history).");
	put(o, "kvarena_prefix_index_entries{state=\"valid\"} %llu\n",
	    (unsigned long long)ps->index_valid);
	put(o, "kvarena_prefix_index_entries{state=\"tombstone\"} %llu\n",
	    (unsigned long long)ps->index_tombstones);
	put(o, "kvarena_prefix_index_entries{state=\"ghost\"} %llu\n",
	    (unsigned long long)ps->index_ghosts);
	family(o, "kvarena_prefix_blocks", "gauge",
	       "Published blocks: cached (held by none, evictable), held (by a sequence).");
	put(o, "kvarena_prefix_blocks{state=\"cached\"} %llu\n", (unsigned long long)ps->cached_blocks);
	put(o, "kvarena_prefix_blocks{state=\"held\"} %llu\n",
	    (unsigned long long)ps->published_blocks);
	family(o, "kvarena_prefix_published_blocks", "gauge",
	       "Published blocks as the cache limit counts them.");
	put(o, "kvarena_prefix_published_blocks %llu\n", (unsigned long long)ps->published_now);
	family(o, "kvarena_prefix_cache_limit_blocks", "gauge",
	       "Published blocks allowed at once (--cache-limit; 0: no limit).");
	put(o, "kvarena_prefix_cache_limit_blocks %u\n", c->cache_limit);
	family(o, "kvarena_sequences", "gauge", "Open sequences, every worker's.");
	put(o, "kvarena_sequences %llu\n", (unsigned long long)ps->open_seqs);
	family(o, "kvarena_sequence_blocks", "gauge", "Blocks sequences hold, by owner kind.");
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
		put(o, "kvarena_sequence_blocks{kind=\"%s\"} %llu\n", kinds[k],
		    (unsigned long long)ps->kind_blocks[k]);
	family(o, "kvarena_sequence_quota_blocks", "gauge",
	       "Blocks the sequences of an owner kind may hold (--quota-*; 0: no limit).");
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
		put(o, "kvarena_sequence_quota_blocks{kind=\"%s\"} %u\n", kinds[k], c->quotas.kind[k]);
	family(o, "kvarena_tenant_blocks", "gauge",
	       "Blocks a tenant's sequences hold (tenants with a quota).");
	for (unsigned k = 0; k < KVA_MAX_TENANT_QUOTAS; k++)
		if (c->quotas.tenant[k].blocks)
			put(o, "kvarena_tenant_blocks{tenant=\"%u\"} %llu\n", c->quotas.tenant[k].tenant,
			    (unsigned long long)ps->tenant_blocks[k]);
	family(o, "kvarena_tenant_quota_blocks", "gauge",
	       "Blocks a tenant's sequences may hold (--tenant-quota).");
	for (unsigned k = 0; k < KVA_MAX_TENANT_QUOTAS; k++)
		if (c->quotas.tenant[k].blocks)
			put(o, "kvarena_tenant_quota_blocks{tenant=\"%u\"} %u\n",
			    c->quotas.tenant[k].tenant, c->quotas.tenant[k].blocks);
}

/* ------------------------------------------------------------ tiers */

static const char *const tier_name[KVA_TIERS] = { "host", "disk" };

/* what a per-tier family shows */
enum tier_field {
	TF_CAP_RECORDS, TF_RECORDS, TF_RECORD_BYTES, TF_CAP_BYTES, TF_USED_BYTES, TF_HITS,
	TF_RECORDS_IN, TF_BYTES_IN, TF_BYTES_OUT, TF_IO_ERRORS, TF_VERIFY, TF_STALE, TF_DROPPED,
	TF_DEGRADED, TF_DEGRADED_S,
};

static uint64_t tier_value(const struct kva_tier_stats *tr, enum tier_field f)
{
	switch (f) {
	case TF_CAP_RECORDS: return tr->capacity_records;
	case TF_RECORDS: return tr->used_records;
	case TF_RECORD_BYTES: return tr->record_bytes;
	case TF_CAP_BYTES: return tr->capacity_records * tr->record_bytes;
	case TF_USED_BYTES: return tr->used_records * tr->record_bytes;
	case TF_HITS: return tr->hits;
	case TF_RECORDS_IN: return tr->records_in;
	case TF_BYTES_IN: return tr->bytes_in;
	case TF_BYTES_OUT: return tr->bytes_out;
	case TF_IO_ERRORS: return tr->io_errors;
	case TF_VERIFY: return tr->verify_failed;
	case TF_STALE: return tr->stale;
	case TF_DROPPED: return tr->dropped;
	case TF_DEGRADED: return tr->degraded ? 1 : 0;
	case TF_DEGRADED_S: return tr->degraded_ms / 1000;
	}
	return 0;
}

/* a family with one series per enabled tier */
static void tier_family(struct out *o, const struct kva_tiers_stats *ts, const char *name,
			const char *type, const char *help, enum tier_field f)
{
	family(o, name, type, help);
	for (int k = 0; k < KVA_TIERS; k++)
		if (ts->tier[k].enabled)
			put(o, "%s{tier=\"%s\"} %llu\n", name, tier_name[k],
			    (unsigned long long)tier_value(&ts->tier[k], f));
}

static void host_histogram(struct out *o, struct metrics_text *t, struct agent *ag)
{
	uint32_t max = kva_arena_info(ag->a)->max_workers;
	uint64_t acc = 0, count = 0;
	double sum = 0;
	unsigned b = 0;

	for (unsigned k = 0; k < KVA__HIST_N; k++) {
		uint64_t n = 0;

		for (uint32_t s = 0; s < max; s++)
			n += atomic_load_explicit(&ag->a->fetch[s].host_hist[k], memory_order_relaxed);
		t->hist[k] = mono(&t->hist[k], n);
		count += t->hist[k];
		/* each fetch at its bucket's middle: the sum is within an eighth */
		sum += (double)t->hist[k] * (double)(kva__hist_value(k) +
						     (k + 1 < KVA__HIST_N ? kva__hist_value(k + 1)
									  : kva__hist_value(k))) / 2e9;
	}
	family(o, "kvarena_tier_fetch_duration_seconds", "histogram",
	       "Host tier fetches workers copied themselves, request to block checked; the sum "
	       "counts each at its bucket's middle (within 12.5%).");
	for (unsigned e = HIST_LE_FIRST; e <= HIST_LE_LAST; e++) {
		/* kva bucket 4 (e - 1) starts at 2^e ns: those below end by it */
		for (; b < 4 * (e - 1) && b < KVA__HIST_N; b++)
			acc += t->hist[b];
		put(o, "kvarena_tier_fetch_duration_seconds_bucket{tier=\"host\",le=\"%.10g\"} %llu\n",
		    (double)(1ull << e) / 1e9, (unsigned long long)acc);
	}
	put(o, "kvarena_tier_fetch_duration_seconds_bucket{tier=\"host\",le=\"+Inf\"} %llu\n",
	    (unsigned long long)count);
	put(o, "kvarena_tier_fetch_duration_seconds_sum{tier=\"host\"} %.9g\n", sum);
	put(o, "kvarena_tier_fetch_duration_seconds_count{tier=\"host\"} %llu\n",
	    (unsigned long long)count);
}

static void tiers_part(struct out *o, struct metrics_text *t, struct agent *ag)
{
	struct kva_tiers_stats *ts = &t->ts;
	uint64_t *m = t->mono;
	char path[LABEL_MAX];

	family(o, "kvarena_tier_info", "gauge",
	       "The tiers below the arena: host (NUMA node, huge pages), disk (its file, O_DIRECT "
	       "or buffered, preallocated). Always 1.");
	if (ts->tier[KVA_TIER_HOST].enabled)
		put(o, "kvarena_tier_info{tier=\"host\",numa_node=\"%d\",hugetlb=\"%s\"} 1\n",
		    ts->tier[KVA_TIER_HOST].numa_node,
		    ts->tier[KVA_TIER_HOST].hugetlb ? "true" : "false");
	if (ts->tier[KVA_TIER_DISK].enabled)
		put(o, "kvarena_tier_info{tier=\"disk\",path=\"%s\",io=\"%s\",preallocated=\"%s\"} 1\n",
		    label(ts->tier[KVA_TIER_DISK].path, path),
		    ts->tier[KVA_TIER_DISK].direct ? "direct" : "buffered",
		    ts->tier[KVA_TIER_DISK].preallocated ? "true" : "false");
	/* the counters, monotonic per tier */
	for (int k = 0; k < KVA_TIERS; k++) {
		struct kva_tier_stats *tr = &ts->tier[k];
		uint64_t *tm = &m[M_TIER + k * TM_N];

		tr->hits = mono(&tm[TM_HITS], tr->hits);
		tr->records_in = mono(&tm[TM_RECORDS_IN], tr->records_in);
		tr->bytes_in = mono(&tm[TM_BYTES_IN], tr->bytes_in);
		tr->bytes_out = mono(&tm[TM_BYTES_OUT], tr->bytes_out);
		tr->io_errors = mono(&tm[TM_IO_ERRORS], tr->io_errors);
		tr->verify_failed = mono(&tm[TM_VERIFY], tr->verify_failed);
		tr->stale = mono(&tm[TM_STALE], tr->stale);
		tr->dropped = mono(&tm[TM_DROPPED], tr->dropped);
	}
	tier_family(o, ts, "kvarena_tier_capacity_records", "gauge", "Records a tier holds.",
		    TF_CAP_RECORDS);
	tier_family(o, ts, "kvarena_tier_records", "gauge", "Records in use in a tier.", TF_RECORDS);
	tier_family(o, ts, "kvarena_tier_record_bytes", "gauge",
		    "Bytes of one record (a 4 KiB header and the block, padded to 4 KiB).",
		    TF_RECORD_BYTES);
	tier_family(o, ts, "kvarena_tier_capacity_bytes", "gauge", "Bytes a tier holds.",
		    TF_CAP_BYTES);
	tier_family(o, ts, "kvarena_tier_used_bytes", "gauge", "Bytes of the records in use.",
		    TF_USED_BYTES);
	tier_family(o, ts, "kvarena_tier_hits_total", "counter",
		    "Blocks fetched from a tier into the arena, checked.", TF_HITS);
	tier_family(o, ts, "kvarena_tier_records_written_total", "counter",
		    "Records written into a tier.", TF_RECORDS_IN);
	tier_family(o, ts, "kvarena_tier_written_bytes_total", "counter",
		    "Bytes written into a tier.", TF_BYTES_IN);
	tier_family(o, ts, "kvarena_tier_read_bytes_total", "counter", "Bytes read out of a tier.",
		    TF_BYTES_OUT);
	tier_family(o, ts, "kvarena_tier_io_errors_total", "counter",
		    "Failed or short reads and writes, and ENOSPC.", TF_IO_ERRORS);
	tier_family(o, ts, "kvarena_tier_verify_failures_total", "counter",
		    "Records that did not verify (dropped, never served).", TF_VERIFY);
	tier_family(o, ts, "kvarena_tier_stale_total", "counter",
		    "Fetches of a record replaced since.", TF_STALE);
	tier_family(o, ts, "kvarena_tier_dropped_records_total", "counter",
		    "Records given up: the tier full, nothing below it.", TF_DROPPED);
	tier_family(o, ts, "kvarena_tier_degraded", "gauge",
		    "1 while a tier is degraded (I/O failed: no new writes until a probe works).",
		    TF_DEGRADED);
	tier_family(o, ts, "kvarena_tier_degraded_seconds", "gauge",
		    "How long a tier has been degraded (0: it is not).", TF_DEGRADED_S);
	if (ts->tier[KVA_TIER_DISK].enabled) {
		const struct kva_tier_stats *d = &ts->tier[KVA_TIER_DISK];

		family(o, "kvarena_tier_warming", "gauge",
		       "1 while the disk tier scans the records of an earlier run.");
		put(o, "kvarena_tier_warming{tier=\"disk\"} %d\n", d->warming ? 1 : 0);
		family(o, "kvarena_tier_restart_records", "gauge",
		       "Records of an earlier run the disk tier found valid or dropped at start.");
		put(o, "kvarena_tier_restart_records{tier=\"disk\",result=\"found\"} %llu\n",
		    (unsigned long long)d->restart_found);
		put(o, "kvarena_tier_restart_records{tier=\"disk\",result=\"dropped\"} %llu\n",
		    (unsigned long long)d->restart_dropped);
	}
	/* quantiles as gauges of their own: a "quantile" label is a summary's */
	for (int q = 0; q < 2; q++) {
		const char *name = q ? "kvarena_tier_fetch_p99_seconds" : "kvarena_tier_fetch_p50_seconds";

		family(o, name, "gauge", q ? "Fetch latency, 99th percentile since the agent started "
					     "(request posted to block served)."
					   : "Fetch latency, median since the agent started (request "
					     "posted to block served).");
		for (int k = 0; k < KVA_TIERS; k++)
			if (ts->tier[k].enabled)
				put(o, "%s{tier=\"%s\"} %.9g\n", name, tier_name[k],
				    (double)(q ? ts->tier[k].fetch_p99_ns : ts->tier[k].fetch_p50_ns) / 1e9);
	}
	/* on a GPU arena the agent copies every fetch: the workers count none */
	if (kva_arena_info(ag->a)->backend == KVA_BACKEND_HOST && ts->tier[KVA_TIER_HOST].enabled)
		host_histogram(o, t, ag);
	family(o, "kvarena_tier_index_entries", "gauge",
	       "Prefix index entries naming a copy in a tier.");
	put(o, "kvarena_tier_index_entries{tier=\"host\"} %llu\n", (unsigned long long)ts->spilled_host);
	put(o, "kvarena_tier_index_entries{tier=\"disk\"} %llu\n", (unsigned long long)ts->spilled_disk);
	family(o, "kvarena_tier_backed_blocks_total", "counter",
	       "Published blocks copied below while in the arena.");
	put(o, "kvarena_tier_backed_blocks_total %llu\n",
	    (unsigned long long)mono(&m[M_BACKED], ts->backed));
	family(o, "kvarena_tier_back_skipped_blocks_total", "counter",
	       "Published blocks not copied (gone before the agent came to them).");
	put(o, "kvarena_tier_back_skipped_blocks_total %llu\n",
	    (unsigned long long)mono(&m[M_BACK_SKIPPED], ts->back_skipped));
	family(o, "kvarena_tier_unbacked_evictions_total", "counter",
	       "Cached blocks evicted before a copy was made below: lost.");
	put(o, "kvarena_tier_unbacked_evictions_total %llu\n",
	    (unsigned long long)mono(&m[M_UNBACKED], ts->unbacked_evictions));
	family(o, "kvarena_tier_found_blocks_total", "counter", "Full blocks matches found below.");
	put(o, "kvarena_tier_found_blocks_total %llu\n",
	    (unsigned long long)mono(&m[M_BELOW], ts->below_found));
	family(o, "kvarena_tier_fetched_blocks_total", "counter",
	       "Blocks fetches brought up (ok) or did not (failed).");
	put(o, "kvarena_tier_fetched_blocks_total{result=\"ok\"} %llu\n",
	    (unsigned long long)mono(&m[M_FETCHED], ts->fetched));
	put(o, "kvarena_tier_fetched_blocks_total{result=\"failed\"} %llu\n",
	    (unsigned long long)mono(&m[M_FETCH_FAILED], ts->fetch_failed));
	family(o, "kvarena_tier_fetch_requests_total", "counter",
	       "Fetch requests the agent took from workers.");
	put(o, "kvarena_tier_fetch_requests_total %llu\n",
	    (unsigned long long)mono(&m[M_FETCH_REQUESTS], ts->fetch_requests));
}

/* ------------------------------------------------------------ the server */

static void http_part(struct out *o, const struct metrics_http *h)
{
	family(o, "kvarena_metrics_requests_total", "counter",
	       "Requests to the metrics server, by the status they were answered.");
	for (unsigned k = 0; k < MA_N; k++)
		put(o, "kvarena_metrics_requests_total{code=\"%s\"} %llu\n", metrics_answer_code[k],
		    (unsigned long long)h->answers[k]);
	family(o, "kvarena_metrics_connections", "gauge", "Connections to the metrics server.");
	put(o, "kvarena_metrics_connections %u\n", h->connections);
	family(o, "kvarena_metrics_connections_cut_total", "counter",
	       "Connections shut down because a request took too long to arrive or to leave.");
	put(o, "kvarena_metrics_connections_cut_total %llu\n", (unsigned long long)h->cut);
	family(o, "kvarena_metrics_pauses_total", "counter",
	       "Times the metrics server woke the agent's loop too often (out of descriptors, a "
	       "flood) and was left unwatched for a while (100 ms, doubling to 1 s).");
	put(o, "kvarena_metrics_pauses_total %llu\n", (unsigned long long)h->paused);
	family(o, "kvarena_metrics_renders_total", "counter",
	       "Times this text was made (at most once a second; scrapes in between get the "
	       "same).");
	put(o, "kvarena_metrics_renders_total %llu\n", (unsigned long long)h->renders);
	family(o, "kvarena_metrics_render_seconds", "gauge",
	       "How long the previous text took to make (it scans every block and index entry).");
	put(o, "kvarena_metrics_render_seconds %.6f\n", h->render_seconds);
}

/* ------------------------------------------------------------ entry points */

struct metrics_text *metrics_text_new(void)
{
	struct metrics_text *t = calloc(1, sizeof(*t));

	if (t)
		t->start_time = process_start_time();
	return t;
}

void metrics_text_free(struct metrics_text *t)
{
	free(t);
}

int metrics_text_render(struct metrics_text *t, struct agent *ag, const struct metrics_http *http,
			char **out, size_t *len)
{
	struct out o = { .cap = t->last_len ? t->last_len + t->last_len / 4 : 64 * 1024 };

	if (!(o.buf = malloc(o.cap)))
		return -ENOMEM;
	if (kva_arena_stats(ag->a, &t->st) < 0)
		memset(&t->st, 0, sizeof(t->st));
	if (kva_arena_prefix_stats(ag->a, &t->ps) < 0)
		memset(&t->ps, 0, sizeof(t->ps));
	gather_workers(t, ag);
	agent_part(&o, t, ag);
	blocks_part(&o, t, ag);
	workers_part(&o, t);
	prefix_part(&o, t, ag);
	if (ag->tiers && kva_arena_tier_stats(ag->a, &t->ts) == 0)
		tiers_part(&o, t, ag);
	http_part(&o, http);
	process(&o, t);
	if (o.oom) {
		free(o.buf);
		return -ENOMEM;
	}
	t->last_len = o.len;
	*out = o.buf;
	*len = o.len;
	return 0;
}
