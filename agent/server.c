/* SPDX-License-Identifier: MIT */
/*
 * server.c - the agent's one thread: an epoll loop over the listening socket,
 * every connection, a pidfd per watched worker, a signalfd and a timerfd.
 *
 * A connection's life, as the agent sees it:
 *   accepted       its credentials read at once (SO_PEERCRED): it is
 *                  counted against the connections that may wait for their
 *                  HELLO, in all and per uid, and must say HELLO within
 *                  --hello-timeout; a flood of silent connections closes the
 *                  oldest of them, never anyone else's
 *   HELLO          checked (pid, name, allow policy, per-process and per-user
 *                  slot limits); an observer gets read-only fds and is closed;
 *                  a worker gets a slot from the agent's own table (slots.c)
 *                  and the region fds; its process is watched with a pidfd
 *   BYE or EOF     it left, or its process ended: slots.c decides from the
 *                  table, and checks the shared slot word
 * Every refusal is a REFUSE with the reason the peer reads in kva_errmsg(),
 * and one log line (a burst of them: one line a second with a count).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "agent_pvt.h"
#include "arena_pvt.h"
#include "devmem_pvt.h"
#include "proto_pvt.h"

#define TICK_MS 100
#define LISTEN_BACKOFF_MAX_MS 1000

const char *const agent_refusal_name[AR_N] = {
	[AR_NOT_ALLOWED] = "not_allowed", [AR_FULL] = "full", [AR_SLOT_LIMIT] = "slot_limit",
	[AR_PENDING_LIMIT] = "pending_limit", [AR_HELLO_TIMEOUT] = "hello_timeout",
	[AR_PROTOCOL] = "protocol", [AR_VERSION] = "version", [AR_PID_MISMATCH] = "pid_mismatch",
	[AR_STOPPING] = "stopping", [AR_OUT_OF_FDS] = "out_of_fds", [AR_INTERNAL] = "internal",
};

uint64_t agent_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int agent_watch(struct agent *ag, int fd, struct watch *w)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = w };

	return epoll_ctl(ag->ep, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

void agent_unwatch(struct agent *ag, int *fd)
{
	if (*fd < 0)
		return;
	epoll_ctl(ag->ep, EPOLL_CTL_DEL, *fd, NULL);
	close(*fd);
	*fd = -1;
	ag->watch_gen++;
}

static void client_free(struct agent *ag, struct client *cl)
{
	slots_conn_ended(ag, cl);
	agent_unwatch(ag, &cl->fd);
	ag->watch_gen++;
	for (unsigned k = 0; k < ag->max_clients; k++)
		if (ag->clients[k] == cl)
			ag->clients[k] = NULL;
	free(cl);
}

/* connections waiting for their HELLO (the metrics) */
unsigned agent_conns_waiting(const struct agent *ag)
{
	unsigned n = 0;

	for (unsigned k = 0; k < ag->max_clients; k++)
		n += ag->clients[k] && !ag->clients[k]->hello;
	return n;
}

#define YOUNG_NS 100000000ull /* a connection this young is a client still sending its HELLO */

/*
 * Connections still waiting for their HELLO: all of them, and those of @uid;
 * in *@oldest and *@oldest_uid, the oldest of each that has been silent for
 * longer than a client takes to send a HELLO (NULL if none).
 */
static unsigned pending(const struct agent *ag, uid_t uid, unsigned *of_uid, struct client **oldest,
			struct client **oldest_uid)
{
	uint64_t now = agent_now_ns();
	unsigned n = 0;

	*of_uid = 0;
	*oldest = *oldest_uid = NULL;
	for (unsigned k = 0; k < ag->max_clients; k++) {
		struct client *cl = ag->clients[k];

		if (!cl || cl->hello)
			continue;
		n++;
		*of_uid += cl->uid == uid;
		if (now - cl->since_ns < YOUNG_NS)
			continue;
		if (!*oldest || cl->since_ns < (*oldest)->since_ns)
			*oldest = cl;
		if (cl->uid == uid && (!*oldest_uid || cl->since_ns < (*oldest_uid)->since_ns))
			*oldest_uid = cl;
	}
	return n;
}

/* ------------------------------------------------------------ refusing */

