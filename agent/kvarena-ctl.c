/* SPDX-License-Identifier: MIT */
/*
 * kvarena-ctl - look at a running agent's arena: status, workers, the block
 * map and its picture (ctl_picture.c), the invariant check, a live view
 * (ctl_top.c). It attaches as an observer (a read-only mapping, no slot)
 * and reads shared memory; it changes nothing.
 *
 * With --json every answer is JSON objects, one per line:
 *   status   {"arena","agent_pid","agent_state","total_blocks","free_blocks",
 *             "used_blocks","owned_blocks","shared_blocks","shared_refs",
 *             "cached_blocks","workers","max_workers","block_bytes",
 *             "data_bytes","meta_bytes","hugetlb","numa_node",
 *             "geometry":{"block_tokens","layers","kv_heads","head_dim",
 *                         "dtype","layout"}}
 *   workers  one object a worker: {"slot","name","pid","state","generation",
 *             "agent_state","agent_pid","uid","agent_agrees",
 *             "owned","shared","cached","refills","flushes","shares"}
 *   map      {"blocks","cells","width","rows":[...],"legend":{char: meaning}}
 *   map --svg FILE / --html FILE (the picture, ctl_picture.c)
 *            {"file","format","blocks","cells","blocks_per_cell","columns",
 *             "states":{"free","owned","shared","cached","pinned","demoting",
 *                       "fetching","corrupt"},"pinned_blocks",
 *             "slots":[{"slot","name","pid","color","blocks"}]}
 *   top      one object a refresh (ctl_top.c): {"time","interval_s","arena",
 *             "agent_pid","agent_state","agent_uptime_s","workers",
 *             "max_workers","total_blocks","free_blocks","owned_blocks",
 *             "shared_blocks","shared_refs","prefix_cached_blocks",
 *             "cached_blocks","pinned_blocks","demoting_blocks",
 *             "fetching_blocks","corrupt_blocks","hits","misses","hit_ratio",
 *             "hit_ratio_interval","rates":{"hits","misses","published",
 *             "evictions","refills","flushes","shares","ended"},"open_seqs",
 *             "reclaims_pending","repairs","tiers":{"host":{...},"disk":{...},
 *             "fetched_per_s","backed_per_s"},"slots":[{"slot","name","pid",
 *             "state","owned","shared","cached","open_seqs","inference",
 *             "training","pinned","hits_per_s","misses_per_s",
 *             "published_per_s","evictions_per_s"}]}
 *   check    {"ok","free_blocks","owned_blocks","shared_blocks","shared_refs",
 *             "bad_descriptors","stale_owners","dead_holders","hints_missing",
 *             "dead_slots","first_bad_block","cached_blocks","index_bad",
 *             "published_blocks","published_count","published_bad","first_problem",
 *             "repairs","last_repair","reclaims_pending"}
 *   prefix   {"policy","index_entries","index_valid","index_tombstones",
 *             "index_ghosts","index_load","cached_blocks","published_blocks","hits","misses",
 *             "hit_ratio","published","duplicates","evictions":{"pressure",
 *             "stale_entries"},"index_full","published_now","cache_limit","open_seqs","usage":{"inference",
 *             "training","pinned"},"quotas":{"inference","training","pinned",
 *             "tenants":[{"tenant","blocks","used"}]}}
 *   seqs     one object a worker: {"slot","name","pid","open_seqs","inference",
 *             "training","pinned","hits","misses","published","evictions"}
 *   tiers    {"host":{TIER,"numa_node","hugetlb"},"disk":{TIER,"path","direct",
 *             "preallocated","queue_depth","warming","scan_done","scan_total",
 *             "restart_found","restart_dropped"},"backed","back_skipped",
 *             "unbacked_evictions","below_found","fetched","fetch_failed",
 *             "fetch_requests","spilled_host","spilled_disk"}, TIER being
 *             "enabled","degraded","degraded_ms","reason","capacity_records",
 *             "used_records","record_bytes","capacity_bytes","used_bytes",
 *             "hits","records_in","bytes_in","bytes_out","fetch_p50_us",
 *             "fetch_p99_us","io_errors","verify_failed","stale","dropped"
 * status also has "prefix_cached_blocks", "prefix_hits", "prefix_misses",
 * "evictions", "evict_policy", "repairs", "last_repair" and "reclaims_pending".
 * Names come from shared memory, which any worker can write: bytes that are
 * not printable UTF-8 are printed as '?', so the JSON is always valid;
 * counters are unsigned.
 * Exit status: 0; 1 when there is no agent, access is refused, or check
 * finds the invariant broken; 2 for a bad command line.
 */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_pvt.h"

