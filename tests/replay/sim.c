/* SPDX-License-Identifier: MIT */
/*
 * sim.c - Mooncake-format traces in, hit ratios out: the loader, a
 * conversation-style trace generator, and a one-request-at-a-time prefix
 * cache simulator with the policies of sim.h.
 *
 * Nothing here runs concurrently; the point of the candidate policy's
 * simulation is that it is built only from what the arena can afford in
 * shared memory without locks (a metadata word per block, a few global
 * counters, a clock hand over block ids, a sample of K evictable blocks), so
 * that its figure here is what the arena can reach, not what an ideal
 * priority queue would.
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* getline */
#endif
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define NONE UINT32_MAX

/* ------------------------------------------------------------ id interning */

/*
 * Hash ids are arbitrary 32-bit values; everything per block below is kept
 * in arrays indexed by a dense id (0, 1, ... in order of first sight), so an
 * open-addressing map from hash id to dense id is the only hashing needed.
 */
struct idmap {
	uint64_t *slot; /* (hash id << 32) | dense id; EMPTY if free */
	size_t mask;
	uint32_t n;
};

#define IDMAP_EMPTY UINT64_MAX

static size_t idmap_home(const struct idmap *m, uint32_t key)
{
	return (size_t)(((uint64_t)key * 0x9e3779b97f4a7c15ull) >> 17) & m->mask;
}

static int idmap_grow(struct idmap *m)
{
	size_t cap = m->slot ? (m->mask + 1) * 2 : 1024;
	uint64_t *old = m->slot;
	size_t old_cap = old ? m->mask + 1 : 0;

	m->slot = malloc(cap * sizeof(*m->slot));
	if (!m->slot) {
		m->slot = old;
		return -ENOMEM;
	}
	memset(m->slot, 0xff, cap * sizeof(*m->slot));
	m->mask = cap - 1;
	for (size_t i = 0; i < old_cap; i++) {
		size_t h;

		if (old[i] == IDMAP_EMPTY)
			continue;
		for (h = idmap_home(m, (uint32_t)(old[i] >> 32)); m->slot[h] != IDMAP_EMPTY;
		     h = (h + 1) & m->mask)
			;
		m->slot[h] = old[i];
	}
	free(old);
	return 0;
}

/* the dense id of @key in *@dense, a new one if unseen. Return: 1 new, 0 seen, -ENOMEM. */
static int idmap_intern(struct idmap *m, uint32_t key, uint32_t *dense)
{
	size_t h;

	/* at most half full: probe sequences stay short */
	if (!m->slot || (size_t)m->n + 1 > (m->mask + 1) / 2) {
		int rc = idmap_grow(m);

		if (rc)
			return rc;
	}
	for (h = idmap_home(m, key); m->slot[h] != IDMAP_EMPTY; h = (h + 1) & m->mask) {
		if ((uint32_t)(m->slot[h] >> 32) == key) {
			*dense = (uint32_t)m->slot[h];
			return 0;
		}
	}
	m->slot[h] = ((uint64_t)key << 32) | m->n;
	*dense = m->n++;
	return 1;
}

static void idmap_free(struct idmap *m)
{
	free(m->slot);
	memset(m, 0, sizeof(*m));
}

static uint32_t full_blocks(const struct rp_request *q)
{
	uint32_t nf = (uint32_t)q->input_len / RP_BLOCK_TOKENS;

	return nf < q->n_hash ? nf : q->n_hash;
}

/* unique_full and total_full of @t */
static int trace_count(struct rp_trace *t)
{
	struct idmap m = { 0 };
	uint32_t dense;

	t->unique_full = t->total_full = 0;
	for (size_t i = 0; i < t->n; i++) {
		uint32_t nf = full_blocks(&t->req[i]);

		t->total_full += nf;
		for (uint32_t j = 0; j < nf; j++) {
			int rc = idmap_intern(&m, t->req[i].hash_ids[j], &dense);

			if (rc < 0) {
				idmap_free(&m);
				return rc;
			}
		}
	}
	t->unique_full = m.n;
	idmap_free(&m);
	return 0;
}

int rp_trace_truncate(struct rp_trace *t, size_t n)
{
	if (n >= t->n)
		return 0;
	for (size_t i = n; i < t->n; i++)
		free(t->req[i].hash_ids);
	t->n = n;
	return trace_count(t);
}

void rp_trace_free(struct rp_trace *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->n; i++)
		free(t->req[i].hash_ids);
	free(t->req);
	memset(t, 0, sizeof(*t));
}

static int trace_push(struct rp_trace *t, size_t *cap, const struct rp_request *q)
{
	if (t->n == *cap) {
		size_t ncap = *cap ? *cap * 2 : 1024;
		struct rp_request *r = realloc(t->req, ncap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		t->req = r;
		*cap = ncap;
	}
	t->req[t->n++] = *q;
	return 0;
}

/* ----------------------------------------------------------------- loader */

struct load_ctx {
	const char *path;
	size_t line;
	char *err;
	size_t errlen;
};

__attribute__((format(printf, 3, 4))) static int load_fail(struct load_ctx *c, int rc,
							   const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!c->err || !c->errlen)
		return rc;
	n = c->line ? snprintf(c->err, c->errlen, "%s:%zu: ", c->path, c->line)
		    : snprintf(c->err, c->errlen, "%s: ", c->path);
	if (n < 0 || (size_t)n >= c->errlen)
		return rc;
	va_start(ap, fmt);
	vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return rc;
}

/* @key of @o as an integer in [0, @max], or -1 with the error said */
static int64_t load_int(struct load_ctx *c, struct json_object *o, const char *key, int64_t max)
{
	struct json_object *v;
	int64_t x;

	if (!json_object_object_get_ex(o, key, &v))
		return load_fail(c, -1, "missing \"%s\"", key);
	if (!json_object_is_type(v, json_type_int))
		return load_fail(c, -1, "\"%s\" is not an integer", key);
	x = json_object_get_int64(v);
	/* json-c keeps values above INT64_MAX as uint64; get_int64 saturates them */
	if (x < 0 || x > max)
		return load_fail(c, -1, "\"%s\" is %s (expected 0 to %" PRId64 ")", key,
				 json_object_to_json_string(v), max);
	return x;
}

/*
 * One line's object into @q. @seen/@stamp catch an id repeated within the
 * request: a prefix hash covers everything before it, so one request cannot
 * hold the same id twice, and a trace that does is not a prefix trace.
 */
static int load_request(struct load_ctx *c, struct json_object *o, struct rp_request *q,
			struct idmap *seen, size_t **stamp, size_t *stamp_cap)
{
	struct json_object *arr;
	int64_t ts, in, out;
	size_t n, most;

