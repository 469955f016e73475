/* SPDX-License-Identifier: MIT */
/*
 * slots.c - the agent's own table of the arena's worker slots, and what it
 * decides from it: which slot a newcomer gets, whose blocks come back when a
 * process exits, which shared words were overwritten and go back.
 *
 * Any admitted worker maps the metadata read-write (the pool is lock-free,
 * shared memory), so any of them can write any slot word, the header, the
 * agent's own words. The agent never takes a decision from them:
 *
 *   - a slot goes to a newcomer only if the table says it is free (and the
 *     shared word agrees: a worker may have joined it on its own);
 *   - a life (slot, generation) is reclaimed when the table's pidfd of its
 *     process fires, by generation, whatever pid the shared word names;
 *   - every tick (100 ms) each shared slot word is compared with the table:
 *     a worker that joined on its own is learnt and watched; a word of a live
 *     process that was overwritten is put back (a word that shows the life
 *     ended is given five ticks for the worker's BYE, which follows a real
 *     leave at once); the words only the agent writes are compared with the
 *     copies it keeps and put back; each repair is logged with the workers
 *     that could have written it, and counted where ops tools see it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/pidfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_pvt.h"
#include "arena_pvt.h"

#define ODD_TICKS 5          /* ticks a "this life ended" word waits for its BYE */
#define RETRY_MAX_MS 2000    /* a pending reclaim is retried at least this often */
#define PENDING_WARN_MS 10000
#define MAX_DEPARTED 64

/*
 * Lives that ended by their word (a leave, or so the word says) while their
 * process runs on: watched until it exits, when any block still tagged with
 * the life is swept (there is none after a real leave; there are the
 * worker's own if the word was overwritten to look like one).
 */
static struct slot_entry departed[MAX_DEPARTED];

/* the shared state word of @slot: a copy, read only to be checked */
static uint64_t shared_word(struct agent *ag, uint32_t slot)
{
	return atomic_load_explicit(&ag->a->slots[slot].state, memory_order_acquire);
}

/* who could have written a word: the live workers, newest first */
static void suspects(struct agent *ag, uint32_t victim, char *out, size_t len)
{
	bool used[KVA_MAX_WORKERS] = { false };
	size_t off = 0;

	out[0] = '\0';
	for (unsigned k = 0; k < 3; k++) {
		struct slot_entry *best = NULL;

		for (uint32_t s = 0; s < ag->n_slots; s++) {
			struct slot_entry *e = &ag->slots[s];

			if (used[s] || s == victim ||
			    (e->kind != SK_ATTACHED && e->kind != SK_JOINED && e->kind != SK_RESERVED))
				continue;
			if (!best || e->since_ns > best->since_ns)
				best = e;
		}
		if (!best)
			break;
		used[best->slot] = true;
		off += (size_t)snprintf(out + off, len > off ? len - off : 0, "%sslot %u pid %d \"%s\"",
					k ? ", " : "", best->slot, (int)best->pid, best->name);
	}
	if (!out[0])
		snprintf(out, len, "no worker attached now");
}

