/* SPDX-License-Identifier: MIT */
/*
 * ctl_picture.c - kvarena-ctl map --svg / --html: a picture of the arena a
 * browser shows at a glance. One cell per block, or per group of
 * consecutive blocks in a large arena (the group's mix drawn as stripes),
 * colored by state (ctl_pvt.h), a legend with counts, and a header with the
 * arena's name, geometry, backend, totals and the time.
 *
 * The structure is fixed so that tools (and the tests) can read it back:
 * every cell is a <rect class="cell"> with data-state (and data-slot for a
 * worker's block), data-block for a block, data-first, data-blocks and
 * data-mix for a group; the legend's entries are <g class="legend"> with
 * data-state, data-slot and data-count; the totals are the attributes of
 * <g id="totals">. Every string that came from shared memory (worker
 * names, the arena's name, a device name) is made printable and escaped.
 */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl_pvt.h"

/* ------------------------------------------------------------- states */

static const char *const fixed_name[] = {
	[CTL_FREE - CTL_FREE] = "free",
	[CTL_SHARED - CTL_FREE] = "shared",
	[CTL_CACHED - CTL_FREE] = "cached",
	[CTL_PINNED - CTL_FREE] = "pinned",
	[CTL_DEMOTING - CTL_FREE] = "demoting",
	[CTL_FETCHING - CTL_FREE] = "fetching",
	[CTL_CORRUPT - CTL_FREE] = "corrupt",
};

static const char *const fixed_label[] = {
	[CTL_FREE - CTL_FREE] = "free",
	[CTL_SHARED - CTL_FREE] = "shared (held by references)",
	[CTL_CACHED - CTL_FREE] = "cached prefix (published, no holder)",
	[CTL_PINNED - CTL_FREE] = "pinned (held by a pinned sequence)",
	[CTL_DEMOTING - CTL_FREE] = "being copied below the arena",
	[CTL_FETCHING - CTL_FREE] = "being fetched from a tier below",
	[CTL_CORRUPT - CTL_FREE] = "corrupt or stale descriptor",
};

/* Chosen apart from each other and from any slot's (the slots' are mid
 * lightness): free pale, shared dark, corrupt a red nothing else is. */
static const char *const fixed_color[] = {
	[CTL_FREE - CTL_FREE] = "#ebebeb",
	[CTL_SHARED - CTL_FREE] = "#2f3b59",
	[CTL_CACHED - CTL_FREE] = "#a8d5a2",
	[CTL_PINNED - CTL_FREE] = "#f2c14e",
	[CTL_DEMOTING - CTL_FREE] = "#9b59b6",
	[CTL_FETCHING - CTL_FREE] = "#48c9e8",
	[CTL_CORRUPT - CTL_FREE] = "#e4002b",
};

const char *ctl_state_name(unsigned state)
{
	if (state < KVA_MAX_WORKERS)
		return "owned";
	return state < CTL_STATES ? fixed_name[state - CTL_FREE] : "corrupt";
}

const char *ctl_state_label(unsigned state)
{
	return state >= CTL_FREE && state < CTL_STATES ? fixed_label[state - CTL_FREE] : "owned";
}

static uint8_t channel(double v)
{
	return (uint8_t)lround(fmin(fmax(v, 0.0), 1.0) * 255.0);
}

/*
 * A slot's color: hues a golden angle apart (neighbouring slots, the ones
 * most often live together, differ most), three lightness bands for the
 * slots past 16. The same slot gets the same color in every picture.
 */
const char *ctl_state_color(unsigned state)
{
	static char slot_color[KVA_MAX_WORKERS][8];

	if (state >= CTL_FREE)
		return state < CTL_STATES ? fixed_color[state - CTL_FREE] : fixed_color[CTL_CORRUPT - CTL_FREE];
	if (!slot_color[state][0]) {
		static const double light[] = { 0.50, 0.36, 0.64 };
		double h = fmod(200.0 + 137.508 * state, 360.0) / 60.0;
		double l = light[(state / 16) % 3], s = 0.62;
		double c = (1 - fabs(2 * l - 1)) * s, x = c * (1 - fabs(fmod(h, 2.0) - 1)), m = l - c / 2;
		double r = 0, g = 0, b = 0;

		switch ((int)h) {
		case 0: r = c, g = x; break;
		case 1: r = x, g = c; break;
		case 2: g = c, b = x; break;
		case 3: g = x, b = c; break;
		case 4: r = x, b = c; break;
		default: r = c, b = x; break;
		}
		snprintf(slot_color[state], sizeof(slot_color[state]), "#%02x%02x%02x",
			 channel(r + m), channel(g + m), channel(b + m));
	}
	return slot_color[state];
}