static const char *const slot_state[] = { "free", "joining", "live", "reclaiming" };
static const char *const agent_state[] = { "none", "running", "stopping" };

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvarena-ctl [--socket PATH] [--json] COMMAND\n"
"\n"
"  status            the arena's totals and geometry\n"
"  workers           the workers attached, one line each\n"
"  map [--width N] [--rows N]\n"
"                    the block map: one character per block (or per run of\n"
"                    blocks when --rows limits it), with a legend\n"
"  map --svg FILE | --html FILE [--cells N] [--width N]\n"
"                    a picture of the arena for a browser (FILE - : stdout):\n"
"                    one cell per block, colored by state (free, each\n"
"                    worker, shared, cached, pinned, being copied below or\n"
"                    fetched, corrupt), or per group of blocks past N cells\n"
"                    (default %u), its mix in stripes; a legend with counts;\n"
"                    the arena's name, geometry, backend, totals. --width:\n"
"                    cells a row. HTML: the picture and tables, nothing\n"
"                    external, no script\n"
"  top [--interval S] [--iterations N]\n"
"                    the arena live, every S seconds (default 1) until q,\n"
"                    ^C or N refreshes: blocks by state, hit ratio, rates,\n"
"                    tiers, workers; on a terminal a screen, else one line\n"
"                    a refresh (one JSON object with --json)\n"
"  check             verify the arena's invariant; exit 1 if it is broken\n"
"  prefix            the prefix index and cache: occupancy, hits, misses,\n"
"                    evictions, usage by owner kind, quotas\n"
"  seqs              sequences per worker: open, blocks held, hits, misses\n"
"  tiers             the tiers below the arena (host memory, disk): capacity,\n"
"                    use, hits, bytes in and out, fetch latency, errors,\n"
"                    degraded state, warm restart\n"
"\n"
"  --socket PATH     the agent's socket (default: $KVARENA_SOCKET, else %s)\n"
"  --json            JSON objects, one per line\n",
		CTL_CELLS, KVA_DEFAULT_SOCKET);
}

static int print_json(struct json_object *o)
{
	int ret = puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) < 0 ? 1 : 0;

	json_object_put(o);
	return ret;
}

static void add_int(struct json_object *o, const char *k, int64_t v)
{
	json_object_object_add(o, k, json_object_new_int64(v));
}

/* a counter: unsigned, whatever its top bit says */
static void add_u64(struct json_object *o, const char *k, uint64_t v)
{
	json_object_object_add(o, k, json_object_new_uint64(v));
}

static void add_str(struct json_object *o, const char *k, const char *v)
{
	json_object_object_add(o, k, json_object_new_string(v));
}

/*
 * A name read from shared memory, which any worker could have written: only
 * printable UTF-8 goes out ('?' for the rest), so the JSON is valid and the
 * terminal safe by construction.
 */
static const char *clean(const char *in, char *out, size_t cap)
{
	text_escape(in, out, cap, true);
	return out;
}

static const char *const agent_slot_state[] = { "free", "reserved", "attached", "joined",
						"reclaim pending", "agent" };