/* @words put back (or corrected): logged with the likely writers, counted */
static void repaired(struct agent *ag, uint32_t victim, unsigned words, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void repaired(struct agent *ag, uint32_t victim, unsigned words, const char *fmt, ...)
{
	char what[128], who[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	suspects(ag, victim, who, sizeof(who));
	ag->repairs += words;
	snprintf(ag->last_repair, sizeof(ag->last_repair), "%s", what);
	/* counted where kvarena-ctl reads it before the line is written, so
	 * that whoever reads the line and then asks kvarena-ctl finds it
	 * counted (the check's end rewrites the whole view again) */
	kva__view_set(ag->a, ag->repairs, ag->last_repair, ag->reclaims_pending);
	log_warn("repaired: %s; written by a worker, most likely one of: %s", what, who);
}

static void entry_clear(struct agent *ag, struct slot_entry *e)
{
	agent_unwatch(ag, &e->pidfd);
	if (e->cl)
		e->cl->admitted = false;
	*e = (struct slot_entry){ .kind = SK_FREE, .slot = e->slot, .pidfd = -1,
				  .w = { W_PIDFD, NULL, e } };
}

static int entry_watch(struct agent *ag, struct slot_entry *e)
{
	e->pidfd = pidfd_open(e->pid, 0);
	if (e->pidfd < 0)
		return -errno;
	e->w = (struct watch){ W_PIDFD, NULL, e };
	if (agent_watch(ag, e->pidfd, &e->w) < 0) {
		int ret = -errno;

		agent_unwatch(ag, &e->pidfd);
		return ret;
	}
	return 0;
}

/* a life that ended by its word while its process runs: watch it until it
 * exits (its pidfd moves to the departed entry) */
static void depart(struct agent *ag, struct slot_entry *e)
{
	struct slot_entry *d = NULL;

	for (unsigned k = 0; k < MAX_DEPARTED && !d; k++)
		if (!departed[k].pid)
			d = &departed[k];
	if (!d) { /* the oldest goes unwatched */
		d = &departed[0];
		for (unsigned k = 1; k < MAX_DEPARTED; k++)
			if (departed[k].since_ns < d->since_ns)
				d = &departed[k];
		log_debug("no longer watching pid %d for blocks of slot %u left behind",
			  (int)d->pid, d->slot);
		agent_unwatch(ag, &d->pidfd);
	}
	*d = *e;
	d->cl = NULL;
	d->kind = SK_RECLAIM;
	d->retry_ns = UINT64_MAX; /* not before its process exits */
	d->pending_since_ns = 0;
	d->w = (struct watch){ W_PIDFD, NULL, d };
	if (d->pidfd >= 0) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &d->w };

		ag->watch_gen++; /* the batch may still name the old entry */
		if (epoll_ctl(ag->ep, EPOLL_CTL_MOD, d->pidfd, &ev) < 0) {
			agent_unwatch(ag, &d->pidfd);
			*d = (struct slot_entry){ .pidfd = -1 };
		}
	} else {
		*d = (struct slot_entry){ .pidfd = -1 };
	}
	e->pidfd = -1; /* moved, or gone */
	entry_clear(ag, e);
}

/* the parent of @pid, from /proc; 0 if unknown */
static pid_t parent_of(pid_t pid)
{
	char path[64], buf[512], *p;
	int ppid = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (!(f = fopen(path, "r")))
		return 0;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	if (!p || sscanf(p + 1, " %*c %d", &ppid) != 1)
		return 0;
	return (pid_t)ppid;
}

/* @pid, or a process it descends from, is one the agent admitted or watches */
static bool known_lineage(struct agent *ag, pid_t pid)
{
	for (int depth = 0; pid > 1 && depth < 16; depth++, pid = parent_of(pid))
		for (uint32_t s = 0; s < ag->n_slots; s++) {
			const struct slot_entry *e = &ag->slots[s];

			if (e->pid == pid && (e->kind == SK_RESERVED || e->kind == SK_ATTACHED ||
					      e->kind == SK_JOINED))
				return true;
		}
	return false;
}

void slots_init(struct agent *ag)
{
	/* with tiers, the last slot is the agent's own (main.c) */
	ag->n_slots = kva_arena_info(ag->a)->max_workers - (ag->self ? 1 : 0);
	for (uint32_t s = 0; s < KVA_MAX_WORKERS; s++)
		ag->slots[s] = (struct slot_entry){ .kind = SK_FREE, .slot = s, .pidfd = -1,
						    .w = { W_PIDFD, NULL, &ag->slots[s] } };
	for (unsigned k = 0; k < MAX_DEPARTED; k++)
		departed[k] = (struct slot_entry){ .pidfd = -1 };
	ag->words = calloc(1, sizeof(*ag->words));
	if (ag->words)
		kva__agent_words_save(ag->a, ag->words);
}