/* The legend's order, which a group cell's stripes follow too: free
 * first, then the workers, then the rest as they come and go. */
static unsigned ordered(unsigned i)
{
	return i == 0 ? CTL_FREE : i <= KVA_MAX_WORKERS ? i - 1 : CTL_SHARED + (i - 1 - KVA_MAX_WORKERS);
}

/* ------------------------------------------------------------- census */

#define CHUNK 65536u

static void census_add(struct ctl_census *c, const struct kva_block_state *b)
{
	c->state[ctl_state(b)]++;
	c->kind[b->kind <= KVA_BLOCK_BAD ? b->kind : KVA_BLOCK_BAD]++;
	c->pinned += !!(b->flags & KVA_BLOCK_PINNED);
	if (b->kind == KVA_BLOCK_SHARED || b->kind == KVA_BLOCK_DEMOTING ||
	    b->kind == KVA_BLOCK_FETCHING)
		c->refs += b->holders;
}

int ctl_census(struct kva_arena *a, struct ctl_census *c)
{
	uint32_t blocks = kva_arena_info(a)->blocks;
	struct kva_block_state *b = malloc(CHUNK * sizeof(*b));
	int n;

	memset(c, 0, sizeof(*c));
	if (!b)
		return -ENOMEM;
	for (uint32_t first = 0; first < blocks; first += (uint32_t)n) {
		if ((n = kva_arena_block_states(a, first, CHUNK, b)) <= 0) {
			free(b);
			return n < 0 ? n : -EIO;
		}
		for (int k = 0; k < n; k++)
			census_add(c, &b[k]);
	}
	free(b);
	return 0;
}

/* ------------------------------------------------------------ writing */

/*
 * Text from shared memory into XML (attribute or content alike): first
 * made printable UTF-8 ('?' for the rest), then the five special
 * characters as entities; U+FFFE and U+FFFF, printable to text.c but not
 * characters XML 1.0 allows, become '?' too.
 */
static void xml_text(FILE *f, const char *raw)
{
	char buf[512];
	const unsigned char *p = (const unsigned char *)ctl_clean(raw, buf, sizeof(buf));

	for (; *p; p++) {
		switch (*p) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		case '\'': fputs("&#39;", f); break;
		default:
			if (p[0] == 0xef && p[1] == 0xbf && (p[2] == 0xbe || p[2] == 0xbf)) {
				fputc('?', f);
				p += 2;
			} else {
				fputc(*p, f);
			}
		}
	}
}

struct mix {
	uint16_t state;
	uint32_t count;
};

struct cell {
	uint32_t first, n;
	uint16_t state;             /* drawn: the most common, corrupt if any */
	uint16_t nmix;              /* states present (group cells) */
	uint32_t mix;               /* their counts: mix[mix .. mix + nmix) */
	struct kva_block_state b;   /* a cell of one block: the block */
};

struct picture {
	struct ctl *c;
	const struct kva_arena_info *info;
	struct kva_stats st;
	struct kva_seq_slot_stats seq[KVA_MAX_WORKERS];
	struct kva_agent_report ar;
	enum kva_agent_state agent_state;
	uint32_t blocks, group, ncells, cols, rows, px;
	struct cell *cells;
	struct mix *mix;
	uint32_t nmix;
	struct ctl_census census;   /* from the same pass as the cells */
	char when[64];
	/* layout, in pixels */
	uint32_t grid_x, grid_y, legend_x, width, height;
};

