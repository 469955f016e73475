/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - between the two halves of the agent's /metrics: the HTTP
 * server in the agent's loop (metrics.c) and the exposition text it serves
 * (metrics_text.c). Private to the agent.
 */
#ifndef KVA_AGENT_METRICS_H
#define KVA_AGENT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "agent_pvt.h"

/* the HTTP side's own counts, shown with the rest */
enum metrics_answer { MA_200, MA_404, MA_405, MA_413, MA_503, MA_N };
extern const char *const metrics_answer_code[MA_N];

struct metrics_http {
	uint64_t answers[MA_N];   /* requests, by the status they were answered */
	uint64_t cut;             /* connections shut down at their deadline */
	uint64_t paused;          /* times MHD woke the loop too often: left unwatched */
	uint64_t renders;         /* texts made (at most one a second) */
	double render_seconds;    /* how long the previous one took */
	unsigned connections;     /* open now */
};

/* What the text keeps from one render to the next: the counters it read from
 * shared memory, which it never shows lower than it showed them before. */
struct metrics_text;

struct metrics_text *metrics_text_new(void);
void metrics_text_free(struct metrics_text *t);

/*
 * metrics_text_render - everything the agent knows now, in the Prometheus
 * text exposition format (version 0.0.4), into a malloc'd buffer *@out of
 * *@len bytes (the caller frees it). O(blocks + index entries): call at
 * most once a second. 0 or -ENOMEM.
 */
int metrics_text_render(struct metrics_text *t, struct agent *ag, const struct metrics_http *http,
			char **out, size_t *len);

#endif
