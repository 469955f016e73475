/* SPDX-License-Identifier: MIT */
/*
 * kvarena-replay - replay a Mooncake-format request trace through real worker
 * processes attached to a real kvarena-agent, and compare the prefix hit
 * ratio with what the trace itself allows at the same capacity: an unbounded
 * cache, LRU and Belady's optimum (sim.c), computed in the same run.
 *
 * Semantics (so that the figures compare with the simulations): requests are
 * taken in trace order by N workers, as fast as they go (timestamps are
 * compressed to nothing; the order is kept). A request matches its longest
 * cached prefix of full trace blocks (512 tokens; the last, partial block is
 * never matched nor published unless input_length is a multiple of 512),
 * reserves and appends the rest of its input (publishing each full block),
 * then decodes output_length tokens by reserving a block whenever the last
 * one fills (not published), and closes. Token ids are synthesised from the
 * hash ids, deterministically. Every published block carries a stamp of its
 * key, written before publication, which every matcher checks.
 *
 * With tiers (--host-fraction, --disk-fraction) the agent keeps evicted
 * blocks in host memory and on disk; a request fetches what its match finds
 * below (waiting up to --fetch-timeout) before computing the rest, and a
 * token served from any tier counts as a hit (hit_ratio; hit_ratio_t1 counts
 * the arena's alone). The fetched blocks' stamps are checked too.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvarena.h"
#include "sim.h"

#define TRACE_BLOCK 512u
#define MAX_WORKERS 32

#ifndef KVA_REPLAY_AGENT
#define KVA_REPLAY_AGENT "kvarena-agent"
#endif

struct opts {
	const char *trace, *socket, *agent, *policy;
	uint64_t conversation_seed;
	size_t conversation_requests;
	bool conversation;
	uint64_t capacity_blocks;
	double capacity_fraction;
	unsigned workers;
	uint32_t block_tokens;
	size_t limit;
	bool json;
	double host_fraction, disk_fraction;  /* 0: no such tier */
	const char *disk_dir;
	uint32_t fetch_timeout_ms;
};

