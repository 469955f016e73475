/* SPDX-License-Identifier: MIT */
/*
 * demo_engine.c - one serving engine of kvarena-demo, in its own process:
 * continuous batching over blocks of the shared arena.
 *
 * Each engine keeps up to SEQS_PER_ENGINE sequences decoding. A request
 * takes references on the system prompt's blocks (written by the parent, in
 * another process) and one kva_alloc() for the rest of its prompt; every
 * decode step adds one token to every sequence, and a sequence that crosses
 * a block boundary takes one more block. A full arena makes a new request
 * wait and preempts a decoding sequence that needs a block (it frees
 * everything and goes back in line, as vLLM's recompute preemption). Some
 * requests ask for a second sample, which shares the first one's full
 * blocks. Every block carries a stamp that is checked when it is freed.
 *
 * The engine attaches to kvarena-agent with kva_attach(), as a serving
 * engine that is not the demo's child would: nothing of the arena comes
 * through fork(). It watches its agent connection between steps, and stops
 * serving if the agent says it is stopping or is gone.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "demo.h"

/* the most blocks one sequence reaches past the system prompt */
#define SEQ_BLOCKS_MAX ((USER_TOKENS_MAX + OUTPUT_TOKENS_MAX + BLOCK_TOKENS - 1) / BLOCK_TOKENS)
/*
 * The waiting line: new requests, and preempted ones put back at the front.
 * A new request is made only when the line is empty and the batch has room,
 * and a fork's sample only joins a batch with room for it, so the requests
 * in the line and the sequences in the batch are never more than a batch.
 */
#define QUEUE_CAP SEQS_PER_ENGINE
#define ERRORS_SHOWN 5u        /* per engine, on stderr; the rest are only counted */
/* decode steps between two looks at the agent connection: a step is a few
 * microseconds, and the look a poll() that is nearly always empty */
#define AGENT_POLL_STEPS 64u

static uint64_t rng_next(uint64_t *state)
{
	return mix64(*state += 0x9e3779b97f4a7c15ull);
}

/*
 * A length in [lo, hi], skewed to short: lo + (hi - lo) * u^3 puts the median
 * at an eighth of the range and the mean at a quarter, the long tail that
 * chat traffic has.
 */
static uint32_t skewed_length(uint64_t *rng, uint32_t lo, uint32_t hi)
{
	double u = (double)(rng_next(rng) >> 11) * 0x1p-53;

	return lo + (uint32_t)((double)(hi - lo) * u * u * u + 0.5);
}

/* FNV-1a's multiply over rotated 64-bit words: every bit of every word counts */
#define CHECKSUM_SEED 0xcbf29ce484222325ull

static uint64_t checksum_add(uint64_t h, uint64_t word)
{
	return ((h << 5 | h >> 59) ^ word) * 0x100000001b3ull;
}

static uint64_t checksum_words(const uint64_t *p, size_t n)
{
	uint64_t h = CHECKSUM_SEED;

	for (size_t j = 0; j < n; j++)
		h = checksum_add(h, p[j]);
	return h;
}

/* what checksum_words() gives over system-prompt block @k as the parent wrote it */
static uint64_t prompt_checksum(uint64_t seed, uint32_t k, size_t words)
{
	uint64_t h = CHECKSUM_SEED;

	for (size_t j = 0; j < words; j++)
		h = checksum_add(h, prompt_word(seed, k, j));
	return h;
}

/*
 * The stamp at the start of every block a sequence takes (the first bytes of
 * layer 0's K page, head 0, token 0): which block, for which sequence. A
 * block that another process wrote into while we held it, or that the
 * arena handed to two holders at once, shows up as a stamp that is wrong
 * when the sequence frees it.
 */
struct stamp {
	uint64_t tag;
	uint32_t id;
	uint32_t check;
};

static uint32_t stamp_check(uint64_t tag, uint32_t id)
{
	return (uint32_t)mix64(tag ^ ((uint64_t)id << 17) ^ 0x5354414d50ull);
}

struct request {
	uint32_t user_tokens, output_tokens;
	bool fork;    /* wants a second sample: admitted when two sequences fit */
	bool sample;  /* the second sample of a forked request */
	bool waited;  /* already counted as a wait */
};

struct seq {
	bool live;
	bool sample;
	uint64_t tag;
	uint32_t user_tokens, output_tokens, generated;
	uint32_t n_blocks;                /* blocks past the system prompt */
	uint32_t ids[SEQ_BLOCKS_MAX];
	uint64_t tags[SEQ_BLOCKS_MAX];    /* the stamp each block must carry */
};

