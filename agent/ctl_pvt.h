/* SPDX-License-Identifier: MIT */
/*
 * ctl_pvt.h - what kvarena-ctl's commands share: the command line, the
 * observer's mapping, and how a block is drawn (one state per block, one
 * color per state) for the picture (ctl_picture.c) and the live view
 * (ctl_top.c). Everything read from shared memory is untrusted: names go
 * through text_escape() before they are printed anywhere.
 */
#ifndef KVA_CTL_PVT_H
#define KVA_CTL_PVT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvarena.h"
#include "text.h"

struct ctl {
	const char *socket;
	const char *command;
	bool json;
	uint32_t width, rows;
	/* map: a picture of the arena to this file ("-": stdout), SVG or HTML,
	 * at most this many cells (0: CTL_CELLS) */
	const char *picture;
	bool html;
	uint32_t cells;
	/* top: seconds between refreshes, refreshes to show (0: until q or a
	 * signal) */
	double interval;
	uint32_t iterations;
	struct kva_arena *a;
	struct kva_agent_info agent;
};

#define CTL_CELLS 16384u          /* the picture's default cell limit */
#define CTL_CELLS_MAX (1u << 20)

/*
 * The states a block is drawn in: one per worker slot (owned by it alone),
 * then these. A block is in exactly one: pinned wins over owned and shared
 * (what an operator asks first is "can this go?"), the tiers' transient
 * states over pinned, corrupt over everything.
 */
enum {
	CTL_FREE = KVA_MAX_WORKERS,
	CTL_SHARED,
	CTL_CACHED,
	CTL_PINNED,
	CTL_DEMOTING,
	CTL_FETCHING,
	CTL_CORRUPT,
	CTL_STATES
};

static inline unsigned ctl_state(const struct kva_block_state *b)
{
	switch (b->kind) {
	case KVA_BLOCK_FREE:
		return CTL_FREE;
	case KVA_BLOCK_OWNED:
		return b->flags & KVA_BLOCK_PINNED ? CTL_PINNED
		       : b->slot < KVA_MAX_WORKERS ? b->slot
						   : CTL_CORRUPT;
	case KVA_BLOCK_SHARED:
		return b->flags & KVA_BLOCK_PINNED ? CTL_PINNED : CTL_SHARED;
	case KVA_BLOCK_CACHED:
		return CTL_CACHED;
	case KVA_BLOCK_DEMOTING:
		return CTL_DEMOTING;
	case KVA_BLOCK_FETCHING:
		return CTL_FETCHING;
	default:
		return CTL_CORRUPT;
	}
}

/* "free", "owned" (a slot's), "shared", "cached", "pinned", "demoting",
 * "fetching", "corrupt": the names the picture and --json use */
const char *ctl_state_name(unsigned state);
/* its color, "#rrggbb"; each slot its own, stable across runs */
const char *ctl_state_color(unsigned state);
/* the legend's words for a state that is not a slot's */
const char *ctl_state_label(unsigned state);

/*
 * Counts of every block by drawn state, and of descriptor kinds as
 * kva_arena_stats counts them, from kva_arena_block_states in chunks (no
 * allocation as large as the arena). Return: 0, or a negative errno.
 */
struct ctl_census {
	uint64_t state[CTL_STATES];
	uint64_t kind[KVA_BLOCK_BAD + 1];
	uint64_t pinned;          /* blocks with KVA_BLOCK_PINNED, whatever they are drawn as */
	uint64_t refs;            /* holders, summed over the shared ones */
};
int ctl_census(struct kva_arena *a, struct ctl_census *c);

/* A name from shared memory made printable (text_escape, lossy). */
static inline const char *ctl_clean(const char *in, char *out, size_t cap)
{
	text_escape(in, out, cap, true);
	return out;
}

int ctl_picture(struct ctl *c);
int ctl_top(struct ctl *c);

#endif