void slots_fini(struct agent *ag)
{
	for (uint32_t s = 0; s < KVA_MAX_WORKERS; s++)
		agent_unwatch(ag, &ag->slots[s].pidfd);
	for (unsigned k = 0; k < MAX_DEPARTED; k++)
		agent_unwatch(ag, &departed[k].pidfd);
	free(ag->words);
	ag->words = NULL;
}

void slots_words_changed(struct agent *ag)
{
	if (ag->words)
		kva__agent_words_save(ag->a, ag->words);
}

unsigned slots_workers(const struct agent *ag)
{
	unsigned n = 0;

	for (uint32_t s = 0; s < ag->n_slots; s++)
		n += ag->slots[s].kind == SK_RESERVED || ag->slots[s].kind == SK_ATTACHED;
	return n;
}

/* ----------------------------------------------------------- admission */

int slots_admit(struct agent *ag, struct client *cl, char *why, size_t len)
{
	const struct agent_config *c = ag->cfg;
	uint32_t per_pid = 0, per_uid = 0, free_slots = 0;
	int ret;

	for (uint32_t s = 0; s < ag->n_slots; s++) {
		const struct slot_entry *e = &ag->slots[s];

		free_slots += e->kind == SK_FREE;
		if (e->kind != SK_RESERVED && e->kind != SK_ATTACHED && e->kind != SK_JOINED)
			continue;
		per_pid += e->pid == cl->pid;
		per_uid += e->uid == cl->uid;
	}
	if (!free_slots) /* the reason is that, whoever holds them */
		goto full;
	if (per_pid >= c->max_slots_pid) {
		snprintf(why, len, "process %d holds %u worker slots, the most one process may "
			 "(--max-slots-per-pid %u)", (int)cl->pid, per_pid, c->max_slots_pid);
		return -EDQUOT;
	}
	if (per_uid >= c->max_slots_uid) {
		snprintf(why, len, "uid %u holds %u worker slots, the most one user may "
			 "(--max-slots-per-uid %u)", (unsigned)cl->uid, per_uid, c->max_slots_uid);
		return -EDQUOT;
	}
	for (uint32_t s = 0; s < ag->n_slots; s++) {
		struct slot_entry *e = &ag->slots[s];
		uint64_t start;
		uint32_t gen;

		if (e->kind != SK_FREE || kva__slot_reserve_at(ag->a, s, cl->pid, &gen, &start) < 0)
			continue; /* a worker joined it on its own: the tick learns it */
		*e = (struct slot_entry){ .kind = SK_RESERVED, .slot = s, .gen = gen,
					  .pid = cl->pid, .uid = cl->uid, .pidfd = -1, .cl = cl,
					  .since_ns = agent_now_ns(), .last_kind = KVA_SLOT_JOINING,
					  .start = start };
		snprintf(e->name, sizeof(e->name), "%s", cl->name);
		/* watch the process before it can hold anything */
		if ((ret = entry_watch(ag, e)) < 0) {
			kva_arena_release_slot(ag->a, s, gen);
			entry_clear(ag, e);
			snprintf(why, len, "watching the process: %s", strerror(-ret));
			return ret;
		}
		cl->slot = s;
		return 0;
	}
full:
	snprintf(why, len, "all %u worker slots are taken", ag->n_slots);
	return -EUSERS;
}

/* ---------------------------------------------------------- the end of a life */

