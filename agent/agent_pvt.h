/* SPDX-License-Identifier: MIT */
/*
 * agent_pvt.h - kvarena-agent: configuration, logging, the server loop and
 * the agent's own table of the arena's worker slots.
 */
#ifndef KVA_AGENT_PVT_H
#define KVA_AGENT_PVT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "kvarena.h"
#include "tiers.h"

#define AGENT_MAX_IDS 16

struct agent_config {
	char socket[108];            /* sun_path */
	mode_t socket_mode;
	gid_t socket_group;          /* (gid_t)-1: leave as created */
	char name[32];
	char backend[16];            /* "host" or "cuda" */
	uint32_t blocks;             /* 0: from memory */
	uint64_t memory;             /* bytes; used when blocks == 0 */
	/* --backend cuda: the device (an ordinal or a UUID; "" = 0), the share
	 * of its free memory the data takes when neither --blocks nor --memory
	 * says (0: not given), the chunks' size (0: the library's default),
	 * how workers get the memory */
	char device[64];
	double memory_fraction;
	uint64_t chunk_bytes;
	enum kva_cuda_ipc ipc;
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
	/* limits on what one peer may take (0 in the file or flags: default) */
	uint32_t max_pending;        /* connections waiting for their HELLO, in all */
	uint32_t max_pending_uid;    /* of them, from one uid */
	uint32_t hello_timeout_ms;   /* a HELLO must come within this */
	uint32_t max_slots_pid;      /* worker slots one process may hold */
	uint32_t max_slots_uid;      /* worker slots one uid may hold */
	bool allow_overcommit;       /* an arena larger than the memory there is */
	bool prefault;               /* touch every page of the data region at start */
	struct tier_config tiers;    /* the tiers below the arena (tiers/tiers.h) */
	bool host_node_set;          /* --host-numa-node given (else --numa-node's) */
	struct sockaddr_storage metrics_addr; /* --metrics (AF_INET, AF_INET6); AF_UNSPEC: off */
};

static inline bool agent_on_gpu(const struct agent_config *c)
{
	return !strcmp(c->backend, "cuda");
}

/* Prometheus metrics served (--metrics) */
static inline bool agent_metrics_on(const struct agent_config *c)
{
	return c->metrics_addr.ss_family != AF_UNSPEC;
}

/* tiers on: a host tier, a disk tier, or both */
static inline bool agent_tiers_on(const struct agent_config *c)
{
	return c->tiers.host_bytes || c->tiers.disk_dir[0];
}

/* config.c */

/*
 * agent_config_parse - defaults, then the --config file if one is named, then
 * the command line (which wins). Every bad value is refused with a message
 * naming the flag or key. Return: 0, 1 if --help or --version was printed,
 * or -EINVAL.
 */
int agent_config_parse(int argc, char **argv, struct agent_config *c);
/* the limits' defaults, once max_workers and the allow policy are known */
void agent_config_limits(struct agent_config *c);
/* printable UTF-8 of at most @max bytes, no control characters */
bool agent_name_ok(const char *s, size_t max);

/* log.c */
enum { LOG_ERR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };
extern int agent_log_level;
/*
 * One line per call, every byte that is not printable UTF-8 written as \xNN
 * (names and messages come from outside: they cannot forge lines). A call
 * site that logs more than LOG_BURST lines in a second is held to one line
 * a second saying how many it left out.
 */