struct engine {
	struct kva_worker *w;
	struct engine_cell *cell;
	unsigned index;
	uint64_t rng, next_tag;
	uint64_t count[C_N];              /* private totals, published per step */
	unsigned errors_shown;

	uint64_t block_bytes, page_bytes, head_stride, token_stride;
	uint32_t layers, kv_heads;
	/* a block's worth of host memory: block bytes go through
	 * kva_block_read / kva_block_write, so the demo runs on a GPU arena
	 * as on host memory (the CPU never touches device memory) */
	uint8_t *scratch;

	uint32_t prompt_ids[PROMPT_BLOCKS];
	uint64_t prompt_sum[PROMPT_BLOCKS];
	bool prompt_verified;
	uint32_t prompt_next;             /* the block the next request verifies */

	struct seq seqs[SEQS_PER_ENGINE];
	unsigned active;
	struct request queue[QUEUE_CAP];
	unsigned q_head, q_len;
	uint32_t free_ids[PROMPT_BLOCKS + SEQ_BLOCKS_MAX];
};

static void engine_error(struct engine *e, enum counter c, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void engine_error(struct engine *e, enum counter c, const char *fmt, ...)
{
	va_list ap;

	e->count[c]++;
	if (e->errors_shown++ >= ERRORS_SHOWN)
		return;
	fprintf(stderr, "engine-%u (pid %d): ", e->index, (int)getpid());
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void engine_publish(struct engine *e)
{
	for (unsigned c = 0; c < C_N; c++)
		atomic_store_explicit(&e->cell->count[c], e->count[c], memory_order_relaxed);
}

static void stamp_write(struct engine *e, uint32_t id, uint64_t tag)
{
	struct stamp s = { tag, id, stamp_check(tag, id) };
	int ret = kva_block_write(e->w, id, 0, &s, sizeof(s));

	if (ret < 0)
		engine_error(e, C_API_ERRORS, "kva_block_write(%u): %s", id, kva_errmsg());
}

static bool stamp_ok(struct engine *e, uint32_t id, uint64_t tag)
{
	struct stamp s = { 0 };
	int ret = kva_block_read(e->w, id, 0, &s, sizeof(s));

	if (ret < 0)
		engine_error(e, C_API_ERRORS, "kva_block_read(%u): %s", id, kva_errmsg());
	return s.tag == tag && s.id == id && s.check == stamp_check(tag, id);
}

/*
 * verify_prompt_block - compare system-prompt block @k with what the parent
 * wrote. Another process wrote it through another mapping: this is the check
 * that sharing across processes hands out the right bytes.
 */
static void verify_prompt_block(struct engine *e, uint32_t k)
{
	if (kva_block_read(e->w, e->prompt_ids[k], 0, e->scratch, e->block_bytes) < 0)
		engine_error(e, C_API_ERRORS, "kva_block_read(%u): %s", e->prompt_ids[k],
			     kva_errmsg());
	else if (checksum_words((const uint64_t *)e->scratch, e->block_bytes / 8) != e->prompt_sum[k])
		engine_error(e, C_DATA_ERRORS, "system prompt block %u (id %u): checksum mismatch",
			     k, e->prompt_ids[k]);
}

/*
 * kv_store_token - write the K and V of one decoded token into its slot of
 * block @id, where a decode kernel reads them (each layer's K page, then its
 * V page, [kv_head][token][head_dim] in each). The caller restamps the
 * block after slot 0, whose first row holds the stamp.
 */
static void kv_store_token(struct engine *e, uint32_t id, uint32_t slot, uint64_t tag,
			   uint32_t pos)
{
	for (uint32_t l = 0; l < e->layers; l++)
		for (uint32_t h = 0; h < e->kv_heads; h++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint64_t off = (2ull * l + kv) * e->page_bytes + h * e->head_stride +
					       slot * e->token_stride;
				int byte = (int)((tag + pos * 7u + l * 3u + h) & 0xff);

				memset(e->scratch, kv ? byte ^ 0x5a : byte, e->token_stride);
				if (kva_block_write(e->w, id, off, e->scratch, e->token_stride) < 0) {
					engine_error(e, C_API_ERRORS, "kva_block_write(%u, layer %u): %s",
						     id, l, kva_errmsg());
					return;
				}
			}
}

/* drop_refs - kva_free() that cannot fail unless the arena or this program is wrong */
static void drop_refs(struct engine *e, const uint32_t *ids, uint32_t n)
{
	int ret = kva_free(e->w, ids, n);

	if (ret < 0)
		engine_error(e, C_API_ERRORS, "kva_free of %u blocks: %s (%s)", n, strerror(-ret),
			     kva_errmsg());
}

static struct seq *free_seq(struct engine *e)
{
	for (unsigned s = 0; s < SEQS_PER_ENGINE; s++)
		if (!e->seqs[s].live)
			return &e->seqs[s];
	return NULL;
}

/*
 * seq_release - check every block's stamp, then drop every reference the
 * sequence holds, system prompt included, in one kva_free().
 */
static void seq_release(struct engine *e, struct seq *s)
{
	uint32_t n;

	for (uint32_t b = 0; b < s->n_blocks; b++)
		if (!stamp_ok(e, s->ids[b], s->tags[b]))
			engine_error(e, C_DATA_ERRORS, "block %u (#%u of sequence %#" PRIx64
				     ") does not carry its stamp", s->ids[b], b, s->tag);
	memcpy(e->free_ids, e->prompt_ids, sizeof(e->prompt_ids));
	n = PROMPT_BLOCKS;
	memcpy(e->free_ids + n, s->ids, s->n_blocks * sizeof(uint32_t));
	n += s->n_blocks;
	drop_refs(e, e->free_ids, n);
	s->live = false;
	e->active--;
}

static void queue_push_back(struct engine *e, struct request r)
{
	e->queue[(e->q_head + e->q_len++) % QUEUE_CAP] = r;
}

/* a preempted sequence goes before the new requests, as in vLLM */
static void queue_push_front(struct engine *e, struct request r)
{
	e->q_head = (e->q_head + QUEUE_CAP - 1) % QUEUE_CAP;
	e->queue[e->q_head] = r;
	e->q_len++;
}

/*
 * seq_fork - start a second sample of @p (parallel sampling): its full
 * prompt blocks are immutable, so the sample takes references on them; the
 * partly filled last block is copied, since both samples write into theirs.
 * Skipped when the arena has no block for the copy.
 */
static void seq_fork(struct engine *e, struct seq *p)
{
	struct seq *c = free_seq(e);
	uint32_t full = p->user_tokens / BLOCK_TOKENS;
	bool partial = p->user_tokens % BLOCK_TOKENS != 0;
	int ret;

	if (!c)
		return;
	if ((ret = kva_share(e->w, e->prompt_ids, PROMPT_BLOCKS)) < 0) {
		engine_error(e, C_API_ERRORS, "kva_share of the system prompt: %s (%s)",
			     strerror(-ret), kva_errmsg());
		return;
	}
	if (full && (ret = kva_share(e->w, p->ids, full)) < 0) {
		engine_error(e, C_API_ERRORS, "kva_share of %u prompt blocks: %s (%s)", full,
			     strerror(-ret), kva_errmsg());
		drop_refs(e, e->prompt_ids, PROMPT_BLOCKS);
		return;
	}
	c->tag = e->next_tag++;
	if (partial) {
		ret = kva_alloc(e->w, 1, &c->ids[full]);
		if (ret < 0) {
			if (ret != -ENOSPC)
				engine_error(e, C_API_ERRORS, "kva_alloc(1): %s (%s)",
					     strerror(-ret), kva_errmsg());
			drop_refs(e, e->prompt_ids, PROMPT_BLOCKS);
			if (full)
				drop_refs(e, p->ids, full);
			return;
		}
		if (kva_block_read(e->w, p->ids[full], 0, e->scratch, e->block_bytes) < 0 ||
		    kva_block_write(e->w, c->ids[full], 0, e->scratch, e->block_bytes) < 0)
			engine_error(e, C_API_ERRORS, "copying block %u: %s", p->ids[full],
				     kva_errmsg());
		stamp_write(e, c->ids[full], c->tag);
		c->tags[full] = c->tag;
		e->count[C_BLOCKS]++;
	}
	memcpy(c->ids, p->ids, full * sizeof(uint32_t));
	memcpy(c->tags, p->tags, full * sizeof(uint64_t));
	c->live = true;
	c->sample = true;
	c->user_tokens = p->user_tokens;
	c->output_tokens = skewed_length(&e->rng, OUTPUT_TOKENS_MIN, OUTPUT_TOKENS_MAX);
	c->generated = 0;
	c->n_blocks = full + partial;
	e->active++;
	e->count[C_PREFIX_REFS] += PROMPT_BLOCKS + full;
	e->count[C_FORKS]++;
}

/*
 * engine_admit - start waiting requests while there is room in the batch:
 * references on the system prompt, one kva_alloc for the rest of the
 * prompt. A request that finds the arena full waits for a later step.
 */
static void engine_admit(struct engine *e)
{
	while (e->active < SEQS_PER_ENGINE) {
		struct request *r;
		struct seq *s = free_seq(e);
		uint32_t n;
		int ret;

		if (!e->q_len) {
			struct request fresh = {
				.user_tokens = skewed_length(&e->rng, USER_TOKENS_MIN,
							     USER_TOKENS_MAX),
				.output_tokens = skewed_length(&e->rng, OUTPUT_TOKENS_MIN,
							       OUTPUT_TOKENS_MAX),
				.fork = rng_next(&e->rng) % 100 < FORK_PERCENT,
			};

			queue_push_back(e, fresh);
		}
		r = &e->queue[e->q_head];
		/* first come, first served: a request for two samples holds
		 * the line until the batch has room for both */
		if (r->fork && e->active + 2 > SEQS_PER_ENGINE)
			return;
		n = (r->user_tokens + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
		ret = kva_alloc(e->w, n, s->ids);
		if (ret == -ENOSPC) {
			if (!r->waited)
				e->count[C_WAITS]++;
			r->waited = true;
			return;
		}
		if (ret < 0) {
			engine_error(e, C_API_ERRORS, "kva_alloc(%u): %s (%s)", n, strerror(-ret),
				     kva_errmsg());
			return;
		}
		e->count[C_BLOCKS] += n;
		if ((ret = kva_share(e->w, e->prompt_ids, PROMPT_BLOCKS)) < 0) {
			engine_error(e, C_API_ERRORS, "kva_share of the system prompt: %s (%s)",
				     strerror(-ret), kva_errmsg());
			drop_refs(e, s->ids, n);
			return;
		}
		e->count[C_PREFIX_REFS] += PROMPT_BLOCKS;
		/* every block the first time, then one per request in turn:
		 * the check keeps running without costing a whole prompt each time */
		if (!e->prompt_verified) {
			for (uint32_t k = 0; k < PROMPT_BLOCKS; k++)
				verify_prompt_block(e, k);
			e->prompt_verified = true;
		} else {
			verify_prompt_block(e, e->prompt_next++ % PROMPT_BLOCKS);
		}

		s->live = true;
		s->tag = e->next_tag++;
		s->sample = r->sample;
		s->user_tokens = r->user_tokens;
		s->output_tokens = r->output_tokens;
		s->generated = 0;
		s->n_blocks = n;
		for (uint32_t b = 0; b < n; b++) {
			stamp_write(e, s->ids[b], s->tag);
			s->tags[b] = s->tag;
		}
		e->active++;
		e->q_head = (e->q_head + 1) % QUEUE_CAP;
		e->q_len--;
		if (r->fork)
			seq_fork(e, s);
	}
}

/*
 * seq_decode - one token for @s: a new block when it crosses a block
 * boundary; preempted (everything freed, put back in line) when the arena
 * has none, as vLLM's recompute preemption.
 */
static void seq_decode(struct engine *e, struct seq *s)
{
	uint32_t pos = s->user_tokens + s->generated;
	uint32_t b = pos / BLOCK_TOKENS, slot = pos % BLOCK_TOKENS;
	int ret;

	if (b == s->n_blocks) {
		ret = kva_alloc(e->w, 1, &s->ids[b]);
		if (ret < 0) {
			struct request r = {
				.user_tokens = s->user_tokens, .output_tokens = s->output_tokens,
				.sample = s->sample,
			};

			if (ret != -ENOSPC)
				engine_error(e, C_API_ERRORS, "kva_alloc(1): %s (%s)",
					     strerror(-ret), kva_errmsg());
			seq_release(e, s);
			queue_push_front(e, r);
			e->count[C_PREEMPTIONS]++;
			return;
		}
		s->tags[b] = s->tag;
		s->n_blocks++;
		e->count[C_BLOCKS]++;
	}
	kv_store_token(e, s->ids[b], slot, s->tag, pos);
	if (slot == 0)
		stamp_write(e, s->ids[b], s->tag);
	e->count[C_TOKENS]++;
	if (++s->generated == s->output_tokens) {
		if (!s->sample)
			e->count[C_REQUESTS]++;
		seq_release(e, s);
	}
}

static void engine_step(struct engine *e)
{
	engine_admit(e);
	for (unsigned k = 0; k < SEQS_PER_ENGINE; k++)
		if (e->seqs[k].live)
			seq_decode(e, &e->seqs[k]);
	engine_publish(e);
}

/*
 * agent_gone - what the agent connection says: false while the agent serves.
 * A stopping or vanished agent ends the run for this engine (its new
 * allocations would fail with -ESHUTDOWN, or no one would reclaim it).
 */
static bool agent_gone(struct engine *e)
{
	int ret = kva_worker_poll(e->w);

	if (ret == 0)
		return false;
	engine_error(e, C_API_ERRORS, "the agent connection: %s (%s)", strerror(-ret),
		     kva_errmsg());
	return true;
}

_Noreturn void demo_engine_main(const char *socket, struct kva_arena *inherited,
				struct demo_shared *sh, unsigned index, uint64_t seed,
				pid_t parent)
{
	const struct kva_arena_info *info;
	struct engine *e;
	struct kva_stats st;
	char name[32];
	unsigned steps = 0;
	int ret;

	/* an engine lives no longer than the demo, and Ctrl-C is the parent's
	 * to handle: it stops the engines so that they leave cleanly */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_DFL);

	/* the parent's read-only mapping came through fork(): the engine
	 * gets its own from the agent, as any process would */
	if (inherited)
		kva_arena_close(inherited);
	e = calloc(1, sizeof(*e));
	if (!e)
		_exit(1);
	snprintf(name, sizeof(name), "engine-%u", index);
	if ((ret = kva_attach(socket, name, &e->w)) < 0) {
		fprintf(stderr, "%s: kva_attach(%s): %s (%s)\n", name, socket, strerror(-ret),
			kva_errmsg());
		_exit(1);
	}
	info = kva_arena_info(kva_worker_arena(e->w));
	e->cell = &sh->cells[index];
	e->index = index;
	e->rng = seed ^ mix64(index + 1);
	e->next_tag = (uint64_t)(index + 1) << 48;
	e->block_bytes = info->layout.block_bytes;
	e->page_bytes = info->layout.page_bytes;
	e->scratch = malloc(e->block_bytes);
	if (!e->scratch)
		_exit(1);
	e->head_stride = info->layout.head_stride;
	e->token_stride = info->layout.token_stride;
	e->layers = info->geometry.layers;
	e->kv_heads = info->geometry.kv_heads;
	e->cell->slot = kva_worker_slot(e->w);
	/* release: slot is written before the parent sees joined (acquire) */
	atomic_store_explicit(&e->cell->joined, 1, memory_order_release);

	/* acquire: pairs with the parent's release store after it wrote the ids */
	while (!atomic_load_explicit(&sh->prompt_ready, memory_order_acquire)) {
		if (atomic_load_explicit(&sh->stop, memory_order_relaxed))
			break;
		sleep_ns(1000000);
	}
	memcpy(e->prompt_ids, sh->prompt_ids, sizeof(e->prompt_ids));
	for (uint32_t k = 0; k < PROMPT_BLOCKS; k++)
		e->prompt_sum[k] = prompt_checksum(seed, k, e->block_bytes / 8);

	while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
		if (++steps % AGENT_POLL_STEPS == 0 && agent_gone(e))
			break;
		engine_step(e);
		/* nothing in flight: the arena is full of the others' blocks,
		 * which only time gives back */
		if (!e->active)
			sleep_ns(100000);
	}
	for (unsigned k = 0; k < SEQS_PER_ENGINE; k++)
		if (e->seqs[k].live)
			seq_release(e, &e->seqs[k]);
	/* everything is freed: the slot may own its cache's blocks, no more */
	if ((ret = kva_stats(e->w, &st)) < 0) {
		engine_error(e, C_API_ERRORS, "kva_stats: %s", strerror(-ret));
	} else {
		const struct kva_slot_stats *me = &st.slots[kva_worker_slot(e->w)];

		e->count[C_LEAKED] = me->shared;
		if (me->owned > me->cached)
			e->count[C_LEAKED] += me->owned - me->cached;
	}
	engine_publish(e);
	/* leave (the cache goes back), tell the agent, unmap */
	kva_detach(e->w);
	_exit(e->count[C_API_ERRORS] || e->count[C_DATA_ERRORS] || e->count[C_LEAKED] ? 1 : 0);
}