/* a life whose process has exited: reclaim it, or wait for the lease */
static void try_reclaim(struct agent *ag, struct slot_entry *e)
{
	struct kva_reclaim_report r;
	uint64_t now = agent_now_ns();
	int ret = kva__reclaim_life(ag->a, e->slot, e->gen, &r);

	if (ret == 0 || ret == -ENOENT) {
		if (ret == 0) {
			ag->reclaimed++;
			ag->reclaimed_blocks += (uint64_t)r.owned_freed + r.shared_freed;
			log_info("worker \"%s\" pid %d died holding slot %u: reclaimed %u blocks "
				 "(its cache included) and its hold on %u shared blocks (%u freed) "
				 "in %.3f ms", e->name, (int)e->pid, e->slot, r.owned_freed,
				 r.shared_dropped, r.shared_freed, (double)r.elapsed_ns / 1e6);
			if (r.hints_repaired)
				log_info("  %u free blocks made findable again", r.hints_repaired);
		} else {
			log_debug("pid %d (slot %u) exited: nothing of it left in the arena",
				  (int)e->pid, e->slot);
		}
		if (e >= departed && e < departed + MAX_DEPARTED) {
			agent_unwatch(ag, &e->pidfd);
			*e = (struct slot_entry){ .pidfd = -1 };
		} else {
			entry_clear(ag, e);
		}
		return;
	}
	/* -EBUSY: another reclaimer (a worker may reclaim) holds the slot's
	 * lease; it finishes, or dies and its lease comes to us. Retried on the
	 * tick with a backoff: never on every wakeup. */
	if (!e->pending_since_ns) {
		e->pending_since_ns = now;
		log_info("reclaim of slot %u (pid %d \"%s\") waits: %s; retrying", e->slot,
			 (int)e->pid, e->name, kva_errmsg());
	} else if ((now - e->pending_since_ns) / 1000000 >= PENDING_WARN_MS &&
		   e->retry_ms == RETRY_MAX_MS) {
		log_warn("reclaim of slot %u (pid %d) pending for %.0f s: %s", e->slot, (int)e->pid,
			 (double)(now - e->pending_since_ns) / 1e9, kva_errmsg());
		e->retry_ms = RETRY_MAX_MS + 1; /* said once */
	}
	if (e->retry_ms <= RETRY_MAX_MS)
		e->retry_ms = e->retry_ms ? (e->retry_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS
								   : e->retry_ms * 2)
					  : 100;
	e->retry_ns = now + (uint64_t)(e->retry_ms > RETRY_MAX_MS ? RETRY_MAX_MS : e->retry_ms) *
				    1000000ull;
}

void slots_exited(struct agent *ag, struct slot_entry *e)
{
	agent_unwatch(ag, &e->pidfd); /* readable for good from now on */
	if (e->cl)
		e->cl->admitted = false; /* its connection ends too */
	e->cl = NULL;
	e->kind = SK_RECLAIM;
	e->pending_since_ns = 0;
	e->retry_ms = 0;
	try_reclaim(ag, e);
}

void slots_adopted(struct agent *ag, struct client *cl)
{
	struct slot_entry *e;

	if (!cl->admitted || cl->slot >= ag->n_slots || ag->slots[cl->slot].cl != cl)
		return;
	e = &ag->slots[cl->slot];
	e->last_kind = KVA_SLOT_LIVE;
	if (e->kind == SK_RESERVED)
		e->kind = SK_ATTACHED;
	/* it says it made its word LIVE: a word of the same life that says
	 * otherwise now was overwritten (or put back as JOINING before this
	 * message came). A later generation is the worker's own leave (its
	 * BYE is on the way), a reclaim is not ours to undo. */
	if (e->kind == SK_ATTACHED) {
		uint64_t w = shared_word(ag, e->slot), want = kva__slot_word(KVA_SLOT_LIVE, e->gen,
									   e->pid);

		if (w != want && kva__slot_gen(w) == e->gen &&
		    kva__slot_kind(w) != KVA_SLOT_RECLAIMING) {
			kva__slot_restore(ag->a, e->slot, want, e->start);
			repaired(ag, e->slot, 1, "slot %u of live pid %d (\"%s\") was overwritten "
				 "before its ADOPTED was read (kind %u, generation %u, pid %d), "
				 "put back", e->slot, (int)e->pid, e->name, kva__slot_kind(w),
				 kva__slot_gen(w), (int)kva__slot_pid(w));
		}
		e->odd_ticks = 0;
	}
}