/* one pass over the descriptors: the cells, their mixes and the totals */
static int read_cells(struct picture *p)
{
	uint32_t limit = p->c->cells ? p->c->cells : CTL_CELLS, counts[CTL_STATES];
	struct kva_block_state *b;
	uint32_t cell = 0, in_cell = 0, mix_cap;
	int n;

	p->blocks = p->info->blocks;
	p->group = p->blocks <= limit ? 1 : (p->blocks + limit - 1) / limit;
	p->ncells = (p->blocks + p->group - 1) / p->group;
	mix_cap = p->group == 1 ? 1 : p->ncells * 2; /* grows below */
	p->cells = calloc(p->ncells ? p->ncells : 1, sizeof(*p->cells));
	p->mix = malloc((size_t)mix_cap * sizeof(*p->mix));
	b = malloc(CHUNK * sizeof(*b));
	if (!p->cells || !p->mix || !b) {
		free(b);
		return -ENOMEM;
	}
	memset(counts, 0, sizeof(counts));
	for (uint32_t first = 0; first < p->blocks; first += (uint32_t)n) {
		if ((n = kva_arena_block_states(p->c->a, first, CHUNK, b)) <= 0) {
			free(b);
			return n < 0 ? n : -EIO;
		}
		for (int k = 0; k < n; k++) {
			unsigned s = ctl_state(&b[k]);
			struct cell *cl = &p->cells[cell];

			census_add(&p->census, &b[k]);
			if (!in_cell) {
				cl->first = first + (uint32_t)k;
				cl->b = b[k];
			}
			counts[s]++;
			if (++in_cell < p->group && cl->first + in_cell < p->blocks)
				continue;
			/* the cell is whole: its drawn state and its mix */
			cl->n = in_cell;
			cl->state = CTL_FREE;
			cl->mix = p->nmix;
			for (unsigned i = 0; i < CTL_STATES; i++) {
				unsigned st = ordered(i);

				if (!counts[st])
					continue;
				if (counts[st] > counts[cl->state] || !counts[cl->state])
					cl->state = (uint16_t)st;
				if (p->group > 1) {
					if (p->nmix == mix_cap) {
						struct mix *m = realloc(p->mix, (size_t)mix_cap * 2 *
										 sizeof(*m));

						if (!m) {
							free(b);
							return -ENOMEM;
						}
						p->mix = m;
						mix_cap *= 2;
					}
					p->mix[p->nmix++] = (struct mix){ (uint16_t)st, counts[st] };
					cl->nmix++;
				}
			}
			/* a corrupt descriptor must not hide behind a majority */
			if (counts[CTL_CORRUPT])
				cl->state = CTL_CORRUPT;
			memset(counts, 0, sizeof(counts));
			in_cell = 0;
			cell++;
		}
	}
	free(b);
	return 0;
}

#define MARGIN 16u
#define HEADER 124u
#define LEGEND_W 400u
#define LEGEND_LINE 20u
#define MIN_WIDTH 1000u

static void layout(struct picture *p)
{
	uint32_t cols = p->c->width;

	if (!cols) {
		/* about twice as wide as tall, whole bytes of cells a row */
		cols = (uint32_t)ceil(sqrt(2.0 * p->ncells));
		cols = (cols + 7) / 8 * 8;
		cols = cols < 8 ? 8 : cols > 128 ? 128 : cols;
	}
	if (cols > p->ncells)
		cols = p->ncells ? p->ncells : 1;
	p->cols = cols;
	p->rows = (p->ncells + cols - 1) / cols;
	p->px = 1024 / cols;
	p->px = p->px < 6 ? 6 : p->px > 24 ? 24 : p->px;
	p->grid_x = MARGIN;
	p->grid_y = HEADER;
	p->legend_x = p->grid_x + p->cols * p->px + 32;
	p->width = p->legend_x + LEGEND_W + MARGIN;
	if (p->width < MIN_WIDTH)
		p->width = MIN_WIDTH; /* room for the header's lines */
	p->height = p->grid_y + p->rows * p->px;
	/* the legend: free, the slots shown, the other states, two notes */
	{
		uint32_t lines = 10;

		for (uint32_t s = 0; s < KVA_MAX_WORKERS; s++)
			lines += p->census.state[s] || (s < p->st.max_workers &&
							p->st.slots[s].state != KVA_SLOT_FREE);
		if (p->grid_y + lines * LEGEND_LINE > p->height)
			p->height = p->grid_y + lines * LEGEND_LINE;
	}
	p->height += MARGIN + 8;
}

/* "slot 3 · engine-0 (pid 1234)", for the legend and the tooltips */
static void slot_words(FILE *f, const struct picture *p, unsigned s)
{
	const struct kva_slot_stats *w = &p->st.slots[s];

	fprintf(f, "slot %u", s);
	if (s >= p->st.max_workers || w->state == KVA_SLOT_FREE) {
		fputs(" (no worker now)", f);
		return;
	}
	fputs(" \xc2\xb7 ", f);
	xml_text(f, w->name);
	fprintf(f, " (pid %d)", w->pid);
}