static int cmd_status(struct ctl *c)
{
	const struct kva_arena_info *info = kva_arena_info(c->a);
	const struct kva_geometry *g = &info->geometry;
	const char *layout = g->layout == KVA_LAYOUT_BLOCK_MAJOR ? "block-major" : "layer-major";
	enum kva_agent_state as = kva_arena_agent(c->a, NULL);
	struct kva_stats st;
	struct kva_prefix_stats ps;
	struct kva_agent_report ar;
	struct json_object *o, *geo;
	char buf[160];

	if (kva_arena_stats(c->a, &st) < 0 || kva_arena_prefix_stats(c->a, &ps) < 0 ||
	    kva_arena_agent_report(c->a, &ar) < 0)
		return 1;
	if (!c->json) {
		printf("arena \"%s\" (agent pid %d, %s)\n", info->name, c->agent.pid,
		       agent_state[as]);
		printf("  prefix   %u blocks cached, %llu hits, %llu misses, %llu evictions "
		       "(policy %s)\n", st.prefix_cached_blocks, (unsigned long long)ps.hits,
		       (unsigned long long)ps.misses, (unsigned long long)ps.evictions,
		       kva_evict_policy_name(ps.policy));
		printf("  blocks   %u total, %u free, %u used (%u owned, %u shared with %u holders), "
		       "%u idle in worker caches\n", st.total_blocks, st.free_blocks,
		       st.used_blocks, st.owned_blocks, st.shared_blocks, st.shared_refs,
		       st.cached_blocks);
		printf("  workers  %u of %u slots\n", st.workers, st.max_workers);
		printf("  agent    %llu words repaired%s%s%s, %u reclaims pending\n",
		       (unsigned long long)ar.repairs, ar.repairs ? " (last: " : "",
		       ar.repairs ? clean(ar.last_repair, buf, sizeof(buf)) : "",
		       ar.repairs ? ")" : "", ar.reclaims_pending);
		printf("  block    %llu bytes: %u tokens x %u layers x K,V x %u kv heads x %u x %s, "
		       "%s\n", (unsigned long long)info->layout.block_bytes, g->block_tokens,
		       g->layers, g->kv_heads, g->head_dim, kva_dtype_name(g->dtype), layout);
		printf("  memory   %.1f MiB data%s%s, %.1f KiB metadata\n",
		       (double)info->layout.data_bytes / (1 << 20),
		       info->hugetlb ? " on huge pages" : "",
		       info->numa_node >= 0 ? " bound to a NUMA node" : "",
		       (double)info->meta_bytes / 1024);
		if (info->backend == KVA_BACKEND_CUDA) {
			printf("  backend  cuda: %s, %s\n", clean(info->device_name, buf, sizeof(buf)),
			       info->device_uuid);
			printf("  region   %.1f MiB mapped in %u chunk%s of %.1f MiB, granularity %llu "
			       "KiB, shared by %s\n", (double)info->data_map_bytes / (1 << 20),
			       info->chunks, info->chunks == 1 ? "" : "s",
			       (double)info->chunk_bytes / (1 << 20),
			       (unsigned long long)info->granularity / 1024,
			       info->ipc == KVA_IPC_FD ? "POSIX fds" : "legacy CUDA IPC");
			printf("  device   %.2f GiB free of %.2f GiB\n",
			       (double)ar.device_free_bytes / (1ull << 30),
			       (double)ar.device_total_bytes / (1ull << 30));
		} else {
			printf("  backend  host\n");
		}
		return 0;
	}
	o = json_object_new_object();
	add_str(o, "arena", clean(info->name, buf, sizeof(buf)));
	add_int(o, "agent_pid", c->agent.pid);
	add_str(o, "agent_state", agent_state[as]);
	add_int(o, "total_blocks", st.total_blocks);
	add_int(o, "free_blocks", st.free_blocks);
	add_int(o, "used_blocks", st.used_blocks);
	add_int(o, "owned_blocks", st.owned_blocks);
	add_int(o, "shared_blocks", st.shared_blocks);
	add_int(o, "shared_refs", st.shared_refs);
	add_int(o, "cached_blocks", st.cached_blocks);
	add_int(o, "prefix_cached_blocks", st.prefix_cached_blocks);
	add_int(o, "prefix_hits", (int64_t)ps.hits);
	add_int(o, "prefix_misses", (int64_t)ps.misses);
	add_int(o, "evictions", (int64_t)ps.evictions);
	add_str(o, "evict_policy", kva_evict_policy_name(ps.policy));
	add_int(o, "workers", st.workers);
	add_int(o, "max_workers", st.max_workers);
	add_u64(o, "repairs", ar.repairs);
	add_str(o, "last_repair", clean(ar.last_repair, buf, sizeof(buf)));
	add_int(o, "reclaims_pending", ar.reclaims_pending);
	add_int(o, "block_bytes", (int64_t)info->layout.block_bytes);
	add_int(o, "data_bytes", (int64_t)info->layout.data_bytes);
	add_int(o, "meta_bytes", (int64_t)info->meta_bytes);
	json_object_object_add(o, "hugetlb", json_object_new_boolean(info->hugetlb));
	add_int(o, "numa_node", info->numa_node);
	add_str(o, "backend", info->backend == KVA_BACKEND_CUDA ? "cuda" : "host");
	if (info->backend == KVA_BACKEND_CUDA) {
		add_str(o, "device_name", clean(info->device_name, buf, sizeof(buf)));
		add_str(o, "device_uuid", info->device_uuid);
		add_str(o, "ipc", info->ipc == KVA_IPC_FD ? "fd" : "legacy");
		add_u64(o, "chunk_bytes", info->chunk_bytes);
		add_int(o, "chunks", info->chunks);
		add_u64(o, "granularity", info->granularity);
		add_u64(o, "data_map_bytes", info->data_map_bytes);
		add_u64(o, "device_free_bytes", ar.device_free_bytes);
		add_u64(o, "device_total_bytes", ar.device_total_bytes);
	}
	geo = json_object_new_object();
	add_int(geo, "block_tokens", g->block_tokens);
	add_int(geo, "layers", g->layers);
	add_int(geo, "kv_heads", g->kv_heads);
	add_int(geo, "head_dim", g->head_dim);
	add_str(geo, "dtype", kva_dtype_name(g->dtype));
	add_str(geo, "layout", layout);
	json_object_object_add(o, "geometry", geo);
	return print_json(o);
}

/*
 * The workers: each slot as shared memory says it, and as the agent's own
 * table has it (uid, state). A slot the two disagree on is marked '*': a word
 * a worker overwrote, which the agent puts back at its next tick, or a
 * worker that just joined or left.
 */
