/* SPDX-License-Identifier: MIT */
/*
 * server.c - the agent's one thread: an epoll loop over the listening socket,
 * every connection, a pidfd per admitted worker, a signalfd and a timerfd.
 *
 * A worker's life, as the agent sees it:
 *   HELLO        credentials checked, a slot reserved for its pid, WELCOME
 *                with the region fds, its pidfd watched
 *   (it adopts the slot and works in shared memory; the agent sees nothing)
 *   BYE or EOF   it left: its slot is FREE again, forget it; or it closed the
 *                socket without leaving: keep watching its pidfd
 *   pidfd        it exited: reclaim its slot unless it left first
 * A slot reserved but never adopted is taken back when the connection ends.
 *
 * Nothing read from shared memory is trusted: slot indices come from the
 * agent's own table, and the arena's reclaim and check bounds-check every
 * word they read.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/pidfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "agent_pvt.h"
#include "proto_pvt.h"

#define MAX_CLIENTS (KVA_MAX_WORKERS + 64)
#define TICK_MS 100

enum watch_kind { W_LISTEN, W_SIGNAL, W_TIMER, W_CONN, W_PIDFD };

struct client;
struct watch {
	enum watch_kind kind;
	struct client *c;
};

struct client {
	int fd;            /* the connection; -1 once it ended */
	int pidfd;         /* an admitted worker's process; -1 otherwise */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	bool admitted;
	bool observer;
	bool reclaim_pending; /* its process died, its reclaim failed: the timer retries */
	uint32_t slot, gen;
	char name[KVA__NAME_LEN];
	struct watch wconn, wpid;
};

