/* SPDX-License-Identifier: MIT */
/*
 * agent_pvt.h - kvarena-agent: configuration, logging, the server loop.
 */
#ifndef KVA_AGENT_PVT_H
#define KVA_AGENT_PVT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvarena.h"

#define AGENT_MAX_IDS 16

struct agent_config {
	char socket[108];            /* sun_path */
	mode_t socket_mode;
	gid_t socket_group;          /* (gid_t)-1: leave as created */
	char name[32];
	char backend[16];            /* "host" */
	uint32_t blocks;             /* 0: from memory */
	uint64_t memory;             /* bytes; used when blocks == 0 */
	struct kva_geometry geometry;
	bool hugepages;
	int32_t numa_node;           /* -1: none */
	uint32_t max_workers;
	uint32_t worker_cache;       /* 0: the arena's default */
	uid_t allow_uid[AGENT_MAX_IDS];
	unsigned n_allow_uid;
	gid_t allow_gid[AGENT_MAX_IDS];
	unsigned n_allow_gid;
	int log_level;
	uint32_t shutdown_grace_ms;
	uint32_t check_interval_ms;
	enum kva_evict_policy evict_policy;
	uint32_t cache_limit;
	struct kva_quotas quotas;
};

/* config.c */

/*
 * agent_config_parse - defaults, then the --config file if one is named, then
 * the command line (which wins). Every bad value is refused with a message
 * naming the flag or key. Return: 0, 1 if --help or --version was printed,
 * or -EINVAL.
 */
int agent_config_parse(int argc, char **argv, struct agent_config *c);

/* log.c */
enum { LOG_ERR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };
extern int agent_log_level;
void agent_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_err(...) agent_log(LOG_ERR, __VA_ARGS__)
#define log_warn(...) agent_log(LOG_WARN, __VA_ARGS__)
#define log_info(...) agent_log(LOG_INFO, __VA_ARGS__)
#define log_debug(...) agent_log(LOG_DEBUG, __VA_ARGS__)
int agent_log_level_parse(const char *s);

/* server.c */

/* agent_serve - listen, admit, watch, reclaim, until SIGTERM/SIGINT. */
int agent_serve(const struct agent_config *c, struct kva_arena *a);

#endif