static int cmd_workers(struct ctl *c)
{
	struct kva_stats st;
	struct kva_agent_report ar;
	unsigned shown = 0;
	char name[64];

	if (kva_arena_stats(c->a, &st) < 0 || kva_arena_agent_report(c->a, &ar) < 0)
		return 1;
	if (!c->json)
		printf("slot  name              pid      uid    state       owned   shared  cached  "
		       "refills  flushes  shares\n");
	for (uint32_t s = 0; s < st.max_workers; s++) {
		const struct kva_slot_stats *w = &st.slots[s];
		const struct kva_agent_slot *g = &ar.slots[s];
		bool differ = g->state != KVA_AGENT_SLOT_FREE &&
			      (g->pid != w->pid || g->generation != w->generation);
		struct json_object *o;

		if (w->state == KVA_SLOT_FREE && g->state == KVA_AGENT_SLOT_FREE)
			continue;
		shown++;
		clean(w->name, name, sizeof(name));
		if (!c->json) {
			printf("%c %-3u %-17s %-8d %-6d %-11s %-7u %-7u %-7u %-8llu %-8llu %llu%s\n",
			       kva_slot_char(s), s, name, w->pid,
			       g->state != KVA_AGENT_SLOT_FREE ? (int)g->uid : -1,
			       slot_state[w->state & 3], w->owned, w->shared, w->cached,
			       (unsigned long long)w->refills, (unsigned long long)w->flushes,
			       (unsigned long long)w->shares, differ ? " *" : "");
			continue;
		}
		o = json_object_new_object();
		add_int(o, "slot", s);
		add_str(o, "name", name);
		add_int(o, "pid", w->pid);
		add_str(o, "state", slot_state[w->state & 3]);
		add_int(o, "generation", w->generation);
		add_str(o, "agent_state", agent_slot_state[g->state]);
		add_int(o, "agent_pid", g->pid);
		add_u64(o, "uid", g->uid);
		json_object_object_add(o, "agent_agrees", json_object_new_boolean(!differ));
		add_int(o, "owned", w->owned);
		add_int(o, "shared", w->shared);
		add_int(o, "cached", w->cached);
		add_u64(o, "refills", w->refills);
		add_u64(o, "flushes", w->flushes);
		add_u64(o, "shares", w->shares);
		if (print_json(o))
			return 1;
	}
	if (!c->json && !shown)
		printf("(no workers)\n");
	return 0;
}

static int cmd_map(struct ctl *c)
{
	const struct kva_arena_info *info = kva_arena_info(c->a);
	uint32_t width = c->width ? c->width : 64, cells = info->blocks;
	struct json_object *o, *rows, *legend;
	struct kva_stats st;
	char *map;
	int n;

	if (c->picture)
		return ctl_picture(c);
	if (!c->json)
		return kva_arena_map_print(c->a, stdout, width, c->rows) < 0;
	if (c->rows && (uint64_t)width * c->rows < cells)
		cells = width * c->rows;
	map = malloc((size_t)cells + 1);
	if (!map || (n = kva_arena_map(c->a, map, (size_t)cells + 1, cells)) < 0 ||
	    kva_arena_stats(c->a, &st) < 0) {
		free(map);
		return 1;
	}
	o = json_object_new_object();
	add_int(o, "blocks", info->blocks);
	add_int(o, "cells", n);
	add_int(o, "width", width);
	rows = json_object_new_array();
	for (int off = 0; off < n; off += (int)width)
		json_object_array_add(rows, json_object_new_string_len(
						    map + off, n - off < (int)width ? n - off : (int)width));
	json_object_object_add(o, "rows", rows);
	legend = json_object_new_object();
	add_str(legend, ".", "free");
	add_str(legend, "#", "shared");
	add_str(legend, "+", "cached prefix (published, no holder)");
	add_str(legend, "v", "being copied below the arena (the agent's tier thread holds it)");
	add_str(legend, "^", "being fetched from a tier below");
	add_str(legend, "!", "corrupt or stale");
	for (uint32_t s = 0; s < st.max_workers; s++) {
		char key[2] = { kva_slot_char(s), 0 }, text[96];

		if (st.slots[s].state == KVA_SLOT_FREE)
			continue;
		char name[64];

		snprintf(text, sizeof(text), "%s (pid %d)", clean(st.slots[s].name, name, sizeof(name)),
			 st.slots[s].pid);
		add_str(legend, key, text);
	}
	json_object_object_add(o, "legend", legend);
	free(map);
	return print_json(o);
}