static void state_words(FILE *f, const struct picture *p, unsigned s)
{
	if (s < KVA_MAX_WORKERS) {
		fputs("owned by ", f);
		slot_words(f, p, s);
	} else {
		fputs(ctl_state_label(s), f);
	}
}

/* the tooltip of a cell of one block: what it is and who holds it */
static void block_title(FILE *f, const struct picture *p, const struct cell *cl)
{
	const struct kva_block_state *b = &cl->b;
	unsigned s = cl->state, shown = 0;

	fprintf(f, "<title>block %u: ", cl->first);
	state_words(f, p, s);
	if (b->holders && (s >= KVA_MAX_WORKERS)) {
		fprintf(f, "; held by %u slot%s:", b->holders, b->holders == 1 ? "" : "s");
		for (uint64_t m = b->holder_mask; m && shown < 4; m &= m - 1, shown++) {
			fputs(shown ? ", " : " ", f);
			slot_words(f, p, (unsigned)__builtin_ctzll(m));
		}
		if (b->holders > shown)
			fprintf(f, " and %u more", b->holders - shown);
	}
	if (b->flags & KVA_BLOCK_PINNED)
		fprintf(f, "; %u reference%s of pinned sequences", b->pins, b->pins == 1 ? "" : "s");
	if (b->flags & KVA_BLOCK_PUBLISHED && s != CTL_CACHED)
		fputs("; published", f);
	fprintf(f, "; epoch %u</title>", b->epoch);
}

static void mix_attr(FILE *f, const struct picture *p, const struct cell *cl)
{
	for (uint32_t k = 0; k < cl->nmix; k++) {
		const struct mix *m = &p->mix[cl->mix + k];

		if (m->state < KVA_MAX_WORKERS)
			fprintf(f, "%sowned/%u:%u", k ? " " : "", m->state, m->count);
		else
			fprintf(f, "%s%s:%u", k ? " " : "", ctl_state_name(m->state), m->count);
	}
}

static void write_cell(FILE *f, const struct picture *p, uint32_t i)
{
	const struct cell *cl = &p->cells[i];
	uint32_t x = p->grid_x + (i % p->cols) * p->px, y = p->grid_y + (i / p->cols) * p->px;
	uint32_t side = p->px - 1, done = 0;

	if (p->group == 1) {
		fprintf(f, "<rect class=\"cell\" data-state=\"%s\"", ctl_state_name(cl->state));
		if (cl->state < KVA_MAX_WORKERS)
			fprintf(f, " data-slot=\"%u\"", cl->state);
		fprintf(f, " data-block=\"%u\" x=\"%u\" y=\"%u\" width=\"%u\" height=\"%u\" "
			"fill=\"%s\">", cl->first, x, y, side, side, ctl_state_color(cl->state));
		block_title(f, p, cl);
		fputs("</rect>\n", f);
		return;
	}
	/* a group: the cell in its drawn state's color, then a stripe per
	 * state present, top to bottom in the legend's order, as tall as its
	 * share; the tooltip on the group says the counts */
	fprintf(f, "<g><title>blocks %u to %u:", cl->first, cl->first + cl->n - 1);
	for (uint32_t k = 0; k < cl->nmix; k++) {
		const struct mix *m = &p->mix[cl->mix + k];

		fprintf(f, "%s %u ", k ? "," : "", m->count);
		state_words(f, p, m->state);
	}
	fprintf(f, "</title><rect class=\"cell\" data-state=\"%s\"", ctl_state_name(cl->state));
	if (cl->state < KVA_MAX_WORKERS)
		fprintf(f, " data-slot=\"%u\"", cl->state);
	fprintf(f, " data-first=\"%u\" data-blocks=\"%u\" data-mix=\"", cl->first, cl->n);
	mix_attr(f, p, cl);
	fprintf(f, "\" x=\"%u\" y=\"%u\" width=\"%u\" height=\"%u\" fill=\"%s\"%s/>", x, y, side,
		side, ctl_state_color(cl->state),
		cl->state == CTL_CORRUPT ? " stroke=\"#000000\" stroke-width=\"1\"" : "");
	if (cl->nmix > 1) {
		uint32_t height[CTL_STATES], sum = 0, largest = 0;

		/* each state its share of the cell, and each at least a line
		 * (one block of 64 in use is what the eye looks for), taken
		 * from the largest */
		for (uint32_t k = 0; k < cl->nmix; k++) {
			height[k] = (uint32_t)((uint64_t)side * p->mix[cl->mix + k].count / cl->n);
			if (!height[k])
				height[k] = 1;
			if (height[k] > height[largest])
				largest = k;
			sum += height[k];
		}
		if (sum > side)
			height[largest] = height[largest] > sum - side ? height[largest] - (sum - side) : 0;
		else
			height[largest] += side - sum;
		for (uint32_t k = 0; k < cl->nmix; k++) {
			uint32_t h = height[k] < side - done ? height[k] : side - done;

			if (h)
				fprintf(f, "<rect class=\"part\" x=\"%u\" y=\"%u\" width=\"%u\" "
					"height=\"%u\" fill=\"%s\"/>", x, y + done, side, h,
					ctl_state_color(p->mix[cl->mix + k].state));
			done += h;
		}
	}
	fputs("</g>\n", f);
}