void slots_conn_ended(struct agent *ag, struct client *cl)
{
	struct slot_entry *e;
	uint64_t w;

	if (!cl->admitted || cl->slot >= ag->n_slots || ag->slots[cl->slot].cl != cl)
		return;
	e = &ag->slots[cl->slot];
	e->cl = NULL;
	cl->admitted = false;
	if (e->kind != SK_RESERVED && e->kind != SK_ATTACHED)
		return;
	w = shared_word(ag, e->slot);
	/* taken back only if the table too says it was never adopted: a word
	 * written to look unadopted must not free a slot whose blocks are held */
	if (e->kind == SK_RESERVED && w == kva__slot_word(KVA_SLOT_JOINING, e->gen, e->pid) &&
	    kva_arena_release_slot(ag->a, e->slot, e->gen) == 0) {
		log_info("worker \"%s\" pid %d never adopted slot %u: taken back", e->name,
			 (int)e->pid, e->slot);
		entry_clear(ag, e);
	} else if (kva__slot_gen(w) != e->gen) {
		log_info("worker \"%s\" pid %d left slot %u", e->name, (int)e->pid, e->slot);
		/* Said BYE: the worker itself says it left, having given all back
		 * first (kva_worker_leave), and nothing is watched for. Without it
		 * (the connection just closed), only the word says so: its process
		 * is watched, and what is left of the life swept when it exits. */
		if (cl->bye)
			entry_clear(ag, e);
		else
			depart(ag, e);
	} else {
		/* still holding: reclaimed when its process ends */
		log_debug("worker \"%s\" pid %d closed its connection without leaving slot %u",
			  e->name, (int)e->pid, e->slot);
	}
}

/* ------------------------------------------------------------- the tick */

/*
 * A worker joined slot @e on its own: a thread of an admitted process, or a
 * child of one. Watched from now on. A pid the agent knows nothing of
 * (neither admitted nor descending from an admitted or watched process) was
 * not admitted: its life is taken back as a dead one's would be; a word
 * naming such a pid is also how a worker could make the agent watch a
 * process that never exits and keep the slot from everyone.
 */
static void learn(struct agent *ag, struct slot_entry *e, uint64_t w)
{
	char path[64], name[32];
	struct stat st;
	int ret;

	*e = (struct slot_entry){ .kind = SK_JOINED, .slot = e->slot, .gen = kva__slot_gen(w),
				  .pid = kva__slot_pid(w), .pidfd = -1, .since_ns = agent_now_ns(),
				  .last_kind = kva__slot_kind(w), .w = { W_PIDFD, NULL, e } };
	kva__slot_name(&ag->a->slots[e->slot], name);
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->start = atomic_load_explicit(&ag->a->slots[e->slot].start, memory_order_relaxed);
	snprintf(path, sizeof(path), "/proc/%d", (int)e->pid);
	e->uid = stat(path, &st) == 0 ? st.st_uid : (uid_t)-1;
	if (e->pid > 0 && !known_lineage(ag, e->pid)) {
		e->kind = SK_RECLAIM;
		repaired(ag, e->slot, 1, "slot %u was claimed for pid %d, which the agent did not "
			 "admit (nor a parent of it): taken back", e->slot, (int)e->pid);
		try_reclaim(ag, e);
		return;
	}
	ret = e->pid > 0 ? entry_watch(ag, e) : -ESRCH;
	if (ret == -ESRCH) { /* joined and already gone: reclaimed now */
		e->kind = SK_RECLAIM;
		try_reclaim(ag, e);
		return;
	}
	if (ret < 0) {
		log_warn("slot %u: pid %d joined on its own and cannot be watched (%s): its "
			 "blocks come back only through a worker's reclaim", e->slot, (int)e->pid,
			 strerror(-ret));
		entry_clear(ag, e);
		return;
	}
	log_info("pid %d (uid %d) joined slot %u on its own as \"%s\": watched", (int)e->pid,
		 (int)e->uid, e->slot, e->name);
}