void agent_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* the same, rate-limited as call site @site (a format string kept elsewhere) */
void agent_log_at(int level, const char *site, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
#define LOG_BURST 20
#define log_err(...) agent_log(LOG_ERR, __VA_ARGS__)
#define log_warn(...) agent_log(LOG_WARN, __VA_ARGS__)
#define log_info(...) agent_log(LOG_INFO, __VA_ARGS__)
#define log_debug(...) agent_log(LOG_DEBUG, __VA_ARGS__)
int agent_log_level_parse(const char *s);
/* the count of lines a call site left out, once its second is over */
void agent_log_flush(void);
/* the events logged at @level (LOG_ERR, LOG_WARN) since the start, those the
 * log level or the rate limit left out included: for the metrics */
uint64_t agent_log_events(int level);

/* server.c and slots.c */

enum watch_kind { W_LISTEN, W_SIGNAL, W_TIMER, W_CONN, W_PIDFD, W_METRICS };

/* why a connection was refused, for kvarena_refused_total{reason} */
enum agent_refusal {
	AR_NOT_ALLOWED,     /* uid and gids outside the allow policy */
	AR_FULL,            /* no free worker slot */
	AR_SLOT_LIMIT,      /* --max-slots-per-pid or --max-slots-per-uid */
	AR_PENDING_LIMIT,   /* --max-pending(-per-uid): the oldest silent connection closed */
	AR_HELLO_TIMEOUT,   /* no HELLO within --hello-timeout */
	AR_PROTOCOL,        /* a malformed HELLO */
	AR_VERSION,         /* another protocol version */
	AR_PID_MISMATCH,    /* HELLO's pid is not the socket's */
	AR_STOPPING,        /* the agent is shutting down */
	AR_OUT_OF_FDS,      /* the agent is out of file descriptors */
	AR_INTERNAL,        /* the agent failed (watching the process) */
	AR_N
};
extern const char *const agent_refusal_name[AR_N];

struct client;
struct slot_entry;
struct watch {
	enum watch_kind kind;
	struct client *c;
	struct slot_entry *e;
};

/* A connection: waiting for its HELLO, or an admitted worker's. */
struct client {
	int fd;               /* -1 once it ended */
	pid_t pid;            /* SO_PEERCRED, from the moment of accept */
	uid_t uid;
	gid_t gid;
	uint64_t since_ns;    /* accepted at */
	bool hello;           /* it said HELLO (or something): no longer pending */
	bool admitted;        /* a worker with a slot (observers are answered and closed) */
	bool bye;             /* it said BYE: it left its slot */
	uint32_t slot;
	char name[32];        /* from HELLO, checked printable */
	struct watch w;
};

/*
 * The agent's own entry for one worker slot: what it admitted or saw join,
 * the process (watched by a pidfd), and the generation of that life. This,
 * not the shared slot word, is what it admits, reclaims and reports from;
 * the shared word is a copy it checks every tick and puts back.
 */
enum slot_kind {
	SK_FREE = KVA_AGENT_SLOT_FREE,
	SK_RESERVED = KVA_AGENT_SLOT_RESERVED,
	SK_ATTACHED = KVA_AGENT_SLOT_ATTACHED,
	SK_JOINED = KVA_AGENT_SLOT_JOINED,
	SK_RECLAIM = KVA_AGENT_SLOT_RECLAIM_PENDING,
};

struct slot_entry {
	enum slot_kind kind;
	uint32_t slot, gen;
	pid_t pid;
	uid_t uid;
	int pidfd;                /* while the process is watched */
	uint64_t start;           /* the slot's start word for this life */
	char name[32];
	struct client *cl;        /* an admitted worker's connection, if open */
	uint64_t since_ns;
	uint32_t last_kind;       /* JOINING or LIVE: what the word last said */
	unsigned odd_ticks;       /* ticks the word has shown a later life */
	uint64_t retry_ns, pending_since_ns;
	uint32_t retry_ms;
	struct watch w;
};

struct agent {
	const struct agent_config *cfg;
	struct kva_arena *a;
	/* the agent's own worker (its tier thread works through it), in the
	 * arena's last slot, and the tiers; NULL without tiers */
	struct kva_worker *self;
	struct tiers *tiers;
	int ep, lfd, sfd, tfd, spare_fd;
	struct client **clients;  /* [max_clients] */
	unsigned max_clients;
	struct watch wlisten, wsignal, wtimer, wmetrics;
	bool stopping, listen_paused;
	uint64_t deadline_ns, last_check_ns, listen_resume_ns, listen_backoff_ms;
	uint64_t next_tick_ns;    /* the tick runs by the clock (tick_if_due) */
	uint64_t next_dev_ns;     /* a GPU arena: when to read the device's memory next */
	uint64_t watch_gen;       /* bumped when a watch is freed or moved */
	unsigned rr;              /* where the next epoll batch is read from */
	uint64_t admitted, refused, reclaimed;
	uint64_t refused_by[AR_N];  /* refused, by reason */
	uint64_t reclaimed_blocks;  /* blocks the agent's reclaims freed */
	uint32_t reclaims_pending;  /* as of the last tick */
	uint64_t dev_free, dev_total; /* a GPU arena: the device's memory as last read */
	struct metrics *metrics;    /* --metrics: the HTTP server (metrics.c); else NULL */
	struct slot_entry slots[KVA_MAX_WORKERS];
	uint32_t n_slots;
	/* words only the agent writes, as it last wrote them */
	struct kva__agent_words *words;
	uint64_t repairs;
	char last_repair[128];
	int64_t pub_off_seen;     /* the published count's error at the last check */
};

uint64_t agent_now_ns(void);
int agent_watch(struct agent *ag, int fd, struct watch *w);
void agent_unwatch(struct agent *ag, int *fd);

/* slots.c */
void slots_init(struct agent *ag);
void slots_fini(struct agent *ag);
/* a slot for admitted process @cl, or a negative errno and a reason in @why */
int slots_admit(struct agent *ag, struct client *cl, char *why, size_t len);
/* it said ADOPTED: its slot word is LIVE now */
void slots_adopted(struct agent *ag, struct client *cl);
/* its connection ended (BYE, EOF): what did the worker leave behind? */
void slots_conn_ended(struct agent *ag, struct client *cl);
/* the process of @e exited (its pidfd) */
void slots_exited(struct agent *ag, struct slot_entry *e);
/* every tick: retries, the shared words checked against the table, repairs,
 * the view for ops tools */
void slots_tick(struct agent *ag);
/* every check interval: the arena's invariant, hint bits, the published count */
void slots_check(struct agent *ag);
unsigned slots_workers(const struct agent *ag);
/* the agent changed a word it owns (state, policy...): remember it */
void slots_words_changed(struct agent *ag);

/* metrics.c: /metrics over HTTP (libmicrohttpd) in the agent's own loop */

/* bind cfg->metrics_addr and serve it (its epoll fd watched as W_METRICS);
 * 0 or a negative errno, the reason logged */
int metrics_start(struct agent *ag);
/* run MHD when its epoll fd is readable (@ready) or its timeout came, and
 * cut connections past their deadline; from the loop, after every batch */
void metrics_poll(struct agent *ag, bool ready);
/* how long the loop may sleep for MHD's sake, at most @max_ms */
int metrics_timeout_ms(struct agent *ag, int max_ms);
void metrics_stop(struct agent *ag);

/* server.c */

/* connections waiting for their HELLO */
unsigned agent_conns_waiting(const struct agent *ag);

/* agent_serve - listen, admit, watch, reclaim, until SIGTERM/SIGINT. @self
 * and @tiers: the agent's own worker and its tiers, or NULL. */
int agent_serve(const struct agent_config *c, struct kva_arena *a, struct kva_worker *self,
		struct tiers *tiers);

#endif