/* "12.5%", and "&lt;0.1%" rather than a 0.0% that hides a few blocks */
static const char *share(uint64_t n, uint64_t of, char *out, size_t cap)
{
	double pct = of ? 100.0 * (double)n / (double)of : 0.0;

	if (n && pct < 0.05)
		snprintf(out, cap, "&lt;0.1%%");
	else
		snprintf(out, cap, "%.1f%%", pct);
	return out;
}

static void legend_entry(FILE *f, const struct picture *p, unsigned s, uint32_t *y)
{
	uint64_t n = p->census.state[s];
	char pct[16];

	fprintf(f, "<g class=\"legend\" data-state=\"%s\"", ctl_state_name(s));
	if (s < KVA_MAX_WORKERS)
		fprintf(f, " data-slot=\"%u\"", s);
	fprintf(f, " data-count=\"%llu\"><rect class=\"swatch\" x=\"%u\" y=\"%u\" width=\"14\" "
		"height=\"14\" fill=\"%s\" stroke=\"#888888\" stroke-width=\"0.5\"/>"
		"<text x=\"%u\" y=\"%u\">", (unsigned long long)n, p->legend_x, *y,
		ctl_state_color(s), p->legend_x + 22, *y + 12);
	if (s < KVA_MAX_WORKERS)
		slot_words(f, p, s);
	else
		fputs(ctl_state_label(s), f);
	fprintf(f, ": <tspan font-weight=\"bold\">%llu</tspan> (%s)</text></g>\n",
		(unsigned long long)n, share(n, p->blocks, pct, sizeof(pct)));
	*y += LEGEND_LINE;
}

static const char *dtype_layout(const struct kva_geometry *g)
{
	return g->layout == KVA_LAYOUT_BLOCK_MAJOR ? "block-major" : "layer-major";
}