static int cmd_prefix(struct ctl *c)
{
	static const char *const kinds[] = { "inference", "training", "pinned" };
	struct kva_prefix_stats ps;
	struct json_object *o, *ev, *use, *q, *ts;
	double load, ratio;

	if (kva_arena_prefix_stats(c->a, &ps) < 0)
		return 1;
	load = (double)ps.index_valid / (double)ps.index_entries;
	ratio = ps.hits + ps.misses ? (double)ps.hits / (double)(ps.hits + ps.misses) : 0.0;
	if (!c->json) {
		printf("index    %llu entries: %llu valid (load %.3f), %llu ghosts (recent "
		       "evictions' history), %llu tombstones\n",
		       (unsigned long long)ps.index_entries, (unsigned long long)ps.index_valid,
		       load, (unsigned long long)ps.index_ghosts,
		       (unsigned long long)ps.index_tombstones);
		printf("blocks   %llu cached (evictable), %llu published and held\n",
		       (unsigned long long)ps.cached_blocks, (unsigned long long)ps.published_blocks);
		printf("matches  %llu hits, %llu misses (hit ratio %.3f), %llu open sequences\n",
		       (unsigned long long)ps.hits, (unsigned long long)ps.misses, ratio,
		       (unsigned long long)ps.open_seqs);
		printf("publish  %llu published, %llu lost a race to the same block, %llu skipped "
		       "(index or cache limit full); %llu published now, limit %llu (0: none)\n",
		       (unsigned long long)ps.published, (unsigned long long)ps.duplicates,
		       (unsigned long long)ps.index_full, (unsigned long long)ps.published_now,
		       (unsigned long long)ps.cache_limit);
		printf("evicted  %llu under allocation pressure (policy %s); %llu stale entries "
		       "removed\n", (unsigned long long)ps.evictions,
		       kva_evict_policy_name(ps.policy), (unsigned long long)ps.stale_entries);
		for (unsigned k = 0; k < KVA_OWNER_KINDS; k++) {
			printf("%-9s %llu blocks held", kinds[k], (unsigned long long)ps.kind_blocks[k]);
			if (ps.quotas.kind[k])
				printf(" of a quota of %u", ps.quotas.kind[k]);
			printf("\n");
		}
		for (unsigned t = 0; t < KVA_MAX_TENANT_QUOTAS; t++)
			if (ps.quotas.tenant[t].blocks)
				printf("tenant %-6u %llu blocks held of a quota of %u\n",
				       ps.quotas.tenant[t].tenant,
				       (unsigned long long)ps.tenant_blocks[t], ps.quotas.tenant[t].blocks);
		return 0;
	}
	o = json_object_new_object();
	add_str(o, "policy", kva_evict_policy_name(ps.policy));
	add_u64(o, "index_entries", ps.index_entries);
	add_u64(o, "index_valid", ps.index_valid);
	add_u64(o, "index_tombstones", ps.index_tombstones);
	add_u64(o, "index_ghosts", ps.index_ghosts);
	json_object_object_add(o, "index_load", json_object_new_double(load));
	add_u64(o, "cached_blocks", ps.cached_blocks);
	add_u64(o, "published_blocks", ps.published_blocks);
	add_u64(o, "hits", ps.hits);
	add_u64(o, "misses", ps.misses);
	json_object_object_add(o, "hit_ratio", json_object_new_double(ratio));
	add_u64(o, "published", ps.published);
	add_u64(o, "duplicates", ps.duplicates);
	ev = json_object_new_object();
	add_u64(ev, "pressure", ps.evictions);
	add_u64(ev, "stale_entries", ps.stale_entries);
	json_object_object_add(o, "evictions", ev);
	add_u64(o, "index_full", ps.index_full);
	add_u64(o, "published_now", ps.published_now);
	add_u64(o, "cache_limit", ps.cache_limit);
	add_u64(o, "open_seqs", ps.open_seqs);
	use = json_object_new_object();
	q = json_object_new_object();
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++) {
		add_u64(use, kinds[k], ps.kind_blocks[k]);
		add_int(q, kinds[k], ps.quotas.kind[k]);
	}
	json_object_object_add(o, "usage", use);
	ts = json_object_new_array();
	for (unsigned t = 0; t < KVA_MAX_TENANT_QUOTAS; t++) {
		struct json_object *e;

		if (!ps.quotas.tenant[t].blocks)
			continue;
		e = json_object_new_object();
		add_int(e, "tenant", ps.quotas.tenant[t].tenant);
		add_int(e, "blocks", ps.quotas.tenant[t].blocks);
		add_u64(e, "used", ps.tenant_blocks[t]);
		json_object_array_add(ts, e);
	}
	json_object_object_add(q, "tenants", ts);
	json_object_object_add(o, "quotas", q);
	return print_json(o);
}

static int cmd_seqs(struct ctl *c)
{
	struct kva_stats st;
	unsigned shown = 0;

	if (kva_arena_stats(c->a, &st) < 0)
		return 1;
	if (!c->json)
		printf("slot  name              pid      seqs  inference training pinned   "
		       "hits      misses    published evictions\n");
	for (uint32_t s = 0; s < st.max_workers; s++) {
		const struct kva_slot_stats *w = &st.slots[s];
		struct kva_seq_slot_stats q;
		struct json_object *o;

		if (w->state == KVA_SLOT_FREE || kva_arena_seq_stats(c->a, s, &q) < 0)
			continue;
		shown++;
		char name[64];

		clean(w->name, name, sizeof(name));
		if (!c->json) {
			printf("%c %-3u %-17s %-8d %-5u %-9llu %-8llu %-8llu %-9llu %-9llu %-9llu "
			       "%llu\n", kva_slot_char(s), s, name, w->pid, q.open_seqs,
			       (unsigned long long)q.kind_blocks[0], (unsigned long long)q.kind_blocks[1],
			       (unsigned long long)q.kind_blocks[2], (unsigned long long)q.hits,
			       (unsigned long long)q.misses, (unsigned long long)q.published,
			       (unsigned long long)q.evictions);
			continue;
		}
		o = json_object_new_object();
		add_int(o, "slot", s);
		add_str(o, "name", name);
		add_int(o, "pid", w->pid);
		add_int(o, "open_seqs", q.open_seqs);
		add_u64(o, "inference", q.kind_blocks[0]);
		add_u64(o, "training", q.kind_blocks[1]);
		add_u64(o, "pinned", q.kind_blocks[2]);
		add_u64(o, "hits", q.hits);
		add_u64(o, "misses", q.misses);
		add_u64(o, "published", q.published);
		add_u64(o, "evictions", q.evictions);
		if (print_json(o))
			return 1;
	}
	if (!c->json && !shown)
		printf("(no workers)\n");
	return 0;
}