static void send_refuse(int fd, enum kva__refusal why, const char *text)
{
	union kva__msg m;

	kva__msg_init(&m, KVA__MSG_REFUSE);
	m.refuse.reason = why;
	kva__msg_str(m.refuse.text, sizeof(m.refuse.text), text);
	kva__sock_send(fd, &m, NULL, 0); /* best effort: it may be gone */
}

/* a refusal counted, in all and by @reason (the metrics) */
static void refused(struct agent *ag, enum agent_refusal reason)
{
	ag->refused++;
	ag->refused_by[reason]++;
}

static int refuse(struct agent *ag, struct client *cl, enum kva__refusal why,
		  enum agent_refusal reason, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static int refuse(struct agent *ag, struct client *cl, enum kva__refusal why,
		  enum agent_refusal reason, const char *fmt, ...)
{
	char text[KVA__TEXT_LEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	/* the log line first: it exists by the time the peer reads why */
	log_warn("refused pid %d uid %u gid %u (\"%s\"): %s: %s", (int)cl->pid, (unsigned)cl->uid,
		 (unsigned)cl->gid, cl->name, kva__refusal_name(why), text);
	send_refuse(cl->fd, why, text);
	refused(ag, reason);
	client_free(ag, cl);
	return 0;
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
	    listen(fd, 128) < 0) {
		ret = -errno;
		log_err("listening on %s: %s", c->socket, strerror(-ret));
		close(fd);
		return ret;
	}
	*out = fd;
	return 0;
}

/*
 * Out of file descriptors: accept() fails on every wakeup while the backlog
 * waits, which would be a busy loop. The spare descriptor (kept open for
 * this) is given up to accept one connection and tell it why it is refused,
 * then the listener is left unwatched for a while, longer each time it
 * happens again.
 */
static void out_of_fds(struct agent *ag, int err)
{
	uint64_t now = agent_now_ns();

	if (ag->spare_fd >= 0) {
		int fd;

		close(ag->spare_fd);
		ag->spare_fd = -1;
		fd = accept4(ag->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd >= 0) {
			send_refuse(fd, KVA__REFUSE_INTERNAL,
				    "the agent is out of file descriptors: try again later");
			close(fd);
			refused(ag, AR_OUT_OF_FDS);
		}
		ag->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	ag->listen_backoff_ms = ag->listen_backoff_ms ? ag->listen_backoff_ms * 2 : 100;
	if (ag->listen_backoff_ms > LISTEN_BACKOFF_MAX_MS)
		ag->listen_backoff_ms = LISTEN_BACKOFF_MAX_MS;
	epoll_ctl(ag->ep, EPOLL_CTL_DEL, ag->lfd, NULL);
	ag->listen_paused = true;
	ag->listen_resume_ns = now + ag->listen_backoff_ms * 1000000ull;
	log_warn("accept: %s: connections refused, listening again in %llu ms (raise the "
		 "descriptor limit: ulimit -n, LimitNOFILE=)", strerror(err),
		 (unsigned long long)ag->listen_backoff_ms);
}

static int on_conn(struct agent *ag, struct client *cl);

/*
 * Each connection is counted against --max-pending until its HELLO, and
 * against --max-pending-per-uid for its user. At either limit, the oldest
 * connection that has stayed silent (beyond the 100 ms a client needs) is
 * closed to make room: a flood of silent connections costs only its own
 * sender's. A burst of real clients (all young) is let in up to the table.
 */
/* connections taken per turn: a flood of connects must not keep the loop
 * here while admitted workers' messages and the tick wait */
#define ACCEPT_BATCH 16

static void on_listen(struct agent *ag)
{
	for (unsigned turn = 0; turn < ACCEPT_BATCH; turn++) {
		int fd = accept4(ag->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		struct ucred cred;
		socklen_t len = sizeof(cred);
		struct client *cl, *oldest, *oldest_uid;
		unsigned k, of_uid, n;

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				out_of_fds(ag, errno);
			else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("accept: %s", strerror(errno));
			return;
		}
		ag->listen_backoff_ms = 0;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
			log_warn("SO_PEERCRED: %s", strerror(errno));
			close(fd);
			continue;
		}
		n = pending(ag, cred.uid, &of_uid, &oldest, &oldest_uid);
		if (of_uid >= ag->cfg->max_pending_uid && oldest_uid)
			refuse(ag, oldest_uid, KVA__REFUSE_LIMIT, AR_PENDING_LIMIT, "no HELLO, and "
			       "%u connections of uid %u wait (--max-pending-per-uid): the oldest "
			       "goes", of_uid, (unsigned)cred.uid);
		else if (n >= ag->cfg->max_pending && oldest)
			refuse(ag, oldest, KVA__REFUSE_LIMIT, AR_PENDING_LIMIT, "no HELLO, and %u "
			       "connections wait (--max-pending): the oldest goes", n);
		for (k = 0; k < ag->max_clients && ag->clients[k]; k++)
			;
		cl = k < ag->max_clients ? calloc(1, sizeof(*cl)) : NULL;
		if (!cl) {
			log_warn("refused pid %d uid %u: %u connections wait for their HELLO, none "
				 "silent long enough to close", (int)cred.pid, (unsigned)cred.uid, n);
			send_refuse(fd, KVA__REFUSE_LIMIT, "the agent has no room for a connection: "
				    "try again");
			close(fd);
			refused(ag, AR_PENDING_LIMIT);
			continue;
		}
		*cl = (struct client){ .fd = fd, .pid = cred.pid, .uid = cred.uid, .gid = cred.gid,
				       .since_ns = agent_now_ns(), .slot = UINT32_MAX };
		snprintf(cl->name, sizeof(cl->name), "?");
		cl->w = (struct watch){ W_CONN, cl, NULL };
		ag->clients[k] = cl;
		if (agent_watch(ag, fd, &cl->w) < 0) {
			client_free(ag, cl);
			continue;
		}
		on_conn(ag, cl); /* a HELLO sent with the connect is read now */
	}
}

/* ------------------------------------------------------------ admission */

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

/*
 * A GPU arena's memory, to a worker just welcomed: the chunks' fds in
 * messages of at most SCM_MAX_FD each, in order (the fds stay the agent's:
 * each send passes new references), or the legacy IPC handle. The socket
 * is non-blocking: a peer that leaves them unread until its buffer is full
 * gets an error here, not a wait.
 */
static int send_devmem(struct agent *ag, int fd)
{
	const struct kva_arena_info *info = kva_arena_info(ag->a);
	union kva__msg m;
	int ret;

	if (info->ipc == KVA_IPC_LEGACY) {
		kva__msg_init(&m, KVA__MSG_DEVMEM);
		m.devmem.count = 1;
		m.devmem.flags = KVA__DEVMEM_LEGACY;
		memcpy(m.devmem.ipc_handle, kva__dev_ipc_handle(ag->a->dev),
		       sizeof(m.devmem.ipc_handle));
		return kva__sock_send(fd, &m, NULL, 0);
	}
	for (uint32_t first = 0; first < info->chunks; first += KVA__SCM_MAX_FD) {
		uint32_t n = info->chunks - first < KVA__SCM_MAX_FD ? info->chunks - first
								     : KVA__SCM_MAX_FD;

		kva__msg_init(&m, KVA__MSG_DEVMEM);
		m.devmem.first = first;
		m.devmem.count = n;
		if ((ret = kva__sock_send(fd, &m, kva__dev_fds(ag->a->dev) + first, (int)n)) < 0)
			return ret;
	}
	return 0;
}

static int welcome(struct agent *ag, struct client *cl, bool ro)
{
	const struct kva_arena_info *info = kva_arena_info(ag->a);
	bool device = info->backend == KVA_BACKEND_CUDA;
	int fds[4], opened[4], nfds = 0, nopened = 0, ret = 0;
	struct slot_entry *e = ro ? NULL : &ag->slots[cl->slot];
	union kva__msg m;

	kva__msg_init(&m, KVA__MSG_WELCOME);
	m.welcome.slot = ro ? KVA__NO_SLOT : cl->slot;
	m.welcome.generation = ro ? 0 : e->gen;
	m.welcome.agent_pid = getpid();
	m.welcome.flags = (ro ? KVA__WELCOME_READONLY : 0) | (device ? KVA__WELCOME_DEVICE : 0);
	m.welcome.meta_bytes = info->meta_bytes;
	m.welcome.data_bytes = info->data_map_bytes;
	kva__msg_str(m.welcome.arena, sizeof(m.welcome.arena), info->name);
	/* the regions (a GPU arena's data comes after, as chunks); an observer
	 * gets read-only duplicates: new open file descriptions */
	for (int k = 0; k < (device ? 1 : 2); k++) {
		int f = k ? kva_arena_data_fd(ag->a) : kva_arena_meta_fd(ag->a);

		if (ro && (f = opened[nopened++] = reopen_ro(f)) < 0)
			ret = -errno;
		fds[nfds++] = f;
	}
	if (!ro && ret == 0 && tiers_doorbell(ag->tiers) >= 0) {
		fds[nfds++] = tiers_doorbell(ag->tiers);
		m.welcome.flags |= KVA__WELCOME_DOORBELL;
		/* the host tier to copy from, read-only; not to a GPU arena's
		 * workers, whose fetches the agent copies up (tiers/) */
		if (!device && tiers_host_fd(ag->tiers) >= 0 &&
		    (opened[nopened] = reopen_ro(tiers_host_fd(ag->tiers))) >= 0) {
			fds[nfds++] = opened[nopened++];
			m.welcome.flags |= KVA__WELCOME_HOSTTIER;
		}
	}
	if (ret == 0)
		ret = kva__sock_send(cl->fd, &m, fds, nfds);
	if (ret == 0 && !ro && device)
		ret = send_devmem(ag, cl->fd);
	while (nopened)
		if (opened[--nopened] >= 0)
			close(opened[nopened]);
	if (ret < 0) {
		log_warn("WELCOME to pid %d: %s", (int)cl->pid, strerror(-ret));
		if (!ro) /* no worker came of it: the reservation goes back */
			cl->admitted = true;
		client_free(ag, cl);
		return 0;
	}
	if (ro) {
		/* an observer needs nothing more: its mapping is all it has */
		log_debug("observer pid %d uid %u given a read-only mapping", (int)cl->pid,
			  (unsigned)cl->uid);
		client_free(ag, cl);
		return 0;
	}
	cl->admitted = true;
	ag->admitted++;
	log_info("worker \"%s\" pid %d uid %u attached to slot %u", cl->name, (int)cl->pid,
		 (unsigned)cl->uid, cl->slot);
	return 0;
}

/* messages already sent on admitted connections other than @cl (of its uid
 * if @same_uid): a few each, a BYE among them ends its connection */
static void read_pending(struct agent *ag, struct client *cl, bool same_uid)
{
	for (unsigned k = 0; k < ag->max_clients; k++)
		for (int m = 0; m < 4; m++) {
			struct client *o = ag->clients[k];
			char b;

			if (!o || o == cl || !o->admitted || o->fd < 0 ||
			    (same_uid && o->uid != cl->uid) ||
			    recv(o->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0)
				break;
			on_conn(ag, o); /* may free it: read again from the table */
		}
}

static int on_hello(struct agent *ag, struct client *cl, const char *buf, int n)
{
	union kva__msg m;
	char why[KVA__TEXT_LEN];
	int version = kva__msg_version(buf, (size_t)n), ret;
	bool observer;

	if (version >= 0 && version != KVA__PROTO_VERSION)
		return refuse(ag, cl, KVA__REFUSE_VERSION, AR_VERSION, "the agent speaks protocol "
			      "%u, not %d", KVA__PROTO_VERSION, version);
	if ((ret = kva__msg_decode(buf, (size_t)n, 0, &m)) < 0)
		return refuse(ag, cl, KVA__REFUSE_PROTOCOL, AR_PROTOCOL, "%s", kva_errmsg());
	if (m.h.type != KVA__MSG_HELLO)
		return refuse(ag, cl, KVA__REFUSE_PROTOCOL, AR_PROTOCOL, "expected HELLO, got %s",
			      kva__msg_type_name(m.h.type));
	if (!agent_name_ok(m.hello.name, sizeof(m.hello.name) - 1))
		return refuse(ag, cl, KVA__REFUSE_PROTOCOL, AR_PROTOCOL, "the worker's name must be "
			      "printable UTF-8 of at most %zu bytes", sizeof(m.hello.name) - 1);
	memcpy(cl->name, m.hello.name, sizeof(cl->name));
	observer = m.hello.flags & KVA__HELLO_OBSERVER;
	if (m.hello.pid != cl->pid)
		return refuse(ag, cl, KVA__REFUSE_PID_MISMATCH, AR_PID_MISMATCH, "HELLO says pid %d, "
			      "the socket says %d", m.hello.pid, (int)cl->pid);
	if (!allowed(ag->cfg, cl->fd, cl->uid, cl->gid))
		return refuse(ag, cl, KVA__REFUSE_NOT_ALLOWED, AR_NOT_ALLOWED, "uid %u gid %u is not "
			      "in the agent's allow policy", (unsigned)cl->uid, (unsigned)cl->gid);
	if (ag->stopping)
		return refuse(ag, cl, KVA__REFUSE_STOPPING, AR_STOPPING,
			      "the agent is shutting down");
	if (observer)
		return welcome(ag, cl, true);
	if ((ret = slots_admit(ag, cl, why, sizeof(why))) == -EDQUOT || ret == -EUSERS) {
		/* a limit counts lives still there: read what the other
		 * connections (of this uid, or all when the arena is full) have
		 * sent first. A worker that detaches and attaches again at once
		 * has its BYE queued behind this HELLO. */
		read_pending(ag, cl, ret == -EDQUOT);
		ret = slots_admit(ag, cl, why, sizeof(why));
	}
	if (ret < 0)
		return refuse(ag, cl, ret == -EUSERS   ? KVA__REFUSE_FULL
				      : ret == -EDQUOT ? KVA__REFUSE_LIMIT
						       : KVA__REFUSE_INTERNAL,
			      ret == -EUSERS ? AR_FULL : ret == -EDQUOT ? AR_SLOT_LIMIT : AR_INTERNAL,
			      "%s", why);
	return welcome(ag, cl, false);
}

/* The connection ended (EOF, BYE, or an error). */
static int conn_ended(struct agent *ag, struct client *cl, const char *why)
{
	if (!cl->hello && why)
		log_warn("connection of pid %d closed: %s", (int)cl->pid, why);
	else if (why)
		log_debug("worker \"%s\" pid %d: %s", cl->name, (int)cl->pid, why);
	client_free(ag, cl);
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
	if (n == -EPROTO && !cl->hello) /* too long, or with too many fds */
		return refuse(ag, cl, KVA__REFUSE_PROTOCOL, AR_PROTOCOL, "%s", kva_errmsg());
	if (n < 0)
		return conn_ended(ag, cl, n == -ECONNRESET ? NULL : kva_errmsg());
	if (nfds) { /* nobody sends the agent fds */
		while (nfds)
			close(fds[--nfds]);
		if (!cl->hello)
			return refuse(ag, cl, KVA__REFUSE_PROTOCOL, AR_PROTOCOL, "file descriptors sent "
				      "with a HELLO");
		log_warn("pid %d sent file descriptors: protocol error", (int)cl->pid);
		return conn_ended(ag, cl, "protocol: unexpected file descriptors");
	}
	if (!cl->hello) {
		cl->hello = true;
		return on_hello(ag, cl, buf, n);
	}
	if (kva__msg_decode(buf, (size_t)n, 0, &m) < 0) {
		log_warn("pid %d: %s", (int)cl->pid, kva_errmsg());
		return conn_ended(ag, cl, kva_errmsg());
	}
	if (m.h.type == KVA__MSG_BYE) {
		cl->bye = true;
		return conn_ended(ag, cl, NULL);
	}
	if (m.h.type == KVA__MSG_ADOPTED) {
		slots_adopted(ag, cl);
		return 0;
	}
	log_warn("pid %d sent %s after HELLO: protocol error", (int)cl->pid,
		 kva__msg_type_name(m.h.type));
	return conn_ended(ag, cl, "protocol: unexpected message");
}

/* ------------------------------------------------------------ the clock */

/*
 * The timerfd is read whenever it fires, due or not: epoll is level-triggered,
 * and a timer left unread between its expiry and the tick's clock (they
 * drift apart by the time a turn takes) made every epoll_wait return at once,
 * a busy loop of a few milliseconds in every hundred.
 */
static void on_timer(struct agent *ag)
{
	uint64_t ticks;

	if (read(ag->tfd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN)
		log_debug("timerfd: %s", strerror(errno));
}

/*
 * The tick runs by the clock, not by the timer's turn in epoll: a batch
 * is cut short whenever an event frees a watch, and a flood of connections
 * that each end at once would otherwise keep the timer at the back of every
 * batch, and the repairs, reclaims and checks waiting, for as long as it
 * lasts. The timerfd only wakes an idle loop.
 */
static void tick_if_due(struct agent *ag)
{
	uint64_t now = agent_now_ns();
	uint64_t deadline = (uint64_t)ag->cfg->hello_timeout_ms * 1000000ull;

	if (now < ag->next_tick_ns)
		return;
	ag->next_tick_ns = now + TICK_MS * 1000000ull;
	/* connections that did not say HELLO in time */
	for (unsigned k = 0; k < ag->max_clients; k++) {
		struct client *cl = ag->clients[k];

		if (cl && !cl->hello && now - cl->since_ns > deadline)
			refuse(ag, cl, KVA__REFUSE_PROTOCOL, AR_HELLO_TIMEOUT, "no HELLO within "
			       "%.1f s (--hello-timeout)", ag->cfg->hello_timeout_ms / 1000.0);
	}
	if (ag->listen_paused && now >= ag->listen_resume_ns && ag->lfd >= 0) {
		ag->listen_paused = agent_watch(ag, ag->lfd, &ag->wlisten) < 0;
		if (ag->spare_fd < 0)
			ag->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	slots_tick(ag);
	if (ag->a->dev && now >= ag->next_dev_ns) {
		uint64_t f, t;

		/* for ops tools (kvarena-ctl status): once a second is enough */
		ag->next_dev_ns = now + 1000000000ull;
		if (kva__dev_mem_info(ag->a->dev, &f, &t) == 0) {
			kva__view_set_device(ag->a, f, t);
			ag->dev_free = f;
			ag->dev_total = t;
		} else
			agent_log_at(LOG_WARN, "cuMemGetInfo", "the device's memory: %s",
				     kva_errmsg());
	}
	agent_log_flush();
	if (ag->cfg->check_interval_ms &&
	    now - ag->last_check_ns >= (uint64_t)ag->cfg->check_interval_ms * 1000000ull) {
		ag->last_check_ns = now;
		slots_check(ag);
	}
}

/* ------------------------------------------------------------ stopping */

static void begin_shutdown(struct agent *ag, int sig)
{
	union kva__msg m;
	unsigned n = 0;

	ag->stopping = true;
	ag->deadline_ns = agent_now_ns() + (uint64_t)ag->cfg->shutdown_grace_ms * 1000000ull;
	sd_notify(0, "STOPPING=1");
	kva_arena_set_agent(ag->a, KVA_AGENT_STOPPING);
	slots_words_changed(ag);
	if (!ag->listen_paused)
		epoll_ctl(ag->ep, EPOLL_CTL_DEL, ag->lfd, NULL);
	close(ag->lfd);
	ag->lfd = -1;
	unlink(ag->cfg->socket);
	kva__msg_init(&m, KVA__MSG_SHUTDOWN);
	m.shutdown.grace_ms = ag->cfg->shutdown_grace_ms;
	for (unsigned k = 0; k < ag->max_clients; k++) {
		struct client *cl = ag->clients[k];

		if (cl && cl->admitted && cl->fd >= 0) {
			kva__sock_send(cl->fd, &m, NULL, 0);
			n++;
		}
	}
	if (slots_workers(ag))
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

/* the soft descriptor limit up to the hard one: connections are descriptors */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rlim_t was = rl.rlim_cur;

		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
			log_debug("descriptor limit raised from %llu to %llu",
				  (unsigned long long)was, (unsigned long long)rl.rlim_max);
	}
}

int agent_serve(const struct agent_config *c, struct kva_arena *a, struct kva_worker *self,
		struct tiers *tiers)
{
	struct agent ag = { .cfg = c, .a = a, .self = self, .tiers = tiers, .ep = -1, .lfd = -1,
			    .sfd = -1, .tfd = -1, .spare_fd = -1 };
	struct itimerspec tick = { { 0, TICK_MS * 1000000L }, { 0, TICK_MS * 1000000L } };
	sigset_t mask;
	int ret;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	raise_nofile();
	ag.max_clients = c->max_pending + KVA_MAX_WORKERS + 1;
	ag.clients = calloc(ag.max_clients, sizeof(*ag.clients));
	ag.ep = epoll_create1(EPOLL_CLOEXEC);
	ag.sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	ag.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	ag.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (!ag.clients || ag.ep < 0 || ag.sfd < 0 || ag.tfd < 0 ||
	    timerfd_settime(ag.tfd, 0, &tick, NULL) < 0) {
		ret = -errno;
		log_err("setting up the event loop: %s", strerror(errno));
		goto out;
	}
	/* the metrics port first: a port taken is a start-up error before any
	 * worker could have seen this agent */
	if (agent_metrics_on(c) && (ret = metrics_start(&ag)) < 0)
		goto out;
	if ((ret = listen_socket(c, &ag.lfd)) < 0)
		goto out;
	ag.wlisten = (struct watch){ W_LISTEN, NULL, NULL };
	ag.wsignal = (struct watch){ W_SIGNAL, NULL, NULL };
	ag.wtimer = (struct watch){ W_TIMER, NULL, NULL };
	if ((ret = agent_watch(&ag, ag.lfd, &ag.wlisten)) < 0 ||
	    (ret = agent_watch(&ag, ag.sfd, &ag.wsignal)) < 0 ||
	    (ret = agent_watch(&ag, ag.tfd, &ag.wtimer)) < 0) {
		log_err("epoll: %s", strerror(-ret));
		goto out;
	}
	kva_arena_set_agent(a, KVA_AGENT_RUNNING);
	slots_init(&ag);
	if (a->dev) {
		uint64_t f, t;

		if (kva__dev_mem_info(a->dev, &f, &t) == 0) {
			kva__view_set_device(a, f, t);
			ag.dev_free = f;
			ag.dev_total = t;
		}
	}
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
		log_info("limits: %u worker slots per process, %u per user; %u connections may "
			 "wait for their HELLO (%u per user), for %.1f s", c->max_slots_pid,
			 c->max_slots_uid, c->max_pending, c->max_pending_uid,
			 c->hello_timeout_ms / 1000.0);
	}
	sd_notifyf(0, "READY=1\nSTATUS=serving arena \"%s\" on %s", c->name, c->socket);

	while (!ag.stopping || (slots_workers(&ag) && agent_now_ns() < ag.deadline_ns)) {
		struct epoll_event ev[32];
		int n = epoll_wait(ag.ep, ev, 32, metrics_timeout_ms(&ag, TICK_MS));

		if (n < 0 && errno != EINTR) {
			ret = -errno;
			log_err("epoll_wait: %s", strerror(errno));
			goto out;
		}
		/* the batch is read from a rotating start: a batch is cut short
		 * when an event frees a watch, and epoll hands back what stays
		 * ready in the same order, so from index 0 the first watch of a
		 * flood (the listening socket) would be the only one served */
		for (int i = 0, k0 = n > 0 ? (int)(ag.rr++ % (unsigned)n) : 0; i < n; i++) {
			int k = (k0 + i) % n;
			struct watch *w = ev[k].data.ptr;
			enum watch_kind kind = w->kind;
			uint64_t gen = ag.watch_gen;

			switch (kind) {
			case W_LISTEN:
				if (ag.lfd >= 0 && !ag.listen_paused)
					on_listen(&ag);
				break;
			case W_SIGNAL:
				on_signal(&ag);
				break;
			case W_TIMER:
				on_timer(&ag); /* the tick itself: tick_if_due() below */
				break;
			case W_CONN:
				on_conn(&ag, w->c);
				break;
			case W_PIDFD:
				slots_exited(&ag, w->e);
				break;
			case W_METRICS:
				metrics_poll(&ag, true);
				break;
			}
			/* An event that freed a client or moved a watch leaves
			 * the rest of this batch pointing into it: start over
			 * with a fresh batch; epoll is level-triggered, so
			 * nothing pending is lost. */
			if (ag.watch_gen != gen)
				break;
		}
		tick_if_due(&ag);
		metrics_poll(&ag, false);
	}
	if (slots_workers(&ag))
		log_warn("%u workers still attached after the grace period; their mappings "
			 "keep working, new allocations fail with -ESHUTDOWN", slots_workers(&ag));
	log_info("stopped: %llu workers admitted, %llu refused, %llu reclaimed, %llu repairs",
		 (unsigned long long)ag.admitted, (unsigned long long)ag.refused,
		 (unsigned long long)ag.reclaimed, (unsigned long long)ag.repairs);
	ret = 0;
out:
	if (ag.clients)
		for (unsigned k = 0; k < ag.max_clients; k++)
			if (ag.clients[k])
				client_free(&ag, ag.clients[k]);
	metrics_stop(&ag);
	if (ag.words)
		slots_fini(&ag);
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
	if (ag.spare_fd >= 0)
		close(ag.spare_fd);
	free(ag.clients);
	return ret;
}