	memset(q, 0, sizeof(*q));
	if (!json_object_is_type(o, json_type_object))
		return load_fail(c, -EINVAL, "not a JSON object");
	ts = load_int(c, o, "timestamp", INT64_MAX - 1);
	if (ts < 0)
		return -EINVAL;
	in = load_int(c, o, "input_length", INT32_MAX);
	if (in < 0)
		return -EINVAL;
	out = load_int(c, o, "output_length", INT32_MAX);
	if (out < 0)
		return -EINVAL;
	if (!json_object_object_get_ex(o, "hash_ids", &arr))
		return load_fail(c, -EINVAL, "missing \"hash_ids\"");
	if (!json_object_is_type(arr, json_type_array))
		return load_fail(c, -EINVAL, "\"hash_ids\" is not an array");
	n = json_object_array_length(arr);
	most = ((size_t)in + RP_BLOCK_TOKENS - 1) / RP_BLOCK_TOKENS;
	if (n > most)
		return load_fail(c, -EINVAL,
				 "%zu hash_ids for input_length %" PRId64 " (at most %zu blocks of %d)",
				 n, in, most, RP_BLOCK_TOKENS);
	if (n < (size_t)in / RP_BLOCK_TOKENS)
		return load_fail(c, -EINVAL,
				 "%zu hash_ids for input_length %" PRId64 " (%" PRId64
				 " full blocks need an id each)",
				 n, in, in / RP_BLOCK_TOKENS);
	q->ts_ms = ts;
	q->input_len = (int32_t)in;
	q->output_len = (int32_t)out;
	q->n_hash = (uint32_t)n;
	if (!n)
		return 0;
	q->hash_ids = malloc(n * sizeof(*q->hash_ids));
	if (!q->hash_ids)
		return load_fail(c, -ENOMEM, "out of memory");
	for (size_t j = 0; j < n; j++) {
		struct json_object *v = json_object_array_get_idx(arr, j);
		uint32_t dense;
		int64_t x;
		int rc;

		if (!json_object_is_type(v, json_type_int))
			goto bad_id;
		x = json_object_get_int64(v);
		if (x < 0 || x > UINT32_MAX)
			goto bad_id;
		q->hash_ids[j] = (uint32_t)x;
		rc = idmap_intern(seen, q->hash_ids[j], &dense);
		if (rc < 0)
			goto nomem;
		if (dense >= *stamp_cap) {
			size_t ncap = *stamp_cap ? *stamp_cap * 2 : 4096;
			size_t *s = realloc(*stamp, ncap * sizeof(*s));

			if (!s)
				goto nomem;
			memset(s + *stamp_cap, 0, (ncap - *stamp_cap) * sizeof(*s));
			*stamp = s;
			*stamp_cap = ncap;
		}
		if ((*stamp)[dense] == c->line) {
			load_fail(c, -EINVAL, "hash id %" PRIu32 " appears twice in hash_ids",
				  q->hash_ids[j]);
			goto fail;
		}
		(*stamp)[dense] = c->line;
		continue;
bad_id:
		load_fail(c, -EINVAL, "hash_ids[%zu] is %s (expected an integer 0 to %" PRIu32 ")",
			  j, json_object_to_json_string(v), UINT32_MAX);
		goto fail;
	}
	return 0;
nomem:
	load_fail(c, -ENOMEM, "out of memory");
	free(q->hash_ids);
	q->hash_ids = NULL;
	return -ENOMEM;
fail:
	free(q->hash_ids);
	q->hash_ids = NULL;
	return -EINVAL;
}

int rp_trace_load(const char *path, struct rp_trace *t, char *err, size_t errlen)
{
	struct load_ctx c = { .path = path ? path : "(null)", .err = err, .errlen = errlen };
	struct json_tokener *tok = NULL;
	struct idmap seen = { 0 };
	size_t *stamp = NULL, stamp_cap = 0, cap = 0, linecap = 0;
	char *line = NULL;
	ssize_t len;
	FILE *f;
	int rc = 0;

	if (err && errlen)
		err[0] = '\0';
	if (!t)
		return -EINVAL;
	memset(t, 0, sizeof(*t));
	if (!path)
		return load_fail(&c, -EINVAL, "no path");
	f = fopen(path, "r");
	if (!f) {
		rc = -errno;
		return load_fail(&c, rc, "%s", strerror(-rc));
	}
	tok = json_tokener_new();
	if (!tok) {
		rc = load_fail(&c, -ENOMEM, "out of memory");
		goto out;
	}
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
	while (errno = 0, (len = getline(&line, &linecap, f)) >= 0) {
		struct json_object *o;
		struct rp_request q;
		size_t n = (size_t)len, start = 0;

		c.line++;
		while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' ||
			     line[n - 1] == '\t'))
			n--;
		while (start < n && (line[start] == ' ' || line[start] == '\t'))
			start++;
		if (start == n)
			continue;
		if (n - start > (size_t)INT32_MAX) {
			rc = load_fail(&c, -EINVAL, "line longer than 2 GiB");
			goto out;
		}
		if (memchr(line + start, '\0', n - start)) {
			rc = load_fail(&c, -EINVAL, "a NUL byte in the line");
			goto out;
		}
		json_tokener_reset(tok);
		o = json_tokener_parse_ex(tok, line + start, (int)(n - start));
		if (!o || json_tokener_get_parse_end(tok) != n - start) {
			enum json_tokener_error je = json_tokener_get_error(tok);

			json_object_put(o);
			rc = load_fail(&c, -EINVAL, "not one JSON object: %s",
				       je == json_tokener_continue ? "it ends early"
				       : je == json_tokener_success ? "something follows it"
								    : json_tokener_error_desc(je));
			goto out;
		}
		rc = load_request(&c, o, &q, &seen, &stamp, &stamp_cap);
		json_object_put(o);
		if (rc)
			goto out;
		rc = trace_push(t, &cap, &q);
		if (rc) {
			free(q.hash_ids);
			load_fail(&c, rc, "out of memory");
			goto out;
		}
	}
	if (errno) {
		rc = -errno;
		c.line = 0;
		load_fail(&c, rc, "reading: %s", strerror(-rc));
		goto out;
	}
	c.line = 0;
	rc = trace_count(t);
	if (rc)
		load_fail(&c, rc, "out of memory");
out:
	if (rc)
		rp_trace_free(t);
	free(line);
	free(stamp);
	idmap_free(&seen);
	if (tok)
		json_tokener_free(tok);
	fclose(f);
	return rc;
}

/* -------------------------------------------------------------- generator */