static void write_svg(FILE *f, const struct picture *p, bool standalone)
{
	const struct kva_arena_info *info = p->info;
	const struct kva_geometry *g = &info->geometry;
	const struct ctl_census *cs = &p->census;
	static const char *const agent_state[] = { "none", "running", "stopping" };
	uint64_t owned = cs->kind[KVA_BLOCK_OWNED];
	uint64_t shared = cs->kind[KVA_BLOCK_SHARED] + cs->kind[KVA_BLOCK_DEMOTING] +
			  cs->kind[KVA_BLOCK_FETCHING];
	uint32_t y = p->grid_y;

	if (standalone)
		fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
	fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%u\" "
		"height=\"%u\" viewBox=\"0 0 %u %u\" font-family=\"sans-serif\" font-size=\"13\">\n",
		p->width, p->height, p->width, p->height);
	fputs("<title>kvarena arena ", f);
	xml_text(f, info->name);
	fputs("</title>\n", f);
	fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%u\" height=\"%u\" fill=\"#ffffff\"/>\n",
		p->width, p->height);
	/* the header */
	fprintf(f, "<g id=\"header\" fill=\"#222222\">\n<text x=\"%u\" y=\"%u\" font-size=\"20\" "
		"font-weight=\"bold\">kvarena arena \xe2\x80\x9c", MARGIN, MARGIN + 18);
	xml_text(f, info->name);
	fprintf(f, "\xe2\x80\x9d</text>\n<text x=\"%u\" y=\"%u\">%u blocks of %.1f KiB: %u tokens "
		"\xc3\x97 %u layers \xc3\x97 K,V \xc3\x97 %u kv heads \xc3\x97 %u \xc3\x97 %s, "
		"%s; %.1f MiB</text>\n", MARGIN, MARGIN + 40, info->blocks,
		(double)info->layout.block_bytes / 1024, g->block_tokens, g->layers, g->kv_heads,
		g->head_dim, kva_dtype_name(g->dtype), dtype_layout(g),
		(double)info->layout.data_bytes / (1 << 20));
	fprintf(f, "<text x=\"%u\" y=\"%u\">backend ", MARGIN, MARGIN + 58);
	if (info->backend == KVA_BACKEND_CUDA) {
		fputs("cuda: ", f);
		xml_text(f, info->device_name);
		fputs(", ", f);
		xml_text(f, info->device_uuid);
	} else {
		fputs("host", f);
	}
	fprintf(f, " \xc2\xb7 agent pid %d (%s) \xc2\xb7 %u of %u worker slots \xc2\xb7 ",
		p->c->agent.pid, agent_state[p->agent_state % 3], p->st.workers, p->st.max_workers);
	xml_text(f, p->when);
	fputs("</text>\n", f);
	fprintf(f, "<g id=\"totals\" data-total=\"%u\" data-free=\"%llu\" data-owned=\"%llu\" "
		"data-shared=\"%llu\" data-shared-refs=\"%llu\" data-cached=\"%llu\" "
		"data-pinned=\"%llu\" data-demoting=\"%llu\" data-fetching=\"%llu\" "
		"data-corrupt=\"%llu\"><text x=\"%u\" y=\"%u\">free %llu \xc2\xb7 owned %llu "
		"\xc2\xb7 shared %llu (%llu references) \xc2\xb7 cached prefix %llu \xc2\xb7 pinned "
		"%llu \xc2\xb7 being copied below %llu \xc2\xb7 being fetched %llu \xc2\xb7 corrupt "
		"%llu</text></g>\n", p->blocks,
		(unsigned long long)cs->kind[KVA_BLOCK_FREE], (unsigned long long)owned,
		(unsigned long long)shared, (unsigned long long)cs->refs,
		(unsigned long long)cs->kind[KVA_BLOCK_CACHED], (unsigned long long)cs->pinned,
		(unsigned long long)cs->kind[KVA_BLOCK_DEMOTING],
		(unsigned long long)cs->kind[KVA_BLOCK_FETCHING],
		(unsigned long long)cs->kind[KVA_BLOCK_BAD], MARGIN, MARGIN + 76,
		(unsigned long long)cs->kind[KVA_BLOCK_FREE], (unsigned long long)owned,
		(unsigned long long)shared, (unsigned long long)cs->refs,
		(unsigned long long)cs->kind[KVA_BLOCK_CACHED], (unsigned long long)cs->pinned,
		(unsigned long long)cs->kind[KVA_BLOCK_DEMOTING],
		(unsigned long long)cs->kind[KVA_BLOCK_FETCHING],
		(unsigned long long)cs->kind[KVA_BLOCK_BAD]);
	if (p->group == 1)
		fprintf(f, "<text x=\"%u\" y=\"%u\" fill=\"#555555\">one cell per block, block 0 "
			"top left, %u a row; hover over a cell for its holders</text>\n", MARGIN,
			MARGIN + 94, p->cols);
	else
		fprintf(f, "<text x=\"%u\" y=\"%u\" fill=\"#555555\">one cell per %u blocks, %u "
			"a row: its stripes are its blocks' states, in the legend's order, as "
			"tall as their share; hover for counts</text>\n", MARGIN, MARGIN + 94,
			p->group, p->cols);
	fputs("</g>\n", f);
	/* the grid */
	fprintf(f, "<g id=\"cells\" data-cells=\"%u\" data-blocks-per-cell=\"%u\" "
		"data-columns=\"%u\">\n", p->ncells, p->group, p->cols);
	for (uint32_t i = 0; i < p->ncells; i++)
		write_cell(f, p, i);
	fputs("</g>\n", f);
	/* the legend: every state, every slot that is joined or has blocks */
	fprintf(f, "<g id=\"legend\" fill=\"#222222\">\n");
	legend_entry(f, p, CTL_FREE, &y);
	for (unsigned s = 0; s < KVA_MAX_WORKERS; s++)
		if (p->census.state[s] ||
		    (s < p->st.max_workers && p->st.slots[s].state != KVA_SLOT_FREE))
			legend_entry(f, p, s, &y);
	for (unsigned s = CTL_SHARED; s < CTL_STATES; s++)
		legend_entry(f, p, s, &y);
	fprintf(f, "<text x=\"%u\" y=\"%u\" fill=\"#555555\" font-size=\"11\">pinned: a hint; a "
		"block may stay pinned a while after its pinned</text>\n<text x=\"%u\" y=\"%u\" "
		"fill=\"#555555\" font-size=\"11\">holder died, until it is freed or evicted</text>\n",
		p->legend_x, y + 14, p->legend_x, y + 28);
	fputs("</g>\n</svg>\n", f);
}