static int cmd_check(struct ctl *c)
{
	struct kva_check_report r;
	int ret = kva_arena_check(c->a, &r);
	struct kva_agent_report ar;
	struct json_object *o;
	char buf[160];

	kva_arena_agent_report(c->a, &ar);
	if (!c->json) {
		printf("%s: %u free, %u owned, %u shared (%u holders), %u cached, %u published "
		       "(counted %llu); %u corrupt descriptors, %u stale owners, %u dead holders, "
		       "%u unfindable free blocks, %u bad index entries, %u dead slots awaiting "
		       "reclaim\n", ret ? "BROKEN" : "ok", r.free_blocks, r.owned_blocks,
		       r.shared_blocks, r.shared_refs, r.cached_blocks, r.published_blocks,
		       (unsigned long long)r.published_count, r.bad_descriptors, r.stale_owners,
		       r.dead_holders, r.hints_missing, r.index_bad, r.dead_slots);
		if (ret)
			printf("first problem: %s\n", clean(r.first_problem, buf, sizeof(buf)));
		if (ar.repairs || ar.reclaims_pending)
			printf("the agent repaired %llu overwritten words (last: %s); %u reclaims "
			       "pending\n", (unsigned long long)ar.repairs,
			       clean(ar.last_repair, buf, sizeof(buf)), ar.reclaims_pending);
		return ret ? 1 : 0;
	}
	o = json_object_new_object();
	json_object_object_add(o, "ok", json_object_new_boolean(ret == 0));
	add_int(o, "free_blocks", r.free_blocks);
	add_int(o, "owned_blocks", r.owned_blocks);
	add_int(o, "shared_blocks", r.shared_blocks);
	add_int(o, "shared_refs", r.shared_refs);
	add_int(o, "bad_descriptors", r.bad_descriptors);
	add_int(o, "stale_owners", r.stale_owners);
	add_int(o, "dead_holders", r.dead_holders);
	add_int(o, "hints_missing", r.hints_missing);
	add_int(o, "dead_slots", r.dead_slots);
	add_int(o, "first_bad_block", r.first_bad_block);
	add_int(o, "cached_blocks", r.cached_blocks);
	add_int(o, "index_bad", r.index_bad);
	add_int(o, "published_blocks", r.published_blocks);
	add_int(o, "published_count", (int64_t)r.published_count);
	add_int(o, "published_bad", r.published_bad);
	add_str(o, "first_problem", clean(r.first_problem, buf, sizeof(buf)));
	add_u64(o, "repairs", ar.repairs);
	add_str(o, "last_repair", clean(ar.last_repair, buf, sizeof(buf)));
	add_int(o, "reclaims_pending", ar.reclaims_pending);
	return print_json(o) || ret ? 1 : 0;
}

static struct json_object *tier_json(const struct kva_tier_stats *t, bool disk)
{
	struct json_object *o = json_object_new_object();
	char buf[160];

	json_object_object_add(o, "enabled", json_object_new_boolean(t->enabled));
	json_object_object_add(o, "degraded", json_object_new_boolean(t->degraded));
	add_u64(o, "degraded_ms", t->degraded_ms);
	add_str(o, "reason", clean(t->reason, buf, sizeof(buf)));
	add_u64(o, "capacity_records", t->capacity_records);
	add_u64(o, "used_records", t->used_records);
	add_u64(o, "record_bytes", t->record_bytes);
	add_u64(o, "capacity_bytes", t->capacity_records * t->record_bytes);
	add_u64(o, "used_bytes", t->used_records * t->record_bytes);
	add_u64(o, "hits", t->hits);
	add_u64(o, "records_in", t->records_in);
	add_u64(o, "bytes_in", t->bytes_in);
	add_u64(o, "bytes_out", t->bytes_out);
	json_object_object_add(o, "fetch_p50_us", json_object_new_double(t->fetch_p50_ns / 1e3));
	json_object_object_add(o, "fetch_p99_us", json_object_new_double(t->fetch_p99_ns / 1e3));
	add_u64(o, "io_errors", t->io_errors);
	add_u64(o, "verify_failed", t->verify_failed);
	add_u64(o, "stale", t->stale);
	add_u64(o, "dropped", t->dropped);
	if (!disk) {
		add_int(o, "numa_node", t->numa_node);
		json_object_object_add(o, "hugetlb", json_object_new_boolean(t->hugetlb));
		return o;
	}
	add_str(o, "path", clean(t->path, buf, sizeof(buf)));
	json_object_object_add(o, "direct", json_object_new_boolean(t->direct));
	json_object_object_add(o, "preallocated", json_object_new_boolean(t->preallocated));
	add_u64(o, "queue_depth", t->queue_depth);
	json_object_object_add(o, "warming", json_object_new_boolean(t->warming));
	add_u64(o, "scan_done", t->scan_done);
	add_u64(o, "scan_total", t->scan_total);
	add_u64(o, "restart_found", t->restart_found);
	add_u64(o, "restart_dropped", t->restart_dropped);
	return o;
}