/*
 * The conversation-style traffic model (rp_trace_gen_conversation). Times in
 * ms, sizes in tokens; arrivals are set for ~4 requests/s once sessions are
 * under way (the Mooncake synthetic trace has 3.9/s; the first minutes,
 * before sessions accumulate, run slower).
 *
 * - System prompts: SYS_PROMPTS templates of log-uniform 300..6000 tokens,
 *   chosen with Zipf(1) popularity. Their full blocks are the prefix blocks
 *   shared across sessions; the block where a template ends and the user's
 *   text begins belongs to the session.
 * - Sessions (about 85% of requests) start as a Poisson process. Turn t+1's
 *   input is turn t's input, turn t's answer and a new user message, so its
 *   hash ids extend turn t's. First messages are log-normal around 200
 *   tokens, later ones around 80; 8% (first) and 4% (later) are pastes of
 *   log-uniform 2k..20k tokens. Answers are log-normal around 350 tokens
 *   (at most 4096). Turns per session are geometric with mean 5 (at most
 *   40); a session also ends when its context would pass 128k tokens.
 *   Between turns: the answer's decode (20 ms/token) plus the user's think
 *   time, log-normal around 40 s (most 5 s..5 min, at most 30 min), during
 *   which other sessions' traffic interleaves.
 * - One-shot requests (about 15%): an optional system prompt (half of
 *   them), a document of log-uniform 4k..120k tokens never seen before or
 *   after, and a short question. Poisson arrivals.
 * A partial last block gets a fresh id each time (its hash covers tokens the
 * next turn's block at that position extends). Requests are sorted by
 * arrival (generation order among equal times), the first n_requests kept,
 * and ids renumbered in order of first appearance, as the Mooncake release
 * does.
 */
#define SYS_PROMPTS 12
#define CTX_MAX_TOKENS (128 * 1024)
#define TURNS_MAX 40

/* xorshift64*, seeded through splitmix64: the same stream on every machine */
struct rng {
	uint64_t s;
};

static void rng_seed(struct rng *r, uint64_t seed)
{
	uint64_t z = seed + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	r->s = (z ^ (z >> 31)) | 1;
}

static uint64_t rng_next(struct rng *r)
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 0x2545f4914f6cdd1dull;
}