static void write_html(FILE *f, const struct picture *p)
{
	const struct kva_arena_info *info = p->info;

	fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>"
	      "kvarena arena ", f);
	xml_text(f, info->name);
	fputs("</title>\n<style>\nbody { font-family: sans-serif; margin: 16px; color: #222; }\n"
	      "table { border-collapse: collapse; margin: 12px 0; }\n"
	      "th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }\n"
	      "th.l, td.l { text-align: left; }\n"
	      "span.sw { display: inline-block; width: 12px; height: 12px; "
	      "border: 1px solid #888; vertical-align: middle; margin-right: 6px; }\n"
	      "</style>\n</head>\n<body>\n", f);
	write_svg(f, p, false);
	fputs("<table id=\"states\">\n<tr><th class=\"l\">state</th><th>blocks</th>"
	      "<th>share</th></tr>\n", f);
	for (unsigned i = 0; i < CTL_STATES; i++) {
		unsigned s = ordered(i);
		uint64_t n = p->census.state[s];
		char pct[16];

		if (s < KVA_MAX_WORKERS && !n)
			continue;
		fprintf(f, "<tr data-state=\"%s\"", ctl_state_name(s));
		if (s < KVA_MAX_WORKERS)
			fprintf(f, " data-slot=\"%u\"", s);
		fprintf(f, "><td class=\"l\"><span class=\"sw\" style=\"background: %s\"></span>",
			ctl_state_color(s));
		state_words(f, p, s);
		fprintf(f, "</td><td>%llu</td><td>%s</td></tr>\n", (unsigned long long)n,
			share(n, p->blocks, pct, sizeof(pct)));
	}
	fputs("</table>\n<table id=\"workers\">\n<tr><th>slot</th><th class=\"l\">name</th>"
	      "<th>pid</th><th class=\"l\">state</th><th>owned</th><th>shared</th>"
	      "<th>in its cache</th><th>sequences</th><th>pinned held</th></tr>\n", f);
	for (uint32_t s = 0; s < p->st.max_workers; s++) {
		static const char *const slot_state[] = { "free", "joining", "live", "reclaiming" };
		const struct kva_slot_stats *w = &p->st.slots[s];

		if (w->state == KVA_SLOT_FREE)
			continue;
		fprintf(f, "<tr data-slot=\"%u\"><td><span class=\"sw\" style=\"background: %s\">"
			"</span>%u</td><td class=\"l\">", s, ctl_state_color(s), s);
		xml_text(f, w->name);
		fprintf(f, "</td><td>%d</td><td class=\"l\">%s</td><td>%u</td><td>%u</td><td>%u</td>"
			"<td>%u</td><td>%llu</td></tr>\n", w->pid, slot_state[w->state & 3], w->owned,
			w->shared, w->cached, p->seq[s].open_seqs,
			(unsigned long long)p->seq[s].kind_blocks[KVA_OWNER_PINNED]);
	}
	fputs("</table>\n</body>\n</html>\n", f);
}