/* what workers report, in a shared anonymous mapping */
struct shared {
	_Atomic uint64_t next;        /* the next request to take */
	_Atomic uint64_t done;
	_Atomic uint64_t matched;     /* full trace blocks matched */
	_Atomic uint64_t full;        /* full trace blocks seen */
	_Atomic uint64_t bad_stamps;  /* a matched block whose bytes were not its key's */
	_Atomic uint64_t errors;      /* calls that failed */
	_Atomic uint64_t enospc;
	_Atomic uint64_t t1;          /* full trace blocks matched in the arena */
	_Atomic uint64_t host, disk;  /* arena blocks fetched from the host / disk tier */
	_Atomic uint64_t fetch_failed, fetch_ns, fetches;
	char first_error[256];
	_Atomic int first_error_set;
};

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvarena-replay (--trace FILE | --conversation) [options]\n"
"\n"
"Replays a request trace (Mooncake format: one JSON object a line with\n"
"timestamp, input_length, output_length, hash_ids of 512-token blocks) through\n"
"N worker processes attached to a kvarena-agent, and prints one JSON line:\n"
"requests, blocks, hit_ratio, evictions, policy, and from the same trace at the\n"
"same capacity infinite_ratio, lru_ratio, belady_ratio, ratio_vs_lru,\n"
"ratio_vs_belady.\n"
"\n"
"  --trace FILE             the trace\n"
"  --conversation           instead: the built-in multi-turn chat trace\n"
"                           (sim.c; --seed, --requests)\n"
"  --seed N, --requests N   of the conversation trace (default 1, 4000)\n"
"  --capacity-blocks N      cache capacity in 512-token trace blocks\n"
"  --capacity-fraction F    or: F of the trace's unique full blocks (default 0.1)\n"
"  --workers N              worker processes, 1..%d (default 4)\n"
"  --policy NAME            prefix (default) or clock: the agent's eviction policy\n"
"  --socket PATH            use the agent running there (its arena must be empty\n"
"                           and its geometry fit); default: start our own\n"
"  --agent PATH             the kvarena-agent to start (default %s)\n"
"  --block-tokens N         arena block size, a divisor of 512 (default 512);\n"
"                           below 512, arena blocks inside a request's partial\n"
"                           trace block are published too\n"
"  --limit N                the first N requests only (the simulations too)\n"
"  --host-fraction F        a host-memory tier below the arena of F of the\n"
"                           trace's unique full blocks (default 0: none)\n"
"  --disk-fraction F        a disk tier of F of them (default 0: none)\n"
"  --disk-dir DIR           where the disk tier's file goes (default /var/tmp)\n"
"  --fetch-timeout MS       how long a request waits for a fetch (default 2000)\n"
"  --json                   the JSON line only (progress goes to stderr otherwise)\n"
"  --help\n",
		MAX_WORKERS, KVA_REPLAY_AGENT);
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "trace", required_argument, NULL, 't' },
		{ "conversation", no_argument, NULL, 'C' },
		{ "seed", required_argument, NULL, 'S' },
		{ "requests", required_argument, NULL, 'R' },
		{ "capacity-blocks", required_argument, NULL, 'b' },
		{ "capacity-fraction", required_argument, NULL, 'f' },
		{ "workers", required_argument, NULL, 'w' },
		{ "policy", required_argument, NULL, 'p' },
		{ "socket", required_argument, NULL, 's' },
		{ "agent", required_argument, NULL, 'a' },
		{ "block-tokens", required_argument, NULL, 'B' },
		{ "limit", required_argument, NULL, 'L' },
		{ "host-fraction", required_argument, NULL, 'H' },
		{ "disk-fraction", required_argument, NULL, 'D' },
		{ "disk-dir", required_argument, NULL, 'd' },
		{ "fetch-timeout", required_argument, NULL, 'T' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	*o = (struct opts){ .workers = 4, .policy = "prefix", .agent = KVA_REPLAY_AGENT,
			    .capacity_fraction = 0.1, .block_tokens = TRACE_BLOCK,
			    .conversation_seed = 1, .conversation_requests = 4000,
			    .disk_dir = "/var/tmp", .fetch_timeout_ms = 2000 };
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		char *end = NULL;

		errno = 0;
		switch (c) {
		case 't': o->trace = optarg; break;
		case 'C': o->conversation = true; break;
		case 'S': o->conversation_seed = strtoull(optarg, &end, 10); break;
		case 'R': o->conversation_requests = strtoull(optarg, &end, 10); break;
		case 'b': o->capacity_blocks = strtoull(optarg, &end, 10); break;
		case 'f': o->capacity_fraction = strtod(optarg, &end); break;
		case 'w': o->workers = (unsigned)strtoul(optarg, &end, 10); break;
		case 'p': o->policy = optarg; break;
		case 's': o->socket = optarg; break;
		case 'a': o->agent = optarg; break;
		case 'B': o->block_tokens = (uint32_t)strtoul(optarg, &end, 10); break;
		case 'L': o->limit = strtoull(optarg, &end, 10); break;
		case 'H': o->host_fraction = strtod(optarg, &end); break;
		case 'D': o->disk_fraction = strtod(optarg, &end); break;
		case 'd': o->disk_dir = optarg; break;
		case 'T': o->fetch_timeout_ms = (uint32_t)strtoul(optarg, &end, 10); break;
		case 'j': o->json = true; break;
		case 'h': usage(stdout); return 1;
		default:
			fprintf(stderr, "kvarena-replay: %s: unknown flag or missing value\n",
				argv[optind - 1]);
			return -EINVAL;
		}
		if (end && (*end || errno)) {
			fprintf(stderr, "kvarena-replay: %s: not a number: %s\n", argv[optind - 2],
				optarg);
			return -EINVAL;
		}
	}
	if (optind < argc || (!o->trace == !o->conversation)) {
		fprintf(stderr, "kvarena-replay: give --trace FILE or --conversation\n");
		return -EINVAL;
	}
	if (!o->workers || o->workers > MAX_WORKERS) {
		fprintf(stderr, "kvarena-replay: --workers: 1..%d\n", MAX_WORKERS);
		return -EINVAL;
	}
	if (!o->block_tokens || TRACE_BLOCK % o->block_tokens) {
		fprintf(stderr, "kvarena-replay: --block-tokens %u: a divisor of 512\n",
			o->block_tokens);
		return -EINVAL;
	}
	if (!o->capacity_blocks && !(o->capacity_fraction > 0 && o->capacity_fraction <= 1)) {
		fprintf(stderr, "kvarena-replay: --capacity-fraction: in (0, 1]\n");
		return -EINVAL;
	}
	/* a trace block is 512 / block_tokens arena blocks, and an arena holds
	 * KVA_MAX_BLOCKS: said here, before anything starts */
	if (o->capacity_blocks > KVA_MAX_BLOCKS / (TRACE_BLOCK / o->block_tokens)) {
		fprintf(stderr, "kvarena-replay: --capacity-blocks %llu: at most %u (an arena holds "
			"%u blocks of %u tokens)\n", (unsigned long long)o->capacity_blocks,
			KVA_MAX_BLOCKS / (TRACE_BLOCK / o->block_tokens), KVA_MAX_BLOCKS,
			o->block_tokens);
		return -EINVAL;
	}
	if (!(o->host_fraction >= 0 && o->host_fraction <= 16) ||
	    !(o->disk_fraction >= 0 && o->disk_fraction <= 16)) {
		fprintf(stderr, "kvarena-replay: --host-fraction, --disk-fraction: in [0, 16]\n");
		return -EINVAL;
	}
	if (!o->fetch_timeout_ms || o->fetch_timeout_ms > 600000) {
		fprintf(stderr, "kvarena-replay: --fetch-timeout: 1..600000 ms\n");
		return -EINVAL;
	}
	if (!o->conversation_requests || o->conversation_requests > 1000000) {
		fprintf(stderr, "kvarena-replay: --requests: 1..1000000\n");
		return -EINVAL;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* token i (0..511) of the trace block with hash id @h: same id, same tokens */
static int32_t token_of(uint32_t h, uint32_t i)
{
	uint64_t x = ((uint64_t)h << 32 | i) * 0x9e3779b97f4a7c15ull;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 32;
	return (int32_t)(x & 0x7fffffff) % 128000; /* a vocabulary's range */
}

static void note_error(struct shared *sh, const char *what, int err)
{
	int zero = 0;

	atomic_fetch_add(&sh->errors, 1);
	if (atomic_compare_exchange_strong(&sh->first_error_set, &zero, 1))
		snprintf(sh->first_error, sizeof(sh->first_error), "%s: %s (%s)", what,
			 strerror(-err), kva_errmsg());
}

struct stamp {
	uint64_t key[2];
	uint64_t check;
};

static void stamp_make(const uint64_t key[2], struct stamp *s)
{
	s->key[0] = key[0];
	s->key[1] = key[1];
	s->check = key[0] * 0x9e3779b97f4a7c15ull ^ key[1];
}

/* one request, as the header comment says */
static void serve(struct kva_worker *w, const struct rp_request *r, uint32_t bt,
		  const uint64_t salt[2], uint32_t fetch_timeout_ms, struct shared *sh)
{
	struct kva_match m;
	struct kva_seq_opts so = { .kind = KVA_OWNER_INFERENCE, .model = "replay" };
	size_t n_in = (size_t)r->input_len, full_tb = n_in / TRACE_BLOCK, matched = 0;
	size_t n_tok = n_in < (size_t)r->n_hash * TRACE_BLOCK ? n_in : (size_t)r->n_hash * TRACE_BLOCK;
	int32_t *tok = malloc(sizeof(int32_t) * (n_tok + 1));
	uint64_t (*keys)[2] = calloc(n_tok / bt + 1, sizeof(*keys));
	struct kva_seq *s = NULL;
	const uint32_t *ids;
	size_t nb, nt, len;
	int ret;

	if (!tok || !keys) {
		note_error(sh, "out of memory", -ENOMEM);
		goto out;
	}
	for (size_t i = 0; i < n_tok; i++)
		tok[i] = token_of(r->hash_ids[i / TRACE_BLOCK], (uint32_t)(i % TRACE_BLOCK));
	for (size_t j = 0; j < n_tok / bt; j++)
		kva_prefix_hash(j ? keys[j - 1] : NULL, salt, tok + j * bt, bt, keys[j]);
	atomic_fetch_add(&sh->full, full_tb);
	if ((ret = kva_seq_open(w, &so, &s)) < 0) {
		note_error(sh, "kva_seq_open", ret);
		goto out;
	}
	/* only full trace blocks may match */
	if ((ret = kva_seq_match_tiers(s, tok, full_tb * TRACE_BLOCK, &m)) < 0) {
		note_error(sh, "kva_seq_match_tiers", ret);
		goto out;
	}
	matched = m.tokens;
	atomic_fetch_add(&sh->t1, matched / TRACE_BLOCK);
	/* what is below: fetched, or (failed, timed out) computed */
	if (m.below_tokens && (ret = kva_seq_fetch_start(s, 0)) == 0) {
		struct kva_fetch_result fr;

		ret = kva_seq_fetch_wait(s, (int)fetch_timeout_ms, &fr);
		if (ret == -ETIMEDOUT)
			ret = kva_seq_fetch_cancel(s, &fr);
		if (ret < 0) {
			note_error(sh, "kva_seq_fetch_wait", ret);
			goto out;
		}
		atomic_fetch_add(&sh->host, fr.host_blocks);
		atomic_fetch_add(&sh->disk, fr.disk_blocks);
		atomic_fetch_add(&sh->fetch_failed, fr.failed_blocks);
		atomic_fetch_add(&sh->fetch_ns, fr.ns);
		atomic_fetch_add(&sh->fetches, 1);
	} else if (m.below_tokens && ret != -ENOSPC && ret != -EDQUOT) {
		note_error(sh, "kva_seq_fetch_start", ret);
		goto out;
	}
	/* matched in the arena, then fetched from below: what the sequence has */
	kva_seq_block_table(s, &ids, &nb, &nt);
	matched = nt;
	for (size_t j = 0; j < matched / bt; j++) {
		struct stamp want;

		stamp_make(keys[j], &want);
		if (memcmp(kva_block_data(w, ids[j]), &want, sizeof(want)))
			atomic_fetch_add(&sh->bad_stamps, 1);
	}
	atomic_fetch_add(&sh->matched, matched / TRACE_BLOCK);
	/* prefill: the rest of the input, each new block stamped before the
	 * append that publishes it */
	if ((ret = kva_seq_reserve(s, n_tok - matched)) < 0) {
		if (ret == -ENOSPC)
			atomic_fetch_add(&sh->enospc, 1);
		else
			note_error(sh, "kva_seq_reserve", ret);
		goto out;
	}
	kva_seq_block_table(s, &ids, &nb, &nt);
	for (size_t j = matched / bt; j < n_tok / bt; j++) {
		struct stamp st;

		stamp_make(keys[j], &st);
		memcpy(kva_block_data(w, ids[j]), &st, sizeof(st));
	}
	if ((ret = kva_seq_append(s, tok + matched, n_tok - matched)) < 0) {
		note_error(sh, "kva_seq_append", ret);
		goto out;
	}
	/* decode: a block each time the last one fills; nothing published */
	len = n_tok;
	for (int32_t t = 0; t < r->output_len; t++, len++)
		if (len % bt == 0 && (ret = kva_seq_reserve(s, len - n_tok + 1)) < 0) {
			if (ret == -ENOSPC)
				atomic_fetch_add(&sh->enospc, 1);
			else
				note_error(sh, "kva_seq_reserve (decode)", ret);
			break;
		}
out:
	kva_seq_close(s);
	free(tok);
	free(keys);
}

static void worker_main(const struct opts *o, const char *socket, const struct rp_trace *t,
			struct shared *sh, unsigned k)
{
	struct kva_worker *w;
	char name[32];
	uint64_t salt[2];
	int ret;

	snprintf(name, sizeof(name), "replay-%u", k);
	if ((ret = kva_attach(socket, name, &w)) < 0) {
		note_error(sh, "kva_attach", ret);
		return;
	}
	kva_prefix_salt("replay", NULL, 0, salt);
	for (;;) {
		uint64_t i = atomic_fetch_add(&sh->next, 1);

		if (i >= t->n)
			break;
		serve(w, &t->req[i], o->block_tokens, salt, o->fetch_timeout_ms, sh);
		atomic_fetch_add(&sh->done, 1);
	}
	kva_detach(w);
}

/* our own agent: its arena holds the capacity plus what in-flight requests
 * hold outside the cache (a partial block and their decode blocks) */
static pid_t start_agent(const struct opts *o, uint64_t blocks, uint64_t limit, char *dir,
			 char *socket, size_t len, uint64_t host_bytes, uint64_t disk_bytes,
			 const char *disk_dir)
{
	char b[32], bt[16], mw[16], cl[32], hb[32], db[32];
	pid_t pid;

	snprintf(dir, 64, "/tmp/kvarena-replay-XXXXXX");
	if (!mkdtemp(dir))
		return -errno;
	snprintf(socket, len, "%s/agent.sock", dir);
	snprintf(b, sizeof(b), "%llu", (unsigned long long)blocks);
	snprintf(bt, sizeof(bt), "%u", o->block_tokens);
	/* a slot besides for our observer, and one for the agent with tiers */
	snprintf(mw, sizeof(mw), "%u", o->workers + 1 + (host_bytes || disk_bytes));
	snprintf(cl, sizeof(cl), "%llu", (unsigned long long)limit);
	snprintf(hb, sizeof(hb), "%llu", (unsigned long long)host_bytes);
	snprintf(db, sizeof(db), "%llu", (unsigned long long)disk_bytes);
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		const char *argv[40] = { o->agent, "--socket", socket, "--blocks", b,
					 "--block-tokens", bt, "--layers", "1", "--kv-heads", "1",
					 "--head-dim", "8", "--dtype", "f16", "--worker-cache", "0",
					 "--max-workers", mw, "--evict-policy", o->policy,
					 "--cache-limit", cl,
					 "--log-level", "warn", "--check-interval", "0" };
		unsigned n = 25;

		if (host_bytes) {
			argv[n++] = "--host-bytes";
			argv[n++] = hb;
		}
		if (disk_bytes) {
			argv[n++] = "--disk-dir";
			argv[n++] = disk_dir;
			argv[n++] = "--disk-bytes";
			argv[n++] = db;
		}
		argv[n] = NULL;

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		execvp(o->agent, (char *const *)argv);
		fprintf(stderr, "kvarena-replay: cannot run %s: %s (--agent PATH)\n", o->agent,
			strerror(errno));
		_exit(127);
	}
	/* up to a minute: tiers of some GiB are faulted in and pinned at start */
	for (int k = 0; k < 6000; k++) {
		struct kva_arena *a;
		int st;

		if (kva_observe(socket, &a, NULL) == 0) {
			kva_arena_close(a);
			return pid;
		}
		if (waitpid(pid, &st, WNOHANG) == pid)
			return -ECHILD;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -ETIMEDOUT;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct rp_trace t = { 0 };
	struct rp_sim_result inf, lru, bel;
	struct kva_prefix_stats ps = { 0 };
	struct kva_tiers_stats ts = { 0 };
	struct kva_arena *obs;
	struct shared *sh;
	char dir[64] = "", sock[128], err[256], disk_dir[300] = "";
	uint64_t host_bytes = 0, disk_bytes = 0;
	const char *socket;
	uint64_t cap, arena_blocks, max_out = 0, max_in = 0;
	pid_t agent = 0, pids[MAX_WORKERS];
	double t0, secs, hit;
	int ret, status = 0;

	if ((ret = parse_args(argc, argv, &o)))
		return ret > 0 ? 0 : 2;
	if (o.conversation)
		ret = rp_trace_gen_conversation(o.conversation_seed, o.conversation_requests, &t);
	else
		ret = rp_trace_load(o.trace, &t, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "kvarena-replay: %s: %s\n", o.trace ? o.trace : "conversation",
			o.trace ? err : strerror(-ret));
		return 1;
	}
	if (o.limit && o.limit < t.n)
		ret = rp_trace_truncate(&t, o.limit);
	if (ret < 0) {
		fprintf(stderr, "kvarena-replay: --limit: %s\n", strerror(-ret));
		rp_trace_free(&t);
		return 1;
	}
	if (!t.n || !t.unique_full) {
		fprintf(stderr, "kvarena-replay: the trace has no full block\n");
		rp_trace_free(&t);
		return 1;
	}
	cap = o.capacity_blocks ? o.capacity_blocks : rp_capacity_from_fraction(&t, o.capacity_fraction);
	for (size_t i = 0; i < t.n; i++) {
		if ((uint64_t)t.req[i].output_len > max_out)
			max_out = (uint64_t)t.req[i].output_len;
		if (t.req[i].n_hash > max_in)
			max_in = t.req[i].n_hash;
	}
	/* the cache holds `cap` published blocks (the agent's --cache-limit);
	 * the arena has room besides for every worker's request in flight, so
	 * that N workers see the capacity one sequential cache has */
	arena_blocks = cap * (TRACE_BLOCK / o.block_tokens) +
		       o.workers * ((uint64_t)max_in * (TRACE_BLOCK / o.block_tokens) + 2 +
				    (max_out + o.block_tokens - 1) / o.block_tokens);
	if (arena_blocks > KVA_MAX_BLOCKS) {
		fprintf(stderr, "kvarena-replay: --capacity-blocks %llu: the arena would need %llu "
			"blocks, more than %u\n", (unsigned long long)cap,
			(unsigned long long)arena_blocks, KVA_MAX_BLOCKS);
		rp_trace_free(&t);
		return 2;
	}

	/* the tiers, sized in the trace's unique blocks like the cache */
	if (o.host_fraction > 0 || o.disk_fraction > 0) {
		struct kva_geometry g = { .block_tokens = o.block_tokens, .layers = 1, .kv_heads = 1,
					  .head_dim = 8, .dtype = KVA_F16,
					  .layout = KVA_LAYOUT_BLOCK_MAJOR };
		struct kva_block_layout l;
		uint64_t per = TRACE_BLOCK / o.block_tokens, rec;

		if (kva_geometry_layout(&g, 1, &l) < 0) {
			fprintf(stderr, "kvarena-replay: geometry: %s\n", kva_errmsg());
			return 2;
		}
		rec = kva_tier_record_bytes(l.block_bytes);
		host_bytes = (uint64_t)(o.host_fraction * (double)t.unique_full) * per * rec;
		if (o.host_fraction > 0 && host_bytes < rec)
			host_bytes = rec;
		if (o.disk_fraction > 0) {
			disk_bytes = 4096 + (uint64_t)(o.disk_fraction * (double)t.unique_full) * per * rec;
			snprintf(disk_dir, sizeof(disk_dir), "%s/kvarena-replay-XXXXXX", o.disk_dir);
			if (!mkdtemp(disk_dir)) {
				fprintf(stderr, "kvarena-replay: --disk-dir %s: %s\n", o.disk_dir,
					strerror(errno));
				return 1;
			}
		}
	}

	/* the same trace at the same capacity, offline */
	rp_sim(&t, RP_SIM_INFINITE, cap, &inf);
	rp_sim(&t, RP_SIM_LRU, cap, &lru);
	/* Belady that may also decline to publish: the optimum under these
	 * semantics (a request publishes only what fits) */
	rp_sim(&t, RP_SIM_BELADY_BYPASS, cap, &bel);

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("kvarena-replay: mmap");
		return 1;
	}
	memset(sh, 0, sizeof(*sh));
	if (o.socket) {
		socket = o.socket;
	} else {
		agent = start_agent(&o, arena_blocks, cap * (TRACE_BLOCK / o.block_tokens), dir, sock,
				    sizeof(sock), host_bytes, disk_bytes, disk_dir);
		if (agent < 0) {
			fprintf(stderr, "kvarena-replay: starting %s: %s\n", o.agent,
				strerror((int)-agent));
			rmdir(dir);
			rp_trace_free(&t);
			return 1;
		}
		socket = sock;
	}
	if (!o.json)
		fprintf(stderr, "replay: %zu requests, capacity %llu trace blocks (%llu arena "
			"blocks of %u tokens), %u workers, policy %s\n", t.n,
			(unsigned long long)cap, (unsigned long long)arena_blocks, o.block_tokens,
			o.workers, o.policy);
	t0 = now_s();
	for (unsigned k = 0; k < o.workers; k++) {
		pids[k] = fork();
		if (pids[k] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			worker_main(&o, socket, &t, sh, k);
			_exit(0);
		}
	}
	while (atomic_load(&sh->done) < t.n && !o.json && isatty(STDERR_FILENO)) {
		uint64_t d = atomic_load(&sh->done), f = atomic_load(&sh->full);

		fprintf(stderr, "\r  %llu/%zu requests, hit ratio %.3f ", (unsigned long long)d, t.n,
			f ? (double)atomic_load(&sh->matched) / (double)f : 0.0);
		if (waitpid(-1, NULL, WNOHANG) > 0)
			break; /* a worker ended early: the loop below tells */
		usleep(200000);
	}
	for (unsigned k = 0; k < o.workers; k++) {
		int st;

		waitpid(pids[k], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			status = 1;
	}
	secs = now_s() - t0;
	if (!o.json && isatty(STDERR_FILENO))
		fprintf(stderr, "\n");
	if (kva_observe(socket, &obs, NULL) == 0) {
		struct kva_check_report cr;

		kva_arena_prefix_stats(obs, &ps);
		kva_arena_tier_stats(obs, &ts);
		if (kva_arena_check(obs, &cr) < 0) {
			fprintf(stderr, "kvarena-replay: arena check: %s\n", kva_errmsg());
			status = 1;
		}
		kva_arena_close(obs);
	}
	if (agent > 0) {
		kill(agent, SIGTERM);
		waitpid(agent, NULL, 0);
		rmdir(dir);
	}
	if (disk_dir[0]) {
		char file[400];

		snprintf(file, sizeof(file), "%s/kvarena-kvarena.tier", disk_dir);
		unlink(file);
		rmdir(disk_dir);
	}
	if (atomic_load(&sh->errors) || atomic_load(&sh->bad_stamps) ||
	    atomic_load(&sh->done) < t.n) {
		fprintf(stderr, "kvarena-replay: %llu errors, %llu bad stamps, %llu of %zu requests "
			"done%s%s\n", (unsigned long long)atomic_load(&sh->errors),
			(unsigned long long)atomic_load(&sh->bad_stamps),
			(unsigned long long)atomic_load(&sh->done), t.n,
			sh->first_error_set ? "; first: " : "", sh->first_error);
		status = 1;
	}
	hit = sh->full ? (double)sh->matched / (double)sh->full : 0.0;
	printf("{\"bench\":\"replay\",\"trace\":\"%s\",\"requests\":%zu,\"blocks\":%llu,"
	       "\"unique_blocks\":%llu,\"capacity_blocks\":%llu,\"capacity_fraction\":%.4f,"
	       "\"workers\":%u,\"block_tokens\":%u,\"policy\":\"%s\",\"hit_ratio\":%.4f,"
	       "\"evictions\":%llu,\"infinite_ratio\":%.4f,\"lru_ratio\":%.4f,"
	       "\"belady_ratio\":%.4f,\"ratio_vs_lru\":%.4f,\"ratio_vs_belady\":%.4f,"
	       "\"enospc\":%llu,\"bad_stamps\":%llu,\"seconds\":%.2f",
	       o.conversation ? "conversation" : o.trace, t.n, (unsigned long long)sh->full,
	       (unsigned long long)t.unique_full, (unsigned long long)cap,
	       (double)cap / (double)t.unique_full, o.workers, o.block_tokens, o.policy, hit,
	       (unsigned long long)ps.evictions, inf.hit_ratio, lru.hit_ratio, bel.hit_ratio,
	       lru.hit_ratio > 0 ? hit / lru.hit_ratio : 0.0,
	       bel.hit_ratio > 0 ? hit / bel.hit_ratio : 0.0,
	       (unsigned long long)sh->enospc, (unsigned long long)sh->bad_stamps, secs);
	/* with tiers: where the hits came from, what the fetches cost */
	printf(",\"host_fraction\":%.4f,\"disk_fraction\":%.4f,\"hit_ratio_t1\":%.4f,"
	       "\"ratio_vs_infinite\":%.4f,\"hits_host_blocks\":%llu,\"hits_disk_blocks\":%llu,"
	       "\"fetch_failed_blocks\":%llu,\"fetches\":%llu,\"fetch_bytes\":%llu,"
	       "\"fetch_seconds\":%.3f,\"backed\":%llu,\"back_skipped\":%llu,"
	       "\"unbacked_evictions\":%llu,"
	       "\"disk_direct\":%s}\n",
	       o.host_fraction, o.disk_fraction,
	       sh->full ? (double)sh->t1 / (double)sh->full : 0.0,
	       inf.hit_ratio > 0 ? hit / inf.hit_ratio : 0.0, (unsigned long long)sh->host,
	       (unsigned long long)sh->disk, (unsigned long long)sh->fetch_failed,
	       (unsigned long long)sh->fetches,
	       (unsigned long long)(ts.tier[KVA_TIER_HOST].bytes_out +
				    ts.tier[KVA_TIER_DISK].bytes_out),
	       (double)sh->fetch_ns / 1e9, (unsigned long long)ts.backed,
	       (unsigned long long)ts.back_skipped, (unsigned long long)ts.unbacked_evictions,
	       ts.tier[KVA_TIER_DISK].direct ? "true" : "false");
	if (!o.json && (o.host_fraction > 0 || o.disk_fraction > 0))
		fprintf(stderr, "replay: tiers: %.3f of the unbounded cache's hit ratio; in the arena "
			"%.3f, then %llu blocks from host memory, %llu from disk (%llu not fetched), "
			"%llu fetches in %.2f s; %llu blocks evicted before a copy was made\n",
			inf.hit_ratio > 0 ? hit / inf.hit_ratio : 0.0,
			sh->full ? (double)sh->t1 / (double)sh->full : 0.0,
			(unsigned long long)sh->host, (unsigned long long)sh->disk,
			(unsigned long long)sh->fetch_failed, (unsigned long long)sh->fetches,
			(double)sh->fetch_ns / 1e9, (unsigned long long)ts.unbacked_evictions);
	if (!o.json)
		fprintf(stderr, "replay: hit ratio %.3f with policy %s: %.3fx LRU's %.3f, %.2f of "
			"Belady's %.3f (unbounded %.3f); %llu evictions, %llu blocks matched of "
			"%llu, %.1f s\n", hit, o.policy,
			lru.hit_ratio > 0 ? hit / lru.hit_ratio : 0.0, lru.hit_ratio,
			bel.hit_ratio > 0 ? hit / bel.hit_ratio : 0.0, bel.hit_ratio, inf.hit_ratio,
			(unsigned long long)ps.evictions, (unsigned long long)sh->matched,
			(unsigned long long)sh->full, secs);
	rp_trace_free(&t);
	munmap(sh, sizeof(*sh));
	return status;
}