/* uniform in [0, 1) */
static double rng_unit(struct rng *r)
{
	return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/*
 * exp() and a standard normal from + - * / only, so that the trace does not
 * depend on the last bit of a libm (and the tool needs no -lm).
 */
static double det_exp(double x)
{
	double r, term = 1.0, sum = 1.0;
	int k;

	if (x > 700.0)
		x = 700.0;
	if (x < -700.0)
		return 0.0;
	/* x = k ln2 + r, |r| <= ln2 / 2: the series converges in a few terms */
	k = (int)(x / 0.69314718055994530942 + (x >= 0 ? 0.5 : -0.5));
	r = x - k * 0.69314718055994530942;
	for (int i = 1; i < 20; i++) {
		term *= r / i;
		sum += term;
	}
	for (; k > 0; k--)
		sum *= 2.0;
	for (; k < 0; k++)
		sum *= 0.5;
	return sum;
}

/* Irwin-Hall: twelve uniforms less six, close enough to N(0, 1) for sizes */
static double rng_normal(struct rng *r)
{
	double s = 0.0;

	for (int i = 0; i < 12; i++)
		s += rng_unit(r);
	return s - 6.0;
}

/* ln(@x), x > 0: halve or double into [1, 2), then the atanh series */
static double det_ln(double x)
{
	double ln = 0.0, y, y2, t, s = 0.0;

	while (x >= 2.0) {
		x *= 0.5;
		ln += 0.69314718055994530942;
	}
	while (x < 1.0) {
		x *= 2.0;
		ln -= 0.69314718055994530942;
	}
	y = (x - 1.0) / (x + 1.0); /* in [0, 1/3): 40 terms are plenty */
	y2 = y * y;
	t = y;
	for (int i = 1; i < 40; i += 2) {
		s += t / i;
		t *= y2;
	}
	return ln + 2.0 * s;
}

static double rng_lognormal(struct rng *r, double median, double sigma)
{
	return median * det_exp(sigma * rng_normal(r));
}

static double rng_loguniform(struct rng *r, double lo, double hi)
{
	return lo * det_exp(det_ln(hi / lo) * rng_unit(r));
}

/* exponential, mean @mean: Poisson arrivals */
static double rng_expo(struct rng *r, double mean)
{
	return -mean * det_ln(1.0 - rng_unit(r));
}

struct gen {
	struct rng r;
	struct rp_trace t; /* generation order */
	size_t cap;
	uint32_t next_id;
	uint32_t sys_len[SYS_PROMPTS];
	uint32_t *sys_ids[SYS_PROMPTS];
	double sys_cdf[SYS_PROMPTS];
};

/* one token stream: a session's growing context, or a one-shot's input */
struct stream {
	int sys;        /* template, or -1 */
	uint32_t *ids;  /* ids of full blocks given so far (template ones unused) */
	uint32_t n, cap;
};

static int pick_sys(struct gen *g)
{
	double u = rng_unit(&g->r);
	int s = 0;

	while (s < SYS_PROMPTS - 1 && u >= g->sys_cdf[s])
		s++;
	return s;
}

/* a request of @in tokens of @st arriving at @ts_ms */
static int gen_emit(struct gen *g, struct stream *st, double ts_ms, uint32_t in, uint32_t out)
{
	uint32_t full = in / RP_BLOCK_TOKENS, nh = (in + RP_BLOCK_TOKENS - 1) / RP_BLOCK_TOKENS;
	uint32_t sys_full = st->sys >= 0 ? g->sys_len[st->sys] / RP_BLOCK_TOKENS : 0;
	struct rp_request q = {
		.ts_ms = (int64_t)ts_ms, .input_len = (int32_t)in, .output_len = (int32_t)out,
		.n_hash = nh,
	};
	int rc;

	if (full > st->cap) {
		uint32_t ncap = full * 2;
		uint32_t *ids = realloc(st->ids, ncap * sizeof(*ids));

		if (!ids)
			return -ENOMEM;
		st->ids = ids;
		st->cap = ncap;
	}
	for (; st->n < full; st->n++)
		st->ids[st->n] = st->n < sys_full ? NONE : g->next_id++;
	q.hash_ids = malloc((nh ? nh : 1) * sizeof(*q.hash_ids));
	if (!q.hash_ids)
		return -ENOMEM;
	for (uint32_t b = 0; b < full; b++)
		q.hash_ids[b] = b < sys_full ? g->sys_ids[st->sys][b] : st->ids[b];
	if (nh > full)
		q.hash_ids[full] = g->next_id++;
	rc = trace_push(&g->t, &g->cap, &q);
	if (rc)
		free(q.hash_ids);
	return rc;
}

static uint32_t tokens(double x, uint32_t most)
{
	return x < 1.0 ? 1 : x > most ? most : (uint32_t)x;
}

static int gen_session(struct gen *g, double ts)
{
	struct stream st = { .sys = pick_sys(g) };
	uint32_t ctx = g->sys_len[st.sys], turns = 1;
	int rc = 0;

	while (turns < TURNS_MAX && rng_unit(&g->r) >= 0.2)
		turns++;
	for (uint32_t t = 0; t < turns; t++) {
		bool paste = rng_unit(&g->r) < (t ? 0.04 : 0.08);
		uint32_t msg = paste ? tokens(rng_loguniform(&g->r, 2000, 20000), CTX_MAX_TOKENS)
				     : tokens(rng_lognormal(&g->r, t ? 80 : 200, 1.0), CTX_MAX_TOKENS);
		uint32_t ans = tokens(rng_lognormal(&g->r, 350, 0.7), 4096);
		double think;

		if (ctx + msg > CTX_MAX_TOKENS)
			break;
		ctx += msg;
		rc = gen_emit(g, &st, ts, ctx, ans);
		if (rc)
			break;
		ctx += ans;
		think = rng_lognormal(&g->r, 40e3, 1.0);
		ts += 20.0 * ans + (think < 30 * 60e3 ? think : 30 * 60e3);
	}
	free(st.ids);
	return rc;
}

static int gen_oneshot(struct gen *g, double ts)
{
	struct stream st = { .sys = rng_unit(&g->r) < 0.5 ? pick_sys(g) : -1 };
	uint32_t in = (st.sys >= 0 ? g->sys_len[st.sys] : 0) +
		      tokens(rng_loguniform(&g->r, 4000, 120000), 120000) +
		      tokens(rng_lognormal(&g->r, 50, 0.5), 1000);
	int rc = gen_emit(g, &st, ts, in, tokens(rng_loguniform(&g->r, 50, 500), 4096));

	free(st.ids);
	return rc;
}

struct gen_key {
	int64_t ts;
	size_t i;
};

static int gen_key_cmp(const void *a, const void *b)
{
	const struct gen_key *x = a, *y = b;

	if (x->ts != y->ts)
		return x->ts < y->ts ? -1 : 1;
	return x->i < y->i ? -1 : x->i > y->i;
}

/* sort @g's requests by arrival into @t, keep @n, renumber ids by first sight */
static int gen_finish(struct gen *g, size_t n, struct rp_trace *t)
{
	struct gen_key *key = malloc(g->t.n * sizeof(*key));
	struct idmap m = { 0 };
	int rc = -ENOMEM;

	memset(t, 0, sizeof(*t));
	if (!key)
		return -ENOMEM;
	if (n > g->t.n)
		n = g->t.n;
	t->req = malloc(n * sizeof(*t->req));
	if (!t->req)
		goto out;
	for (size_t i = 0; i < g->t.n; i++)
		key[i] = (struct gen_key){ g->t.req[i].ts_ms, i };
	qsort(key, g->t.n, sizeof(*key), gen_key_cmp);
	for (size_t i = 0; i < n; i++) {
		struct rp_request *q = &g->t.req[key[i].i];

		for (uint32_t j = 0; j < q->n_hash; j++) {
			rc = idmap_intern(&m, q->hash_ids[j], &q->hash_ids[j]);
			if (rc < 0)
				goto out;
		}
		t->req[t->n++] = *q;
		q->hash_ids = NULL; /* moved */
	}
	rc = trace_count(t);
out:
	free(key);
	idmap_free(&m);
	if (rc < 0)
		rp_trace_free(t);
	return rc < 0 ? rc : 0;
}

int rp_trace_gen_conversation(uint64_t seed, size_t n_requests, struct rp_trace *t)
{
	/* ~4 requests/s: sessions of ~5 turns carry 85% of them */
	const double session_gap = 5.0 / (0.85 * 4.0) * 1e3, oneshot_gap = 1.0 / (0.15 * 4.0) * 1e3;
	struct gen g = { 0 };
	double next_session, next_oneshot, horizon = (double)n_requests / 4.0 * 1e3, w = 0.0;
	int rc = 0;

	if (!t)
		return -EINVAL;
	memset(t, 0, sizeof(*t));
	if (!n_requests)
		return -EINVAL;
	rng_seed(&g.r, seed);
	for (int s = 0; s < SYS_PROMPTS; s++) {
		uint32_t full;

		g.sys_len[s] = tokens(rng_loguniform(&g.r, 300, 6000), 6000);
		full = g.sys_len[s] / RP_BLOCK_TOKENS;
		g.sys_ids[s] = malloc((full ? full : 1) * sizeof(uint32_t));
		if (!g.sys_ids[s]) {
			rc = -ENOMEM;
			goto out;
		}
		for (uint32_t b = 0; b < full; b++)
			g.sys_ids[s][b] = g.next_id++;
		w += 1.0 / (s + 1); /* Zipf(1) */
		g.sys_cdf[s] = w;
	}
	for (int s = 0; s < SYS_PROMPTS; s++)
		g.sys_cdf[s] /= w;
	next_session = rng_expo(&g.r, session_gap);
	next_oneshot = rng_expo(&g.r, oneshot_gap);
	/*
	 * Every request up to the horizon exists once both arrival processes
	 * have passed it; widen it until there are n_requests of those.
	 */
	for (;;) {
		size_t upto = 0;

		while (!rc && next_session <= horizon) {
			rc = gen_session(&g, next_session);
			next_session += rng_expo(&g.r, session_gap);
		}
		while (!rc && next_oneshot <= horizon) {
			rc = gen_oneshot(&g, next_oneshot);
			next_oneshot += rng_expo(&g.r, oneshot_gap);
		}
		if (rc)
			goto out;
		for (size_t i = 0; i < g.t.n; i++)
			upto += g.t.req[i].ts_ms <= (int64_t)horizon;
		if (upto >= n_requests)
			break;
		horizon *= 1.5;
	}
	rc = gen_finish(&g, n_requests, t);
out:
	for (int s = 0; s < SYS_PROMPTS; s++)
		free(g.sys_ids[s]);
	rp_trace_free(&g.t);
	return rc;
}

/* -------------------------------------------------------------- simulator */

/*
 * The candidate policy: leaf-first sampling with a reuse bonus of adaptive
 * size. Everything it reads is what the arena can keep lock-free:
 *
 * Per cached block, one metadata word (written by the publisher, a matcher,
 * the last releaser, and the evictor of a child; a hint, so a lost race
 * costs a slightly worse choice, never correctness):
 *   last    logical time (requests started) of the last publish/match/release
 *   depth   index in the prefix chain (saturating)
 *   reused  saturating count of matches; at publish, a block continuing a
 *           chain whose tail block has no other cached child inherits the
 *           tail's count (the next turn of a conversation extends a context
 *           that was itself reused)
 *   kids    cached children linked to this block (+1 at a child's publish,
 *           -1 at its eviction)
 *   parent  the parent's block id and instance (epoch), to reach its kids
 *           and to know whether it still holds the same block
 *
 * Score, lower evicted first: last + (reused ? protect : 0), deeper first
 * within equal values. `protect` is a global, in logical time, tuned so that
 * a reused block lives longer than a fresh one only while that pays:
 * every TUNE_EVERY evictions it moves by a sixteenth of the eviction age
 * towards the class (fresh or reused) whose blocks still get hits late in
 * their life (at at least half their class's eviction age), per eviction
 * and per unit of that age; it stays within [0, PROTECT_MAX eviction ages].
 *
 * Victims: the clock hand sweeps slot ids; a block is a candidate if it is
 * cached, not held, and a leaf (no cached children) or an orphan (its parent
 * gone). The first `sample` candidates are compared and the lowest goes.
 * Then the evictor remembers the victim's parent: if the next eviction finds
 * it a leaf and no worse than the runner-up of the sample, it goes without a
 * new sweep. Without the leaf rule a sample of 32 almost never holds a leaf
 * (a chain of 30 blocks has one), so sampled eviction cuts chains in the
 * middle and strands their tails: that alone costs 6-9% of LRU's hits on the
 * Mooncake trace. RP_SIM_CANDIDATE_EXACT applies the same score in exact
 * order (one heap per class), still leaves first.
 */
#define TUNE_EVERY 256   /* evictions between two steps of `protect` */
#define PROTECT_MAX 4    /* eviction ages */
#define AGE_SHIFT 6      /* eviction ages: moving averages over ~64 evictions */
#define SAMPLE_DEFAULT 32

struct meta {
	uint32_t last;
	uint16_t depth;
	uint8_t reused;
	uint8_t ref;          /* CLOCK's reference bit */
	uint32_t kids;
	uint32_t parent;      /* dense id, NONE for a root */
	uint32_t parent_inst;
};

struct blk {
	bool cached;
	uint32_t pin;         /* 1 + the request holding it: not evictable meanwhile */
	uint32_t slot;        /* slotted policies: the slot it lives in */
	uint32_t inst;        /* bumped at each publication: the block's epoch */
	uint32_t gen;         /* heap entries for other gens are stale */
	uint32_t prev, next;  /* LRU: list of evictable cached blocks, head newest */
	struct meta m;
};

struct hent {
	uint64_t key;         /* lowest first */
	uint32_t id, gen;
};

struct heap {
	struct hent *e;
	size_t n, cap;
};

/* the candidate's global counters */
struct cand {
	int64_t age_fp;       /* eviction age << AGE_SHIFT, moving average */
	int64_t cls_age_fp[2]; /* the same per class: fresh, reused */
	uint64_t cls_ev[2];   /* evictions per class since the last halving */
	uint64_t cls_late[2]; /* late hits per class since the last halving */
	uint64_t evictions;
	int64_t protect;      /* logical time a reused block is worth */
};

struct sim {
	enum rp_sim_policy p;
	uint64_t cap, ncached;
	uint32_t sample;
	bool plain;
	uint32_t nblk;
	uint32_t *blk;        /* requests' full blocks as dense ids, request i at off[i] */
	size_t *off;
	uint32_t *next;       /* Belady: next request holding blk[x] among its full blocks */
	struct blk *b;
	uint32_t cur;         /* the request being processed */
	uint32_t tick;        /* logical time: requests started */
	uint32_t head, tail;  /* LRU */
	uint32_t *slot;       /* slot -> dense id or NONE */
	uint32_t *free_slot;
	uint32_t nslots, nfree, hand;
	struct heap heap[2];  /* Belady: [0]; candidate exact: [fresh], [reused] */
	struct hent *stash;   /* heap entries set aside while looking for a victim */
	size_t nstash, stash_cap;
	struct cand c;
	uint32_t walk, walk_inst; /* sampled candidate: the last victim's parent */
	uint64_t walk_key;        /* ... and the runner-up of that sample */
	struct rp_sim_result *r;
};

const char *rp_sim_policy_name(enum rp_sim_policy p)
{
	switch (p) {
	case RP_SIM_INFINITE:
		return "infinite";
	case RP_SIM_LRU:
		return "lru";
	case RP_SIM_BELADY:
		return "belady";
	case RP_SIM_CANDIDATE:
		return "candidate";
	case RP_SIM_CLOCK:
		return "clock";
	case RP_SIM_CANDIDATE_EXACT:
		return "candidate-exact";
	case RP_SIM_BELADY_BYPASS:
		return "belady-bypass";
	case RP_SIM_POLICIES:
		break;
	}
	return "?";
}

uint64_t rp_capacity_from_fraction(const struct rp_trace *t, double f)
{
	double c;

	if (!t || !(f > 0.0))
		return 1;
	c = f * (double)t->unique_full;
	if (c >= 18446744073709551615.0)
		return UINT64_MAX;
	return c < 1.0 ? 1 : (uint64_t)c;
}

/* ---- heaps: min on (key, id); stale entries are dropped when they surface */

static bool hent_less(const struct hent *a, const struct hent *b)
{
	return a->key != b->key ? a->key < b->key : a->id < b->id;
}

static int heap_push(struct heap *h, struct hent e)
{
	size_t i;

	if (h->n == h->cap) {
		size_t ncap = h->cap ? h->cap * 2 : 4096;
		struct hent *n = realloc(h->e, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		h->e = n;
		h->cap = ncap;
	}
	for (i = h->n++; i && hent_less(&e, &h->e[(i - 1) / 2]); i = (i - 1) / 2)
		h->e[i] = h->e[(i - 1) / 2];
	h->e[i] = e;
	return 0;
}

static void heap_pop(struct heap *h)
{
	struct hent e = h->e[--h->n];
	size_t i = 0;

	for (;;) {
		size_t l = 2 * i + 1, m = l;

		if (l >= h->n)
			break;
		if (l + 1 < h->n && hent_less(&h->e[l + 1], &h->e[l]))
			m = l + 1;
		if (!hent_less(&h->e[m], &e))
			break;
		h->e[i] = h->e[m];
		i = m;
	}
	if (h->n)
		h->e[i] = e;
}

static bool held(const struct sim *s, uint32_t id)
{
	return s->b[id].pin == s->cur + 1;
}

static bool parent_alive(const struct sim *s, const struct meta *m)
{
	return m->parent == NONE ||
	       (s->b[m->parent].cached && s->b[m->parent].inst == m->parent_inst);
}

/* candidate: a leaf, or an orphan whose whole subtree is unreachable anyway */
static bool leafish(const struct sim *s, uint32_t id)
{
	return !s->b[id].m.kids || !parent_alive(s, &s->b[id].m);
}

static int stash_push(struct sim *s, struct hent e)
{
	if (s->nstash == s->stash_cap) {
		size_t ncap = s->stash_cap ? s->stash_cap * 2 : 256;
		struct hent *n = realloc(s->stash, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		s->stash = n;
		s->stash_cap = ncap;
	}
	s->stash[s->nstash++] = e;
	return 0;
}

/*
 * The top of @h that may be evicted now, or NONE; held blocks (and, if
 * @leaves, non-leaves) met on the way go to the stash, to be pushed back.
 */
static int heap_top(struct sim *s, struct heap *h, bool leaves, struct hent *top)
{
	int rc;

	while (h->n) {
		struct hent e = h->e[0];
		const struct blk *b = &s->b[e.id];

		if (!b->cached || b->gen != e.gen) {
			heap_pop(h);
			continue;
		}
		if (!held(s, e.id) && (!leaves || leafish(s, e.id))) {
			*top = e;
			return 0;
		}
		heap_pop(h);
		rc = stash_push(s, e);
		if (rc)
			return rc;
	}
	top->id = NONE;
	return 0;
}

static int unstash(struct sim *s, struct heap *h)
{
	int rc = 0;

	while (s->nstash && !rc)
		rc = heap_push(h, s->stash[--s->nstash]);
	return rc;
}

/* ---- LRU list of evictable blocks */

static void lru_unlink(struct sim *s, uint32_t id)
{
	struct blk *b = &s->b[id];

	if (b->prev != NONE)
		s->b[b->prev].next = b->next;
	else
		s->head = b->next;
	if (b->next != NONE)
		s->b[b->next].prev = b->prev;
	else
		s->tail = b->prev;
	b->prev = b->next = NONE;
}

static void lru_push_head(struct sim *s, uint32_t id)
{
	struct blk *b = &s->b[id];

	b->prev = NONE;
	b->next = s->head;
	if (s->head != NONE)
		s->b[s->head].prev = id;
	else
		s->tail = id;
	s->head = id;
}

/* ---- the candidate's score and counters */

static bool is_slotted(enum rp_sim_policy p)
{
	return p == RP_SIM_CLOCK || p == RP_SIM_CANDIDATE;
}

static bool is_cand(enum rp_sim_policy p)
{
	return p == RP_SIM_CANDIDATE || p == RP_SIM_CANDIDATE_EXACT;
}

/* recency within a class: last use, then deeper first */
static uint64_t cand_base(const struct meta *m)
{
	return ((uint64_t)m->last << 16) | (0xffffu - m->depth);
}

static uint64_t cand_score(const struct sim *s, const struct meta *m)
{
	return cand_base(m) + (m->reused ? (uint64_t)s->c.protect << 16 : 0);
}

static int64_t cls_age(const struct sim *s, int cls)
{
	return s->c.cls_age_fp[cls] >> AGE_SHIFT;
}

/* a match of @m at age tick - last: a late hit if past half its class's eviction age */
static void cand_hit(struct sim *s, const struct meta *m)
{
	int cls = m->reused > 0;

	if (2 * (int64_t)(s->tick - m->last) >= cls_age(s, cls))
		s->c.cls_late[cls]++;
}

static void cand_evicted(struct sim *s, const struct meta *m)
{
	struct cand *c = &s->c;
	int cls = m->reused > 0;
	int64_t age = (int64_t)(s->tick - m->last), unit;
	uint64_t fresh, reused;

	c->age_fp += age - (c->age_fp >> AGE_SHIFT);
	c->cls_age_fp[cls] += age - (c->cls_age_fp[cls] >> AGE_SHIFT);
	c->cls_ev[cls]++;
	if (++c->evictions % TUNE_EVERY)
		return;
	/*
	 * Late hits per eviction per unit of eviction age, reused against
	 * fresh, cross-multiplied (integers, as the arena would keep them).
	 * The class still hit late in life is the one a longer life pays for.
	 */
	reused = c->cls_late[1] * c->cls_ev[0] * (uint64_t)(cls_age(s, 0) + 1);
	fresh = c->cls_late[0] * c->cls_ev[1] * (uint64_t)(cls_age(s, 1) + 1);
	unit = (c->age_fp >> AGE_SHIFT) / 16 + 1;
	if (reused > fresh)
		c->protect += unit;
	else if (reused < fresh)
		c->protect -= unit;
	if (c->protect > PROTECT_MAX * (c->age_fp >> AGE_SHIFT))
		c->protect = PROTECT_MAX * (c->age_fp >> AGE_SHIFT);
	if (c->protect < 0)
		c->protect = 0;
	for (int i = 0; i < 2; i++) {
		c->cls_ev[i] >>= 1;
		c->cls_late[i] >>= 1;
	}
}

/* (re)link @id's metadata to its parent @parent (NONE for a root) */
static void cand_link(struct sim *s, uint32_t id, uint32_t parent)
{
	struct meta *m = &s->b[id].m;

	if (m->parent == parent && parent_alive(s, m))
		return;
	if (m->parent != NONE && parent_alive(s, m))
		s->b[m->parent].m.kids--;
	m->parent = parent;
	m->parent_inst = parent == NONE ? 0 : s->b[parent].inst;
	if (parent != NONE)
		s->b[parent].m.kids++;
}

/*
 * Belady's key for the block at @x of blk[], at @depth: the farthest next
 * use goes first, and among equal next uses (never again, or the same
 * request) the deepest, since its parent is worth at least as much. Breaking
 * those ties the other way (shallow first) loses 0.0136 at 5% on the
 * Mooncake trace. The figures (0.393 at 5%, 0.510 at 10%) are those
 * of RP_SIM_BELADY_BYPASS (0.3925, 0.5097); without bypass, as the fixed
 * semantics say, Belady gets 0.3871 and 0.5091.
 */
static uint64_t belady_key(const struct sim *s, size_t x, uint32_t depth)
{
	return ~(((uint64_t)s->next[x] << 32) | depth);
}

/* ---- victims */

static uint32_t victim_clock(struct sim *s)
{
	/* two turns clear every reference bit once */
	for (uint64_t step = 0; step < 2ull * s->nslots + 1; step++) {
		uint32_t id = s->slot[s->hand];

		s->hand = (s->hand + 1) % s->nslots;
		if (id == NONE || held(s, id))
			continue;
		if (s->b[id].m.ref) {
			s->b[id].m.ref = 0;
			continue;
		}
		return id;
	}
	return NONE;
}

static uint32_t victim_sampled(struct sim *s)
{
	uint32_t best = NONE, fallback = NONE, seen = 0;
	uint64_t best_key = UINT64_MAX, runner_up = UINT64_MAX, fallback_key = UINT64_MAX;

	/* the last victim's parent, if it is now the best thing to take */
	if (s->walk != NONE) {
		uint32_t id = s->walk;
		const struct blk *b = &s->b[id];

		s->walk = NONE;
		if (b->cached && b->inst == s->walk_inst && !held(s, id) && !b->m.kids &&
		    cand_score(s, &b->m) <= s->walk_key) {
			best = id;
			goto chosen;
		}
	}
	/* the first `sample` candidates from the hand, at most one turn */
	for (uint32_t step = 0; step < s->nslots && seen < s->sample; step++) {
		uint32_t id = s->slot[s->hand];
		uint64_t k;

		s->hand = (s->hand + 1) % s->nslots;
		if (id == NONE || held(s, id))
			continue;
		k = cand_score(s, &s->b[id].m);
		if (!s->plain && !leafish(s, id)) {
			/* only if a whole turn finds no leaf */
			if (k < fallback_key) {
				fallback_key = k;
				fallback = id;
			}
			continue;
		}
		seen++;
		if (k < best_key) {
			runner_up = best_key;
			best_key = k;
			best = id;
		} else if (k < runner_up) {
			runner_up = k;
		}
	}
	if (best == NONE)
		best = fallback;
	s->walk_key = runner_up;
chosen:
	if (!s->plain && best != NONE && s->b[best].m.parent != NONE &&
	    parent_alive(s, &s->b[best].m)) {
		s->walk = s->b[best].m.parent;
		s->walk_inst = s->b[best].m.parent_inst;
	}
	return best;
}

static int victim_exact(struct sim *s, uint32_t *victim)
{
	struct hent top[2];
	int rc;

	/* both heaps' best leaves; the stash returns to the heap it came from */
	for (int cls = 0; cls < 2; cls++) {
		rc = heap_top(s, &s->heap[cls], true, &top[cls]);
		if (!rc)
			rc = unstash(s, &s->heap[cls]);
		if (rc)
			return rc;
	}
	if (top[0].id == NONE || top[1].id == NONE)
		*victim = top[0].id == NONE ? top[1].id : top[0].id;
	else
		*victim = top[0].key <= top[1].key + ((uint64_t)s->c.protect << 16) ? top[0].id
										 : top[1].id;
	return 0;
}

/*
 * The next victim in *@victim, NONE when every cached block is the current
 * request's. *@key: Belady's key of the victim.
 */
static int pick_victim(struct sim *s, uint32_t *victim, uint64_t *key)
{
	struct hent top;
	int rc;

	*victim = NONE;
	switch (s->p) {
	case RP_SIM_LRU:
		*victim = s->tail;
		return 0;
	case RP_SIM_CLOCK:
		*victim = victim_clock(s);
		return 0;
	case RP_SIM_CANDIDATE:
		*victim = victim_sampled(s);
		return 0;
	case RP_SIM_CANDIDATE_EXACT:
		return victim_exact(s, victim);
	case RP_SIM_BELADY:
	case RP_SIM_BELADY_BYPASS:
		rc = heap_top(s, &s->heap[0], false, &top);
		if (!rc)
			rc = unstash(s, &s->heap[0]);
		*victim = top.id;
		*key = top.key;
		return rc;
	default:
		return 0;
	}
}

/* ---- the life of a block */

/* take @id out of the cache */
static void drop(struct sim *s, uint32_t id)
{
	struct blk *b = &s->b[id];

	if (s->p == RP_SIM_LRU)
		lru_unlink(s, id);
	if (is_slotted(s->p)) {
		s->slot[b->slot] = NONE;
		s->free_slot[s->nfree++] = b->slot;
	}
	if (is_cand(s->p)) {
		cand_evicted(s, &b->m);
		if (b->m.parent != NONE && parent_alive(s, &b->m))
			s->b[b->m.parent].m.kids--;
	}
	b->cached = false;
	b->gen++;
	s->ncached--;
	s->r->evictions++;
}

/* @id, cached, at @depth of the current request under @parent: hold it */
static void use(struct sim *s, uint32_t id, uint32_t depth, uint32_t parent, bool hit)
{
	struct blk *b = &s->b[id];

	b->pin = s->cur + 1;
	b->gen++;
	if (s->p == RP_SIM_LRU)
		lru_unlink(s, id);
	if (hit)
		b->m.ref = 1;
	if (is_cand(s->p)) {
		if (hit) {
			cand_hit(s, &b->m);
			if (b->m.reused < UINT8_MAX)
				b->m.reused++;
		}
		b->m.last = s->tick;
		b->m.depth = depth > 0xffff ? 0xffff : (uint16_t)depth;
		/* a block met past a gap hangs under this request's chain now */
		cand_link(s, id, parent);
	}
}

/* @id, not cached, becomes cached and held */
static void publish(struct sim *s, uint32_t id, uint32_t depth, uint32_t parent)
{
	struct blk *b = &s->b[id];

	b->cached = true;
	b->inst++;
	b->pin = s->cur + 1;
	b->gen++;
	s->ncached++;
	if (is_slotted(s->p)) {
		b->slot = s->free_slot[--s->nfree];
		s->slot[b->slot] = id;
	}
	b->m = (struct meta){
		.last = s->tick,
		.depth = depth > 0xffff ? 0xffff : (uint16_t)depth,
		.parent = NONE,
	};
	if (!is_cand(s->p))
		return;
	/*
	 * Continuing a chain whose tail has no other cached child: the
	 * continuation will be reused as that chain was (the next turn of a
	 * conversation). Under a shared prefix (a system prompt), no.
	 */
	if (parent != NONE && !s->b[parent].m.kids)
		b->m.reused = s->b[parent].m.reused;
	cand_link(s, id, parent);
}

/* the current request lets go of @id, at @x of blk[] and @depth */
static int release(struct sim *s, uint32_t id, size_t x, uint32_t depth)
{
	struct blk *b = &s->b[id];

	b->pin = 0;
	switch (s->p) {
	case RP_SIM_LRU:
		lru_push_head(s, id);
		return 0;
	case RP_SIM_BELADY:
	case RP_SIM_BELADY_BYPASS:
		return heap_push(&s->heap[0], (struct hent){ belady_key(s, x, depth), id, b->gen });
	case RP_SIM_CANDIDATE:
		b->m.last = s->tick;
		return 0;
	case RP_SIM_CANDIDATE_EXACT:
		b->m.last = s->tick;
		return heap_push(&s->heap[b->m.reused > 0],
				 (struct hent){ cand_base(&b->m), id, b->gen });
	default:
		return 0;
	}
}

static int run_request(struct sim *s, uint32_t i)
{
	const uint32_t *ids = s->blk + s->off[i];
	uint32_t nf = (uint32_t)(s->off[i + 1] - s->off[i]), k = 0, done;
	int rc = 0;

	s->cur = i;
	s->tick = i + 1;
	while (k < nf && s->b[ids[k]].cached)
		k++;
	s->r->hits += k;
	for (uint32_t j = 0; j < k; j++)
		use(s, ids[j], j, j ? ids[j - 1] : NONE, true);
	for (done = k; done < nf; done++) {
		uint32_t id = ids[done], victim;
		uint64_t key = 0;

		if (s->b[id].cached) {
			/* cached past a gap in the prefix: no hit, but no publish either */
			use(s, id, done, done ? ids[done - 1] : NONE, false);
			continue;
		}
		if (s->ncached >= s->cap) {
			rc = pick_victim(s, &victim, &key);
			if (rc)
				break;
			/*
			 * Nothing evictable: the cache holds only this request's
			 * blocks (its nf exceeds the capacity). Its remaining
			 * blocks are not published and count as not cached.
			 */
			if (victim == NONE)
				break;
			/*
			 * Belady with bypass: a block used again later than the
			 * victim is not worth the victim's place; nor are the
			 * blocks after it, which no match reaches without it.
			 */
			if (s->p == RP_SIM_BELADY_BYPASS) {
				struct hent in = { belady_key(s, s->off[i] + done, done), id, 0 };
				struct hent v = { key, victim, 0 };

				if (hent_less(&in, &v))
					break;
			}
			drop(s, victim);
		}
		publish(s, id, done, done ? ids[done - 1] : NONE);
	}
	s->r->unpublished += nf - done;
	/* leaf to root: the root is the most recent */
	for (uint32_t j = done; j-- > 0 && !rc;)
		rc = release(s, ids[j], s->off[i] + j, j);
	return rc;
}

/* blk[], off[], next[] and the per-block state of @s from @t */
static int flatten(struct sim *s, const struct rp_trace *t)
{
	struct idmap m = { 0 };
	uint32_t *last = NULL;
	size_t total = 0;
	int rc = -ENOMEM;

	if (t->n >= UINT32_MAX - 1)
		return -EINVAL;
	for (size_t i = 0; i < t->n; i++) {
		if (t->req[i].input_len < 0 || (t->req[i].n_hash && !t->req[i].hash_ids))
			return -EINVAL;
		total += full_blocks(&t->req[i]);
	}
	if (total >= UINT32_MAX)
		return -EINVAL;
	s->off = malloc((t->n + 1) * sizeof(*s->off));
	s->blk = malloc((total ? total : 1) * sizeof(*s->blk));
	s->next = malloc((total ? total : 1) * sizeof(*s->next));
	last = malloc((total ? total : 1) * sizeof(*last));
	if (!s->off || !s->blk || !s->next || !last)
		goto out;
	s->off[0] = 0;
	for (size_t i = 0; i < t->n; i++) {
		const struct rp_request *q = &t->req[i];
		uint32_t nf = full_blocks(q);

		for (uint32_t j = 0; j < nf; j++) {
			uint32_t d;

			rc = idmap_intern(&m, q->hash_ids[j], &d);
			if (rc < 0)
				goto out;
			if (!rc && last[d] == i) {
				rc = -EINVAL; /* an id twice in one request */
				goto out;
			}
			last[d] = (uint32_t)i;
			s->blk[s->off[i] + j] = d;
		}
		s->off[i + 1] = s->off[i] + nf;
	}
	s->nblk = m.n;
	/* next uses, walking back */
	for (uint32_t d = 0; d < s->nblk; d++)
		last[d] = NONE;
	for (size_t i = t->n; i-- > 0;) {
		for (size_t x = s->off[i]; x < s->off[i + 1]; x++) {
			s->next[x] = last[s->blk[x]];
			last[s->blk[x]] = (uint32_t)i;
		}
	}
	s->b = calloc(s->nblk ? s->nblk : 1, sizeof(*s->b));
	if (!s->b) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t d = 0; d < s->nblk; d++)
		s->b[d].prev = s->b[d].next = NONE;
	rc = 0;
out:
	free(last);
	idmap_free(&m);
	return rc;
}

static int slots_init(struct sim *s)
{
	s->nslots = s->cap < s->nblk ? (uint32_t)s->cap : s->nblk;
	s->slot = malloc((s->nslots ? s->nslots : 1) * sizeof(*s->slot));
	s->free_slot = malloc((s->nslots ? s->nslots : 1) * sizeof(*s->free_slot));
	if (!s->slot || !s->free_slot)
		return -ENOMEM;
	/* the first publications fill slots 0, 1, ... */
	for (uint32_t i = 0; i < s->nslots; i++) {
		s->slot[i] = NONE;
		s->free_slot[i] = s->nslots - 1 - i;
	}
	s->nfree = s->nslots;
	return 0;
}

static void sim_free(struct sim *s)
{
	free(s->off);
	free(s->blk);
	free(s->next);
	free(s->b);
	free(s->slot);
	free(s->free_slot);
	free(s->heap[0].e);
	free(s->heap[1].e);
	free(s->stash);
}

int rp_sim_ex(const struct rp_trace *t, enum rp_sim_policy p, uint64_t capacity_blocks,
	      const struct rp_sim_opts *o, struct rp_sim_result *r)
{
	struct sim s = { .p = p, .head = NONE, .tail = NONE, .walk = NONE };
	int rc;

	if (!t || !r || (unsigned)p >= RP_SIM_POLICIES ||
	    (p != RP_SIM_INFINITE && !capacity_blocks) || (t->n && !t->req))
		return -EINVAL;
	memset(r, 0, sizeof(*r));
	s.r = r;
	s.cap = p == RP_SIM_INFINITE ? UINT64_MAX : capacity_blocks;
	s.sample = o && o->sample ? o->sample : SAMPLE_DEFAULT;
	s.plain = o && o->plain;
	rc = flatten(&s, t);
	if (!rc && is_slotted(p))
		rc = slots_init(&s);
	for (size_t i = 0; i < t->n && !rc; i++)
		rc = run_request(&s, (uint32_t)i);
	if (!rc) {
		r->full_blocks = s.off[t->n];
		r->hit_ratio = r->full_blocks ? (double)r->hits / (double)r->full_blocks : 0.0;
	} else {
		memset(r, 0, sizeof(*r));
	}
	sim_free(&s);
	return rc;
}

int rp_sim(const struct rp_trace *t, enum rp_sim_policy p, uint64_t capacity_blocks,
	   struct rp_sim_result *r)
{
	return rp_sim_ex(t, p, capacity_blocks, NULL, r);
}