static int print_summary(const struct picture *p)
{
	struct json_object *o = json_object_new_object(), *st = json_object_new_object();
	struct json_object *slots = json_object_new_array();
	int ret;

	json_object_object_add(o, "file", json_object_new_string(p->c->picture));
	json_object_object_add(o, "format", json_object_new_string(p->c->html ? "html" : "svg"));
	json_object_object_add(o, "blocks", json_object_new_int64(p->blocks));
	json_object_object_add(o, "cells", json_object_new_int64(p->ncells));
	json_object_object_add(o, "blocks_per_cell", json_object_new_int64(p->group));
	json_object_object_add(o, "columns", json_object_new_int64(p->cols));
	for (unsigned s = CTL_FREE; s < CTL_STATES; s++) {
		uint64_t owned = 0;

		if (s == CTL_FREE) {
			for (unsigned k = 0; k < KVA_MAX_WORKERS; k++)
				owned += p->census.state[k];
			json_object_object_add(st, "owned", json_object_new_uint64(owned));
		}
		json_object_object_add(st, ctl_state_name(s),
				       json_object_new_uint64(p->census.state[s]));
	}
	json_object_object_add(o, "states", st);
	json_object_object_add(o, "pinned_blocks", json_object_new_uint64(p->census.pinned));
	for (unsigned s = 0; s < KVA_MAX_WORKERS; s++) {
		struct json_object *e;
		char name[64];

		if (!p->census.state[s] &&
		    (s >= p->st.max_workers || p->st.slots[s].state == KVA_SLOT_FREE))
			continue;
		e = json_object_new_object();
		json_object_object_add(e, "slot", json_object_new_int64(s));
		json_object_object_add(e, "name", json_object_new_string(
						  ctl_clean(p->st.slots[s].name, name, sizeof(name))));
		json_object_object_add(e, "pid", json_object_new_int64(p->st.slots[s].pid));
		json_object_object_add(e, "color", json_object_new_string(ctl_state_color(s)));
		json_object_object_add(e, "blocks", json_object_new_uint64(p->census.state[s]));
		json_object_array_add(slots, e);
	}
	json_object_object_add(o, "slots", slots);
	ret = puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) < 0 ? 1 : 0;
	json_object_put(o);
	return ret;
}

/*
 * Into a file next to the target, renamed over it when whole: a browser
 * (or a web server) that reloads the picture never reads half of one.
 */
static int write_file(const struct picture *p)
{
	const char *path = p->c->picture;
	char tmp[4096];
	FILE *f;
	int err = 0;

	if (!strcmp(path, "-")) {
		p->c->html ? write_html(stdout, p) : write_svg(stdout, p, true);
		return fflush(stdout) || ferror(stdout) ? -EIO : 0;
	}
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp-%d", path, (int)getpid()) >= sizeof(tmp))
		return -ENAMETOOLONG;
	if (!(f = fopen(tmp, "w")))
		return -errno;
	p->c->html ? write_html(f, p) : write_svg(f, p, true);
	if (fflush(f) || ferror(f))
		err = errno ? -errno : -EIO;
	if (fclose(f) && !err)
		err = -errno;
	if (!err && rename(tmp, path))
		err = -errno;
	if (err)
		unlink(tmp);
	return err;
}

int ctl_picture(struct ctl *c)
{
	struct picture p = { .c = c, .info = kva_arena_info(c->a) };
	time_t now = time(NULL);
	struct tm tm;
	int ret;

	if (kva_arena_stats(c->a, &p.st) < 0 || kva_arena_agent_report(c->a, &p.ar) < 0) {
		fprintf(stderr, "kvarena-ctl: %s\n", kva_errmsg());
		return 1;
	}
	for (uint32_t s = 0; s < p.st.max_workers; s++)
		if (p.st.slots[s].state != KVA_SLOT_FREE)
			kva_arena_seq_stats(c->a, s, &p.seq[s]);
	p.agent_state = kva_arena_agent(c->a, NULL);
	if (localtime_r(&now, &tm))
		strftime(p.when, sizeof(p.when), "%Y-%m-%d %H:%M:%S %z", &tm);
	if ((ret = read_cells(&p)) < 0) {
		fprintf(stderr, "kvarena-ctl: reading the blocks: %s\n", strerror(-ret));
		goto out;
	}
	layout(&p);
	if ((ret = write_file(&p)) < 0) {
		fprintf(stderr, "kvarena-ctl: writing %s: %s\n", c->picture, strerror(-ret));
		goto out;
	}
	if (c->json)
		ret = print_summary(&p) ? -EIO : 0;
out:
	free(p.cells);
	free(p.mix);
	return ret < 0 ? 1 : 0;
}