static void tier_line(const char *name, const struct kva_tier_stats *t)
{
	char buf[160];

	if (!t->enabled) {
		printf("%-5s off\n", name);
		return;
	}
	printf("%-5s %-9s %8llu/%-8llu %9.1f/%-9.1f %9llu %10.1f %10.1f %8.0f %8.0f %7llu %7llu "
	       "%7llu\n", name, t->degraded ? "DEGRADED" : t->warming ? "warming" : "ok",
	       (unsigned long long)t->used_records, (unsigned long long)t->capacity_records,
	       (double)(t->used_records * t->record_bytes) / (1 << 20),
	       (double)(t->capacity_records * t->record_bytes) / (1 << 20),
	       (unsigned long long)t->hits, (double)t->bytes_in / (1 << 20),
	       (double)t->bytes_out / (1 << 20), t->fetch_p50_ns / 1e3, t->fetch_p99_ns / 1e3,
	       (unsigned long long)t->io_errors, (unsigned long long)t->verify_failed,
	       (unsigned long long)t->dropped);
	if (t->degraded || t->reason[0])
		printf("      %s %s\n", t->degraded ? "degraded:" : "last error:",
		       clean(t->reason, buf, sizeof(buf)));
}

static int cmd_tiers(struct ctl *c)
{
	struct kva_tiers_stats st;
	const struct kva_tier_stats *h = &st.tier[KVA_TIER_HOST], *d = &st.tier[KVA_TIER_DISK];
	struct json_object *o;
	char buf[160];

	if (kva_arena_tier_stats(c->a, &st) < 0)
		return 1;
	if (!c->json) {
		if (!h->enabled && !d->enabled) {
			printf("no tiers below the arena (kvarena-agent --host-bytes, --disk-dir)\n");
			return 0;
		}
		printf("tier  state      records used/cap    MiB used/cap     hits     MiB in    MiB out "
		       "  p50 us   p99 us  errors  verify dropped\n");
		tier_line("host", h);
		tier_line("disk", d);
		if (h->enabled)
			printf("host: NUMA node %d, %s\n", h->numa_node,
			       h->hugetlb ? "huge pages" : "ordinary pages");
		if (d->enabled) {
			printf("disk: %s, %s I/O, %s, queue depth %u\n", clean(d->path, buf, sizeof(buf)),
			       d->direct ? "O_DIRECT" : "buffered (no O_DIRECT on this file system)",
			       d->preallocated ? "preallocated" : "sparse", d->queue_depth);
			if (d->warming || d->restart_found || d->restart_dropped)
				printf("disk: warm restart: %llu of %llu records scanned, %llu found, %llu "
				       "dropped\n", (unsigned long long)d->scan_done,
				       (unsigned long long)d->scan_total,
				       (unsigned long long)d->restart_found,
				       (unsigned long long)d->restart_dropped);
		}
		printf("blocks copied below %llu (not copied: %llu gone first; %llu evicted before a "
		       "copy); found below by matches %llu, fetched %llu, failed %llu; index entries "
		       "naming a copy: host %llu, disk %llu\n", (unsigned long long)st.backed,
		       (unsigned long long)st.back_skipped, (unsigned long long)st.unbacked_evictions,
		       (unsigned long long)st.below_found, (unsigned long long)st.fetched,
		       (unsigned long long)st.fetch_failed, (unsigned long long)st.spilled_host,
		       (unsigned long long)st.spilled_disk);
		return 0;
	}
	o = json_object_new_object();
	json_object_object_add(o, "host", tier_json(h, false));
	json_object_object_add(o, "disk", tier_json(d, true));
	add_u64(o, "backed", st.backed);
	add_u64(o, "back_skipped", st.back_skipped);
	add_u64(o, "unbacked_evictions", st.unbacked_evictions);
	add_u64(o, "below_found", st.below_found);
	add_u64(o, "fetched", st.fetched);
	add_u64(o, "fetch_failed", st.fetch_failed);
	add_u64(o, "fetch_requests", st.fetch_requests);
	add_u64(o, "spilled_host", st.spilled_host);
	add_u64(o, "spilled_disk", st.spilled_disk);
	return print_json(o);
}

static int number(const char *flag, const char *v, uint32_t max, uint32_t *out)
{
	char *end;
	unsigned long x;

	errno = 0;
	x = v ? strtoul(v, &end, 10) : 0;
	if (!v || errno || *end || !x || x > max) {
		fprintf(stderr, "kvarena-ctl: %s needs a number 1..%u\n", flag, max);
		return -EINVAL;
	}
	*out = (uint32_t)x;
	return 0;
}