/* the shared word of a live slot of ours, compared with the table */
static void check_live(struct agent *ag, struct slot_entry *e, uint64_t w)
{
	uint64_t want = kva__slot_word(e->last_kind, e->gen, e->pid);

	if (w == kva__slot_word(KVA_SLOT_JOINING, e->gen, e->pid) ||
	    w == kva__slot_word(KVA_SLOT_LIVE, e->gen, e->pid)) {
		if (kva__slot_kind(w) == KVA_SLOT_LIVE) {
			e->last_kind = KVA_SLOT_LIVE;
			if (e->kind == SK_RESERVED)
				e->kind = SK_ATTACHED;
		}
		e->odd_ticks = 0;
		return;
	}
	if (kva__slot_kind(w) == KVA_SLOT_RECLAIMING) {
		/* A worker reclaims a life whose process is alive: it was told
		 * it is dead (an overwritten pid or start time). Its blocks are
		 * going; the word is not put back over them. */
		log_warn("slot %u of live pid %d (\"%s\") is being reclaimed by pid %d: its slot "
			 "words were overwritten; that worker loses its slot", e->slot, (int)e->pid,
			 e->name, (int)kva__slot_pid(w));
		depart(ag, e);
		return;
	}
	if (kva__slot_gen(w) != e->gen) {
		/* the word says this life ended: a leave. Nobody says BYE for a
		 * worker that joined on its own or closed its connection: the
		 * word is taken, and what the life may have left behind is swept
		 * when its process exits. An admitted worker says BYE at once. */
		if (!e->cl) {
			log_info("pid %d (\"%s\") left slot %u", (int)e->pid, e->name, e->slot);
			depart(ag, e);
			return;
		}
		if (++e->odd_ticks < ODD_TICKS)
			return;
	} else if (e->last_kind == KVA_SLOT_JOINING && e->cl && ++e->odd_ticks < ODD_TICKS) {
		/* Not adopted as far as the table knows: the worker may have
		 * made its word LIVE and its ADOPTED be still on the way (a
		 * busy loop reads it later). Putting back JOINING now would
		 * tell a live worker it was reclaimed; the ADOPTED, when it
		 * comes, puts back LIVE (slots_adopted). */
		return;
	}
	kva__slot_restore(ag->a, e->slot, want, e->start);
	repaired(ag, e->slot, 1, "slot %u of live pid %d (\"%s\") was overwritten (kind %u, "
		 "generation %u, pid %d), put back", e->slot, (int)e->pid, e->name,
		 kva__slot_kind(w), kva__slot_gen(w), (int)kva__slot_pid(w));
	e->odd_ticks = 0;
}