struct agent {
	const struct agent_config *cfg;
	struct kva_arena *a;
	int ep, lfd, sfd, tfd;
	struct client *clients[MAX_CLIENTS];
	struct watch wlisten, wsignal, wtimer;
	bool stopping;
	uint64_t deadline_ns, last_check_ns;
	uint64_t admitted, refused, reclaimed;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int watch(struct agent *ag, int fd, struct watch *w)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = w };

	return epoll_ctl(ag->ep, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static void unwatch(struct agent *ag, int *fd)
{
	if (*fd < 0)
		return;
	epoll_ctl(ag->ep, EPOLL_CTL_DEL, *fd, NULL);
	close(*fd);
	*fd = -1;
}

static void client_free(struct agent *ag, struct client *cl)
{
	unwatch(ag, &cl->fd);
	unwatch(ag, &cl->pidfd);
	for (unsigned k = 0; k < MAX_CLIENTS; k++)
		if (ag->clients[k] == cl)
			ag->clients[k] = NULL;
	free(cl);
}

static unsigned workers(const struct agent *ag)
{
	unsigned n = 0;

	for (unsigned k = 0; k < MAX_CLIENTS; k++)
		n += ag->clients[k] && ag->clients[k]->admitted && !ag->clients[k]->observer;
	return n;
}

/* ------------------------------------------------------------ listening */

static int listen_socket(const struct agent_config *c, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[sizeof(c->socket)];
	struct stat st;
	mode_t old;
	int fd, ret;

	snprintf(dir, sizeof(dir), "%s", c->socket);
	if (mkdir(dirname(dir), 0755) < 0 && errno != EEXIST) {
		log_err("socket directory %s: %s", dir, strerror(errno));
		return -errno;
	}
	if (lstat(c->socket, &st) == 0) {
		int probe;

		if (!S_ISSOCK(st.st_mode)) {
			log_err("%s exists and is not a socket", c->socket);
			return -EEXIST;
		}
		/* a live agent answers; a stale socket of a dead one refuses */
		if (kva__sock_connect(c->socket, &probe) == 0) {
			close(probe);
			log_err("another agent is listening on %s", c->socket);
			return -EADDRINUSE;
		}
		unlink(c->socket);
	}
	memcpy(sa.sun_path, c->socket, strlen(c->socket) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	old = umask(0177); /* no moment with a wider mode than asked */
	ret = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (ret < 0 || chmod(c->socket, c->socket_mode) < 0 ||
	    (c->socket_group != (gid_t)-1 && chown(c->socket, (uid_t)-1, c->socket_group) < 0) ||
	    listen(fd, 64) < 0) {
		ret = -errno;
		log_err("listening on %s: %s", c->socket, strerror(-ret));
		close(fd);
		return ret;
	}
	*out = fd;
	return 0;
}

static void on_listen(struct agent *ag)
{
	for (;;) {
		int fd = accept4(ag->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		struct client *cl;
		unsigned k;

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("accept: %s", strerror(errno));
			return;
		}
		for (k = 0; k < MAX_CLIENTS && ag->clients[k]; k++)
			;
		cl = k < MAX_CLIENTS ? calloc(1, sizeof(*cl)) : NULL;
		if (!cl) {
			log_warn("too many connections: one closed before its HELLO");
			close(fd);
			continue;
		}
		*cl = (struct client){ .fd = fd, .pidfd = -1 };
		cl->wconn = (struct watch){ W_CONN, cl };
		cl->wpid = (struct watch){ W_PIDFD, cl };
		ag->clients[k] = cl;
		if (watch(ag, fd, &cl->wconn) < 0)
			client_free(ag, cl);
	}
}

/* ------------------------------------------------------------ admission */

static int refuse(struct agent *ag, struct client *cl, enum kva__refusal why, const char *fmt,
		  ...) __attribute__((format(printf, 4, 5)));

static int refuse(struct agent *ag, struct client *cl, enum kva__refusal why, const char *fmt,
		   ...)
{
	union kva__msg m;
	char text[KVA__TEXT_LEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	/* the log line first: it exists by the time the peer reads why */
	log_warn("refused pid %d uid %u gid %u (\"%s\"): %s: %s", (int)cl->pid, (unsigned)cl->uid,
		 (unsigned)cl->gid, cl->name, kva__refusal_name(why), text);
	kva__msg_init(&m, KVA__MSG_REFUSE);
	m.refuse.reason = why;
	kva__msg_str(m.refuse.text, sizeof(m.refuse.text), text);
	kva__sock_send(cl->fd, &m, NULL, 0);
	ag->refused++;
	client_free(ag, cl);
	return 0;
}

static bool in_list(const uint32_t *list, unsigned n, uint32_t id)
{
	for (unsigned k = 0; k < n; k++)
		if (list[k] == id)
			return true;
	return false;
}

/* The uid, or the primary or a supplementary gid of the peer, is allowed. */
static bool allowed(const struct agent_config *c, int fd, uid_t uid, gid_t gid)
{
	gid_t groups[256];
	socklen_t len = sizeof(groups);

	if (in_list(c->allow_uid, c->n_allow_uid, uid) || in_list(c->allow_gid, c->n_allow_gid, gid))
		return true;
	if (!c->n_allow_gid || getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return false;
	for (size_t k = 0; k < len / sizeof(gid_t); k++)
		if (in_list(c->allow_gid, c->n_allow_gid, groups[k]))
			return true;
	return false;
}

/* read-only duplicates of the region fds: a new open file description */
static int reopen_ro(int fd)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return open(path, O_RDONLY | O_CLOEXEC);
}

static int welcome(struct agent *ag, struct client *cl, uint32_t slot, uint32_t gen, bool ro)
{
	const struct kva_arena_info *info = kva_arena_info(ag->a);
	int fds[2] = { kva_arena_meta_fd(ag->a), kva_arena_data_fd(ag->a) }, ret;
	union kva__msg m;

	kva__msg_init(&m, KVA__MSG_WELCOME);
	m.welcome.slot = slot;
	m.welcome.generation = gen;
	m.welcome.agent_pid = getpid();
	m.welcome.flags = ro ? KVA__WELCOME_READONLY : 0;
	m.welcome.meta_bytes = info->meta_bytes;
	m.welcome.data_bytes = info->layout.data_bytes;
	kva__msg_str(m.welcome.arena, sizeof(m.welcome.arena), info->name);
	if (ro) {
		fds[0] = reopen_ro(fds[0]);
		fds[1] = reopen_ro(fds[1]);
	}
	ret = fds[0] < 0 || fds[1] < 0 ? -errno : kva__sock_send(cl->fd, &m, fds, 2);
	if (ro) {
		if (fds[0] >= 0)
			close(fds[0]);
		if (fds[1] >= 0)
			close(fds[1]);
	}
	if (ret < 0) {
		log_warn("WELCOME to pid %d: %s", (int)cl->pid, strerror(-ret));
		if (slot != KVA__NO_SLOT)
			kva_arena_release_slot(ag->a, slot, gen);
		client_free(ag, cl);
		return 0;
	}
	cl->admitted = true;
	if (ro) {
		log_debug("observer pid %d uid %u given a read-only mapping", (int)cl->pid,
			  (unsigned)cl->uid);
		return 0;
	}
	ag->admitted++;
	log_info("worker \"%s\" pid %d uid %u attached to slot %u", cl->name, (int)cl->pid,
		 (unsigned)cl->uid, slot);
	return 0;
}

static int on_hello(struct agent *ag, struct client *cl, const char *buf, int n, int nfds)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	union kva__msg m;
	int version = kva__msg_version(buf, (size_t)n), ret;

	if (getsockopt(cl->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_warn("SO_PEERCRED: %s", strerror(errno));
		client_free(ag, cl);
		return 0;
	}
	cl->pid = cred.pid;
	cl->uid = cred.uid;
	cl->gid = cred.gid;
	snprintf(cl->name, sizeof(cl->name), "?");
	if (version >= 0 && version != KVA__PROTO_VERSION)
		return refuse(ag, cl, KVA__REFUSE_VERSION, "the agent speaks protocol %u, not %d",
			      KVA__PROTO_VERSION, version);
	if ((ret = kva__msg_decode(buf, (size_t)n, nfds, &m)) < 0)
		return refuse(ag, cl, KVA__REFUSE_PROTOCOL, "%s", kva_errmsg());
	if (m.h.type != KVA__MSG_HELLO)
		return refuse(ag, cl, KVA__REFUSE_PROTOCOL, "expected HELLO, got %s",
			      kva__msg_type_name(m.h.type));
	memcpy(cl->name, m.hello.name, sizeof(cl->name));
	cl->observer = m.hello.flags & KVA__HELLO_OBSERVER;
	if (m.hello.pid != cred.pid)
		return refuse(ag, cl, KVA__REFUSE_PID_MISMATCH, "HELLO says pid %d, the socket "
			      "says %d", m.hello.pid, (int)cred.pid);
	if (!allowed(ag->cfg, cl->fd, cred.uid, cred.gid))
		return refuse(ag, cl, KVA__REFUSE_NOT_ALLOWED, "uid %u gid %u is not in the "
			      "agent's allow policy", (unsigned)cred.uid, (unsigned)cred.gid);
	if (ag->stopping)
		return refuse(ag, cl, KVA__REFUSE_STOPPING, "the agent is shutting down");
	if (cl->observer)
		return welcome(ag, cl, KVA__NO_SLOT, 0, true);

	/* watch the process before it can hold anything */
	cl->pidfd = pidfd_open(cred.pid, 0);
	if (cl->pidfd < 0) {
		log_warn("pidfd of pid %d: %s", (int)cred.pid, strerror(errno));
		client_free(ag, cl);
		return 0;
	}
	if ((ret = kva_arena_reserve_slot(ag->a, cred.pid, &cl->slot, &cl->gen)) < 0)
		return refuse(ag, cl, ret == -EUSERS ? KVA__REFUSE_FULL : KVA__REFUSE_INTERNAL,
			      "%s", kva_errmsg());
	if (watch(ag, cl->pidfd, &cl->wpid) < 0) {
		kva_arena_release_slot(ag->a, cl->slot, cl->gen);
		return refuse(ag, cl, KVA__REFUSE_INTERNAL, "epoll: %s", strerror(errno));
	}
	return welcome(ag, cl, cl->slot, cl->gen, false);
}

/* ----------------------------------------------------- a worker's end */

/* reclaim_slot - everything the dead worker of @cl's slot held comes back. */
static bool reclaim_slot(struct agent *ag, struct client *cl)
{
	struct kva_reclaim_report r;
	enum kva_slot_state state;
	uint32_t gen;
	int32_t pid;
	int ret;

	kva_arena_slot(ag->a, cl->slot, &state, &gen, &pid);
	if (gen != cl->gen || (state != KVA_SLOT_JOINING && state != KVA_SLOT_LIVE &&
			       state != KVA_SLOT_RECLAIMING))
		return true; /* it left before it died: nothing of it is in the arena */
	ret = kva_arena_reclaim(ag->a, cl->slot, &r);
	if (ret == -ENOENT)
		return true;
	if (ret == -EBUSY) {
		/* Another reclaimer (workers may reclaim) holds the slot's lease.
		 * Once it moved the slot on, the slot is its to finish (and if it
		 * dies, the periodic check takes its lease over); until then,
		 * look again at the next tick. */
		kva_arena_slot(ag->a, cl->slot, &state, &gen, NULL);
		log_debug("slot %u (pid %d): %s", cl->slot, (int)cl->pid, kva_errmsg());
		return gen != cl->gen || state == KVA_SLOT_FREE;
	}
	if (ret < 0) {
		log_warn("reclaim of slot %u (pid %d): %s; will retry", cl->slot, (int)cl->pid,
			 kva_errmsg());
		return false;
	}
	ag->reclaimed++;
	log_info("worker \"%s\" pid %d died holding slot %u: reclaimed %u blocks (its cache "
		 "included) and its hold on %u shared blocks (%u freed) in %.3f ms", cl->name,
		 (int)cl->pid, cl->slot, r.owned_freed, r.shared_dropped, r.shared_freed,
		 (double)r.elapsed_ns / 1e6);
	if (r.hints_repaired)
		log_info("  %u free blocks made findable again", r.hints_repaired);
	return true;
}

static void on_pidfd(struct agent *ag, struct client *cl)
{
	if (reclaim_slot(ag, cl)) {
		client_free(ag, cl);
		return;
	}
	/* The timer tries again. The pidfd stays readable for good: left in
	 * epoll (level-triggered) it would wake us at once, again and again. */
	if (!cl->reclaim_pending) {
		epoll_ctl(ag->ep, EPOLL_CTL_DEL, cl->pidfd, NULL);
		cl->reclaim_pending = true;
	}
}

/* The connection ended (EOF, BYE, or an error): what did the worker leave? */
static int conn_ended(struct agent *ag, struct client *cl, const char *why)
{
	enum kva_slot_state state;
	uint32_t gen;

	unwatch(ag, &cl->fd);
	if (!cl->admitted || cl->observer) {
		if (why)
			log_warn("connection of pid %d closed: %s", (int)cl->pid, why);
		client_free(ag, cl);
		return 0;
	}
	kva_arena_slot(ag->a, cl->slot, &state, &gen, NULL);
	if (gen == cl->gen && state == KVA_SLOT_JOINING &&
	    kva_arena_release_slot(ag->a, cl->slot, cl->gen) == 0) {
		log_info("worker \"%s\" pid %d never adopted slot %u: taken back", cl->name,
			 (int)cl->pid, cl->slot);
		client_free(ag, cl);
	} else if (gen != cl->gen || state == KVA_SLOT_FREE) {
		log_info("worker \"%s\" pid %d left slot %u", cl->name, (int)cl->pid, cl->slot);
		client_free(ag, cl);
	} else {
		/* still holding: it will be reclaimed when its process ends */
		log_debug("worker \"%s\" pid %d closed its connection%s%s without leaving "
			  "slot %u", cl->name, (int)cl->pid, why ? ": " : "", why ? why : "",
			  cl->slot);
	}
	return 0;
}

static int on_conn(struct agent *ag, struct client *cl)
{
	char buf[sizeof(union kva__msg)];
	union kva__msg m;
	int fds[KVA__MAX_FDS], nfds = 0;
	int n = kva__sock_recv(cl->fd, buf, sizeof(buf), fds, &nfds, 0);

	if (n == -ETIMEDOUT)
		return 0;
	if (n < 0)
		return conn_ended(ag, cl, n == -ECONNRESET ? NULL : kva_errmsg());
	if (nfds) { /* nobody sends the agent fds */
		while (nfds)
			close(fds[--nfds]);
		log_warn("pid %d sent file descriptors: protocol error", (int)cl->pid);
		return conn_ended(ag, cl, "protocol: unexpected file descriptors");
	}
	if (!cl->admitted)
		return on_hello(ag, cl, buf, n, 0);
	if (kva__msg_decode(buf, (size_t)n, 0, &m) < 0) {
		log_warn("pid %d: %s", (int)cl->pid, kva_errmsg());
		return conn_ended(ag, cl, kva_errmsg());
	}
	if (m.h.type == KVA__MSG_BYE)
		return conn_ended(ag, cl, NULL);
	log_warn("pid %d sent %s after HELLO: protocol error", (int)cl->pid,
		 kva__msg_type_name(m.h.type));
	return conn_ended(ag, cl, "protocol: unexpected message");
}

/* ------------------------------------------------------------ the clock */

static bool tracked(const struct agent *ag, uint32_t slot)
{
	for (unsigned k = 0; k < MAX_CLIENTS; k++) {
		const struct client *cl = ag->clients[k];

		if (cl && cl->admitted && !cl->observer && cl->slot == slot)
			return true;
	}
	return false;
}

static void check_arena(struct agent *ag)
{
	struct kva_check_report r;

	/* Slots held by no client of ours (a worker that joined on its own, a
	 * pidfd lost): reclaim refuses any whose process is alive. */
	for (uint32_t s = 0; s < kva_arena_info(ag->a)->max_workers; s++) {
		enum kva_slot_state state;
		struct kva_reclaim_report rr;

		kva_arena_slot(ag->a, s, &state, NULL, NULL);
		if ((state == KVA_SLOT_JOINING || state == KVA_SLOT_LIVE ||
		     state == KVA_SLOT_RECLAIMING) && !tracked(ag, s) &&
		    kva_arena_reclaim(ag->a, s, &rr) == 0) {
			ag->reclaimed++;
			log_info("slot %u (pid %d, \"%s\"), dead and unknown to the agent: "
				 "reclaimed %u blocks, its hold on %u shared blocks", s, rr.pid,
				 rr.name, rr.owned_freed, rr.shared_dropped);
		}
	}
	if (kva_arena_check(ag->a, &r) == 0)
		return;
	/* a free block whose hint bit a free has not set yet is normal while
	 * workers run, and so is a publication caught between its steps; the
	 * rest are not */
	if (r.bad_descriptors || r.stale_owners || r.dead_holders)
		log_warn("arena check: %u corrupt descriptors, %u stale owners, %u dead holders "
			 "(first: %s): skipped, not followed", r.bad_descriptors, r.stale_owners,
			 r.dead_holders, r.first_problem);
	else
		log_debug("arena check: %u free blocks not yet findable, %u index entries and "
			  "published count %s while workers run (first: %s)", r.hints_missing,
			  r.index_bad, r.published_bad ? "off" : "right", r.first_problem);
}

static void on_timer(struct agent *ag)
{
	uint64_t ticks, now = now_ns();

	if (read(ag->tfd, &ticks, sizeof(ticks)) < 0)
		return;
	for (unsigned k = 0; k < MAX_CLIENTS; k++) { /* reclaims that failed before */
		struct client *cl = ag->clients[k];

		if (cl && cl->reclaim_pending)
			on_pidfd(ag, cl);
	}
	if (ag->cfg->check_interval_ms &&
	    now - ag->last_check_ns >= (uint64_t)ag->cfg->check_interval_ms * 1000000ull) {
		ag->last_check_ns = now;
		check_arena(ag);
	}
}

/* ------------------------------------------------------------ stopping */

static void begin_shutdown(struct agent *ag, int sig)
{
	union kva__msg m;
	unsigned n = 0;

	ag->stopping = true;
	ag->deadline_ns = now_ns() + (uint64_t)ag->cfg->shutdown_grace_ms * 1000000ull;
	sd_notify(0, "STOPPING=1");
	kva_arena_set_agent(ag->a, KVA_AGENT_STOPPING);
	unwatch(ag, &ag->lfd);
	unlink(ag->cfg->socket);
	kva__msg_init(&m, KVA__MSG_SHUTDOWN);
	m.shutdown.grace_ms = ag->cfg->shutdown_grace_ms;
	for (unsigned k = 0; k < MAX_CLIENTS; k++) {
		struct client *cl = ag->clients[k];

		if (cl && cl->admitted && !cl->observer && cl->fd >= 0) {
			kva__sock_send(cl->fd, &m, NULL, 0);
			n++;
		}
	}
	if (workers(ag))
		log_info("%s: admitting no one, told %u workers to leave, waiting up to %.1f s",
			 strsignal(sig), n, ag->cfg->shutdown_grace_ms / 1000.0);
	else
		log_info("%s: no workers attached, exiting", strsignal(sig));
}

static void on_signal(struct agent *ag)
{
	struct signalfd_siginfo si;

	if (read(ag->sfd, &si, sizeof(si)) != sizeof(si))
		return;
	if (ag->stopping) {
		log_warn("%s again: exiting now", strsignal((int)si.ssi_signo));
		ag->deadline_ns = 0;
		return;
	}
	begin_shutdown(ag, (int)si.ssi_signo);
}

/* ------------------------------------------------------------ the loop */

int agent_serve(const struct agent_config *c, struct kva_arena *a)
{
	struct agent ag = { .cfg = c, .a = a, .ep = -1, .lfd = -1, .sfd = -1, .tfd = -1 };
	struct itimerspec tick = { { 0, TICK_MS * 1000000L }, { 0, TICK_MS * 1000000L } };
	sigset_t mask;
	int ret;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	ag.ep = epoll_create1(EPOLL_CLOEXEC);
	ag.sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	ag.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (ag.ep < 0 || ag.sfd < 0 || ag.tfd < 0 || timerfd_settime(ag.tfd, 0, &tick, NULL) < 0) {
		ret = -errno;
		log_err("setting up the event loop: %s", strerror(errno));
		goto out;
	}
	if ((ret = listen_socket(c, &ag.lfd)) < 0)
		goto out;
	ag.wlisten = (struct watch){ W_LISTEN, NULL };
	ag.wsignal = (struct watch){ W_SIGNAL, NULL };
	ag.wtimer = (struct watch){ W_TIMER, NULL };
	if ((ret = watch(&ag, ag.lfd, &ag.wlisten)) < 0 || (ret = watch(&ag, ag.sfd, &ag.wsignal)) < 0 ||
	    (ret = watch(&ag, ag.tfd, &ag.wtimer)) < 0) {
		log_err("epoll: %s", strerror(-ret));
		goto out;
	}
	kva_arena_set_agent(a, KVA_AGENT_RUNNING);
	{
		char ids[256] = "";
		size_t off = 0;

		for (unsigned k = 0; k < c->n_allow_uid && off < sizeof(ids); k++)
			off += (size_t)snprintf(ids + off, sizeof(ids) - off, " uid %u",
						(unsigned)c->allow_uid[k]);
		for (unsigned k = 0; k < c->n_allow_gid && off < sizeof(ids); k++)
			off += (size_t)snprintf(ids + off, sizeof(ids) - off, " gid %u",
						(unsigned)c->allow_gid[k]);
		log_info("listening on %s (mode %04o), allowing%s", c->socket,
			 (unsigned)c->socket_mode, ids);
	}
	sd_notifyf(0, "READY=1\nSTATUS=serving arena \"%s\" on %s", c->name, c->socket);

	while (!ag.stopping || (workers(&ag) && now_ns() < ag.deadline_ns)) {
		struct epoll_event ev[32];
		int n = epoll_wait(ag.ep, ev, 32, TICK_MS);

		if (n < 0 && errno != EINTR) {
			ret = -errno;
			log_err("epoll_wait: %s", strerror(errno));
			goto out;
		}
		for (int k = 0; k < n; k++) {
			struct watch *w = ev[k].data.ptr;
			enum watch_kind kind = w->kind;

			switch (kind) {
			case W_LISTEN:
				if (ag.lfd >= 0)
					on_listen(&ag);
				break;
			case W_SIGNAL:
				on_signal(&ag);
				break;
			case W_TIMER:
				on_timer(&ag);
				break;
			case W_CONN:
				on_conn(&ag, w->c);
				break;
			case W_PIDFD:
				on_pidfd(&ag, w->c);
				break;
			}
			/* A client event or the timer may have freed a client (and
			 * @w with it): the rest of this batch may point into it.
			 * Start over with a fresh batch; epoll is level-triggered,
			 * so nothing pending is lost. */
			if (kind == W_CONN || kind == W_PIDFD || kind == W_TIMER)
				break;
		}
	}
	if (workers(&ag))
		log_warn("%u workers still attached after the grace period; their mappings "
			 "keep working, new allocations fail with -ESHUTDOWN", workers(&ag));
	log_info("stopped: %llu workers admitted, %llu refused, %llu reclaimed",
		 (unsigned long long)ag.admitted, (unsigned long long)ag.refused,
		 (unsigned long long)ag.reclaimed);
	ret = 0;
out:
	for (unsigned k = 0; k < MAX_CLIENTS; k++)
		if (ag.clients[k])
			client_free(&ag, ag.clients[k]);
	if (ag.lfd >= 0) {
		close(ag.lfd);
		unlink(c->socket);
	}
	if (ag.ep >= 0)
		close(ag.ep);
	if (ag.sfd >= 0)
		close(ag.sfd);
	if (ag.tfd >= 0)
		close(ag.tfd);
	return ret;
}