/* seconds between refreshes: 0.05 to a day, a plain number */
static int seconds(const char *flag, const char *v, double *out)
{
	char *end;
	double x;

	errno = 0;
	x = v ? strtod(v, &end) : NAN;
	if (!v || errno || *end || !isfinite(x) || x < 0.05 || x > 86400) {
		fprintf(stderr, "kvarena-ctl: %s needs seconds, 0.05 to 86400\n", flag);
		return -EINVAL;
	}
	*out = x;
	return 0;
}

/* the flags that belong to one command only, and what they go with */
static int parse_check(struct ctl *c, bool map_flags, bool top_flags)
{
	if (map_flags && strcmp(c->command, "map")) {
		fprintf(stderr, "kvarena-ctl: --svg, --html and --cells are map's\n");
		return -EINVAL;
	}
	if (top_flags && strcmp(c->command, "top")) {
		fprintf(stderr, "kvarena-ctl: --interval and --iterations are top's\n");
		return -EINVAL;
	}
	if (c->cells && !c->picture) {
		fprintf(stderr, "kvarena-ctl: --cells goes with --svg or --html\n");
		return -EINVAL;
	}
	if (c->picture && c->rows) {
		fprintf(stderr, "kvarena-ctl: --rows is the text map's; a picture takes --cells\n");
		return -EINVAL;
	}
	if (c->picture && c->json && !strcmp(c->picture, "-")) {
		fprintf(stderr, "kvarena-ctl: --json prints a summary on stdout: write the "
			"picture to a file\n");
		return -EINVAL;
	}
	return 0;
}

static int parse(int argc, char **argv, struct ctl *c)
{
	bool map_flags = false, top_flags = false;

	for (int k = 1; k < argc; k++) {
		const char *arg = argv[k];

		if (!strcmp(arg, "--json")) {
			c->json = true;
		} else if (!strcmp(arg, "--socket") && k + 1 < argc) {
			c->socket = argv[++k];
		} else if (!strncmp(arg, "--socket=", 9)) {
			c->socket = arg + 9;
		} else if (!strcmp(arg, "--width")) {
			if (number("--width", k + 1 < argc ? argv[++k] : NULL, 4096, &c->width))
				return -EINVAL;
		} else if (!strcmp(arg, "--rows")) {
			if (number("--rows", k + 1 < argc ? argv[++k] : NULL, 1u << 20, &c->rows))
				return -EINVAL;
		} else if (!strcmp(arg, "--svg") || !strcmp(arg, "--html")) {
			if (c->picture) {
				fprintf(stderr, "kvarena-ctl: one picture at a time (--svg or "
					"--html)\n");
				return -EINVAL;
			}
			if (k + 1 >= argc || !argv[k + 1][0]) {
				fprintf(stderr, "kvarena-ctl: %s needs a file (- for stdout)\n", arg);
				return -EINVAL;
			}
			c->html = !strcmp(arg, "--html");
			c->picture = argv[++k];
			map_flags = true;
		} else if (!strcmp(arg, "--cells")) {
			if (number("--cells", k + 1 < argc ? argv[++k] : NULL, CTL_CELLS_MAX, &c->cells))
				return -EINVAL;
			map_flags = true;
		} else if (!strcmp(arg, "--interval")) {
			if (seconds("--interval", k + 1 < argc ? argv[++k] : NULL, &c->interval))
				return -EINVAL;
			top_flags = true;
		} else if (!strcmp(arg, "--iterations")) {
			if (number("--iterations", k + 1 < argc ? argv[++k] : NULL, 1u << 30,
				   &c->iterations))
				return -EINVAL;
			top_flags = true;
		} else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
			usage(stdout);
			exit(0);
		} else if (arg[0] == '-' || c->command) {
			fprintf(stderr, "kvarena-ctl: unexpected \"%s\" (--help lists the usage)\n",
				arg);
			return -EINVAL;
		} else {
			c->command = arg;
		}
	}
	if (!c->command) {
		usage(stderr);
		return -EINVAL;
	}
	return parse_check(c, map_flags, top_flags);
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*run)(struct ctl *c);
	} commands[] = {
		{ "status", cmd_status },
		{ "workers", cmd_workers },
		{ "map", cmd_map },
		{ "check", cmd_check },
		{ "prefix", cmd_prefix },
		{ "seqs", cmd_seqs },
		{ "tiers", cmd_tiers },
		{ "top", ctl_top },
	};
	struct ctl c = { 0 };
	int ret;

	if (parse(argc, argv, &c) < 0)
		return 2;
	for (unsigned k = 0; k < sizeof(commands) / sizeof(commands[0]); k++) {
		if (strcmp(c.command, commands[k].name))
			continue;
		if ((ret = kva_observe(c.socket, &c.a, &c.agent)) < 0) {
			fprintf(stderr, "kvarena-ctl: %s\n", kva_errmsg());
			return 1;
		}
		ret = commands[k].run(&c);
		kva_arena_close(c.a);
		return ret;
	}
	fprintf(stderr, "kvarena-ctl: unknown command \"%s\" (", c.command);
	for (unsigned k = 0; k < sizeof(commands) / sizeof(commands[0]); k++)
		fprintf(stderr, "%s%s", k ? ", " : "", commands[k].name);
	fprintf(stderr, ")\n");
	return 2;
}