void slots_tick(struct agent *ag)
{
	uint64_t now = agent_now_ns();
	uint32_t pending = 0;
	char what[128];
	unsigned n;

	for (uint32_t s = 0; s < ag->n_slots; s++) {
		struct slot_entry *e = &ag->slots[s];
		uint64_t w = shared_word(ag, s);

		switch (e->kind) {
		case SK_FREE:
			if (kva__slot_kind(w) == KVA_SLOT_JOINING || kva__slot_kind(w) == KVA_SLOT_LIVE)
				learn(ag, e, w);
			else if (kva__slot_kind(w) == KVA_SLOT_FREE && kva__slot_pid(w)) {
				kva__slot_restore(ag->a, s, kva__slot_word(KVA_SLOT_FREE,
									 kva__slot_gen(w), 0),
						  0);
				repaired(ag, s, 1, "free slot %u named pid %d", s, (int)kva__slot_pid(w));
			}
			break;
		case SK_RESERVED:
		case SK_ATTACHED:
		case SK_JOINED:
			check_live(ag, e, w);
			break;
		case SK_RECLAIM:
			if (now >= e->retry_ns)
				try_reclaim(ag, e);
			break;
		}
	}
	for (unsigned k = 0; k < MAX_DEPARTED; k++)
		if (departed[k].pid && departed[k].pidfd < 0 && now >= departed[k].retry_ns)
			try_reclaim(ag, &departed[k]);
	if (ag->self) {
		/* our own slot: LIVE, ours; a worker that overwrote it would make
		 * the tier thread's frees fail until it is back */
		uint32_t s = kva_worker_slot(ag->self);
		uint64_t want = ag->self->slot_word, w = shared_word(ag, s);

		if (w != want) {
			kva__slot_restore(ag->a, s, want, kva__slot_start_of(getpid(), ag->self->gen));
			repaired(ag, s, 1, "the agent's own slot %u was overwritten (kind %u, generation "
				 "%u, pid %d), put back", s, kva__slot_kind(w), kva__slot_gen(w),
				 (int)kva__slot_pid(w));
		}
		kva__view_set_slot(ag->a, s, KVA_AGENT_SLOT_AGENT, ag->self->gen, getpid(),
				   (uint32_t)geteuid(), 0);
	}
	if (ag->words && (n = kva__agent_words_repair(ag->a, ag->words, what, sizeof(what))))
		repaired(ag, UINT32_MAX, n, "%s%s", what, n > 1 ? " (and more words)" : "");
	/* the view for ops tools, rewritten whole */
	for (uint32_t s = 0; s < ag->n_slots; s++) {
		const struct slot_entry *e = &ag->slots[s];
		uint32_t ms = e->kind == SK_RECLAIM && e->pending_since_ns
				      ? (uint32_t)((now - e->pending_since_ns) / 1000000)
				      : 0;

		pending += e->kind == SK_RECLAIM;
		kva__view_set_slot(ag->a, s, e->kind, e->gen, e->pid, (uint32_t)e->uid, ms);
	}
	kva__view_set(ag->a, ag->repairs, ag->last_repair, pending);
	ag->reclaims_pending = pending;
}

/* ------------------------------------------------------------ the check */

void slots_check(struct agent *ag)
{
	struct kva_check_report r;
	uint32_t blocks = kva_arena_info(ag->a)->blocks, hints;
	int64_t off;

	/* Every free block findable: a zeroed hint word would make allocation
	 * fail with blocks free. A few bits missing are frees in flight. */
	hints = kva__repair_hints(ag->a);
	if (hints >= 64 && hints >= blocks / 100)
		repaired(ag, UINT32_MAX, 1, "%u free blocks had lost their hint bits (the allocator "
			 "could not find them)", hints);
	else if (hints)
		log_debug("arena check: %u free blocks made findable (frees in flight)", hints);

	if (kva_arena_check(ag->a, &r) == 0) {
		ag->pub_off_seen = 0;
		return;
	}
	if (r.bad_descriptors || r.stale_owners || r.dead_holders)
		log_warn("arena check: %u corrupt descriptors, %u stale owners, %u dead holders "
			 "(first: %s): skipped, not followed", r.bad_descriptors, r.stale_owners,
			 r.dead_holders, r.first_problem);
	else
		log_debug("arena check: %u index entries and published count %s while workers "
			  "run (first: %s)", r.index_bad, r.published_bad ? "off" : "right",
			  r.first_problem);
	/* The published count off by the same amount at three checks running is
	 * no publication in flight: a slot's count was overwritten. The
	 * agent's correction word takes the difference. */
	off = (int64_t)(int32_t)(uint32_t)(r.published_count - r.published_blocks);
	if (!off) {
		ag->pub_off_seen = 0;
	} else if (off != (ag->pub_off_seen >> 8) || (ag->pub_off_seen & 0xff) < 2) {
		ag->pub_off_seen = off == (ag->pub_off_seen >> 8)
					   ? ag->pub_off_seen + 1
					   : (int64_t)((uint64_t)off << 8);
	} else if (ag->words) {
		ag->words->pub_fix = (uint32_t)(ag->words->pub_fix - (uint64_t)off);
		atomic_store_explicit(&ag->a->pool->pub_fix, ag->words->pub_fix, memory_order_relaxed);
		repaired(ag, UINT32_MAX, 1, "the published count was off by %lld (a slot's count "
			 "overwritten): corrected", (long long)off);
		ag->pub_off_seen = 0;
	}
}
