/* SPDX-License-Identifier: MIT */
/*
 * attach.c - the worker's side of the agent: attach, detach, observe.
 *
 * Attaching is one round trip: HELLO, then WELCOME with the two region fds
 * and a slot the agent reserved for this process; the worker maps the
 * regions and adopts the slot. From then on every arena call is shared
 * memory only. The connection stays open so that the agent sees the worker
 * go (EOF, besides its pidfd) and can tell it that it is stopping.
 *
 * A GPU arena's WELCOME has the metadata's fd alone; DEVMEM messages follow
 * with the chunks' fds, in order, which are imported and mapped as they
 * come (devmem.c), each message's fds closed before the next is read, so a
 * worker holds one message's worth at most whatever the chunk count.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "devmem_pvt.h"
#include "prefix_pvt.h"
#include "proto_pvt.h"

#define ATTACH_TIMEOUT_MS 5000

/* What kva_worker_leave() must undo for an attached worker. */
struct attach {
	int fd;                   /* the connection to the agent */
	int doorbell;             /* the tiers' doorbell, or -1 */
	void *host_map;           /* the host tier, mapped read-only, or NULL */
	size_t host_bytes;
	struct kva_arena *arena;  /* our mapping of its arena */
	bool stopping;            /* the agent said SHUTDOWN */
	struct kva_attach_times times;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *kva_default_socket(void)
{
	const char *env = getenv("KVARENA_SOCKET");

	return env && *env ? env : KVA_DEFAULT_SOCKET;
}

/*
 * hello - connect, say HELLO, read the answer: WELCOME with its fds, or the
 * agent's refusal turned into an errno and a sentence.
 */
static int hello(const char *path, const char *name, uint32_t flags, int *fd_out,
		 struct kva__welcome *wel, int fds[KVA__MAX_FDS], struct kva_attach_times *t)
{
	union kva__msg m, in;
	char buf[sizeof(union kva__msg)];
	int fd, nfds = 0, n, ret;
	uint64_t t0 = now_ns(), t1;

	if (!path)
		path = kva_default_socket();
	if ((ret = kva__sock_connect(path, &fd)) < 0)
		return ret;
	t1 = now_ns();
	t->connect_ns = t1 - t0;
	kva__msg_init(&m, KVA__MSG_HELLO);
	m.hello.pid = getpid();
	m.hello.flags = flags;
	/* cut at a character: one cut inside a UTF-8 sequence would be refused
	 * by the agent as not printable */
	kva__name_copy(m.hello.name, sizeof(m.hello.name), name ? name : "worker");
	if ((ret = kva__sock_send(fd, &m, NULL, 0)) < 0) {
		kva__err(ret, "sending HELLO to %s: %s", path, strerror(-ret));
		goto fail;
	}
	n = kva__sock_recv(fd, buf, sizeof(buf), fds, &nfds, ATTACH_TIMEOUT_MS);
	if (n < 0) {
		ret = n == -ECONNRESET ? -ECONNRESET : n;
		if (n == -ECONNRESET)
			kva__err(ret, "the agent at %s closed the connection", path);
		else if (n == -ETIMEDOUT)
			kva__err(ret, "the agent at %s did not answer in %d ms", path,
				 ATTACH_TIMEOUT_MS);
		goto fail;
	}
	if ((ret = kva__msg_decode(buf, (size_t)n, nfds, &in)) < 0)
		goto fail_fds;
	if (in.h.type == KVA__MSG_REFUSE) {
		ret = kva__err(kva__refusal_errno(in.refuse.reason), "the agent at %s refused: %s "
			       "(%s)", path, kva__refusal_name(in.refuse.reason), in.refuse.text);
		goto fail;
	}
	if (in.h.type != KVA__MSG_WELCOME) {
		ret = kva__err(-EPROTO, "protocol: the agent answered HELLO with %s",
			       kva__msg_type_name(in.h.type));
		goto fail;
	}
	*wel = in.welcome;
	*fd_out = fd;
	t->welcome_ns = now_ns() - t1;
	return 0;
fail_fds:
	while (nfds)
		close(fds[--nfds]);
fail:
	close(fd);
	return ret;
}

/* the host tier, read-only: workers copy its records themselves */
static int map_host_tier(struct attach *at, int fd)
{
	struct stat st;
	void *p;

	if (fstat(fd, &st) < 0 || st.st_size <= 0)
		return kva__err(-EPROTO, "protocol: the host tier's fd is not a memory file");
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return kva__err(-errno, "mapping the host tier: %s", strerror(errno));
	at->host_map = p;
	at->host_bytes = (size_t)st.st_size;
	return 0;
}

static void send_bye(int fd)
{
	union kva__msg m;

	kva__msg_init(&m, KVA__MSG_BYE);
	kva__sock_send(fd, &m, NULL, 0); /* best effort: EOF says the same */
}

static void attach_leave(struct kva_worker *w, void *ctx)
{
	struct attach *at = ctx;

	(void)w;
	send_bye(at->fd);
	close(at->fd);
	if (at->doorbell >= 0)
		close(at->doorbell);
	if (at->host_map)
		munmap(at->host_map, at->host_bytes);
	kva_arena_close(at->arena);
	free(at);
}

/*
 * A GPU arena's data: its chunks' fds (or the legacy IPC handle) read from
 * the DEVMEM messages that follow the WELCOME, each imported and mapped at
 * once (devmem.c), and the mapping given to the arena.
 */
static int import_device(struct attach *at, int fd, struct kva_arena *a)
{
	struct kva__dev_geom g;
	struct kva__dev_times dt;
	struct kva__dev *d = NULL;
	int ret;

	kva__arena_geom(a, &g);
	if ((ret = kva__dev_import_begin(&g, &d)) < 0)
		return ret;
	while (at->times.chunks < g.chunks && ret == 0) {
		char buf[sizeof(union kva__msg)];
		int fds[KVA__SCM_MAX_FD], nfds = 0, n;
		uint64_t t0 = now_ns();
		union kva__msg m;

		n = kva__sock_recv_fds(fd, buf, sizeof(buf), fds, KVA__SCM_MAX_FD, &nfds,
				       ATTACH_TIMEOUT_MS);
		at->times.recv_ns += now_ns() - t0;
		if (n < 0) {
			char why[160];

			/* copied first: kva__err writes where kva_errmsg() reads */
			snprintf(why, sizeof(why), "%s", n == -ETIMEDOUT ? "nothing for 5 s"
				 : n == -ECONNRESET ? "closed the connection" : kva_errmsg());
			ret = kva__err(n == -ETIMEDOUT ? -ETIMEDOUT : -EPROTO, "the agent sent %u of "
				       "the arena's %u GPU chunks, then %s", at->times.chunks,
				       g.chunks, why);
			break;
		}
		if ((ret = kva__msg_decode(buf, (size_t)n, nfds, &m)) == 0 &&
		    m.h.type != KVA__MSG_DEVMEM)
			ret = kva__err(-EPROTO, "protocol: %s where the GPU chunks were due",
				       kva__msg_type_name(m.h.type));
		if (ret == 0 && m.devmem.first != at->times.chunks)
			ret = kva__err(-EPROTO, "protocol: chunks from %u where chunk %u was due",
				       m.devmem.first, at->times.chunks);
		if (ret == 0 && (m.devmem.flags & KVA__DEVMEM_LEGACY)) {
			ret = kva__dev_import_ipc(d, m.devmem.ipc_handle);
			at->times.chunks = 1;
		}
		for (int k = 0; k < nfds; k++) {
			if (ret == 0 && (ret = kva__dev_import_fd(d, m.devmem.first + (uint32_t)k,
								  fds[k])) == 0)
				at->times.chunks++;
			close(fds[k]); /* imported: the mapping holds the memory */
		}
		at->times.messages++;
	}
	if (ret == 0)
		ret = kva__dev_import_end(d);
	kva__dev_times(d, &dt);
	at->times.driver_ns = dt.driver_ns;
	at->times.reserve_ns = dt.reserve_ns;
	at->times.import_ns = dt.import_ns;
	at->times.map_ns = dt.map_ns;
	at->times.access_ns = dt.access_ns;
	if (ret < 0) {
		kva__err_hold(true);
		kva__dev_close(d);
		kva__err_hold(false);
		return ret;
	}
	kva__arena_set_dev(a, d);
	return 0;
}

/* the fds of a WELCOME in order: metadata, data (not for a GPU arena),
 * doorbell, host tier; -1 for those it has not */
static void welcome_fds(const struct kva__welcome *wel, const int *fds, int *meta, int *data,
			int *doorbell, int *host)
{
	int k = 0;

	*meta = fds[k++];
	*data = wel->flags & KVA__WELCOME_DEVICE ? -1 : fds[k++];
	*doorbell = wel->flags & KVA__WELCOME_DOORBELL ? fds[k++] : -1;
	*host = wel->flags & KVA__WELCOME_HOSTTIER ? fds[k++] : -1;
}

int kva_attach(const char *socket_path, const char *name, struct kva_worker **out)
{
	struct kva__welcome wel;
	struct kva_arena *a = NULL;
	struct attach *at;
	int fds[KVA__MAX_FDS], fd, ret, meta_fd, data_fd, host_fd;
	uint64_t t0 = now_ns(), t1;

	if (!out)
		return kva__err(-EINVAL, "kva_attach: NULL argument");
	kva__err_clear();
	at = calloc(1, sizeof(*at));
	if (!at)
		return -ENOMEM;
	if ((ret = hello(socket_path, name, 0, &fd, &wel, fds, &at->times)) < 0) {
		free(at);
		return ret;
	}
	t1 = now_ns();
	welcome_fds(&wel, fds, &meta_fd, &data_fd, &at->doorbell, &host_fd);
	if (wel.flags & KVA__WELCOME_DEVICE)
		ret = kva__arena_open_meta(meta_fd, 0, &a);
	else
		ret = kva_arena_open(meta_fd, data_fd, &a);
	close(meta_fd);
	if (data_fd >= 0)
		close(data_fd);
	at->times.meta_ns = now_ns() - t1;
	if (ret == 0 && host_fd >= 0)
		ret = map_host_tier(at, host_fd);
	if (host_fd >= 0)
		close(host_fd);
	if (ret < 0)
		goto fail;
	if (kva_arena_info(a)->meta_bytes != wel.meta_bytes) {
		ret = kva__err(-EPROTO, "protocol: WELCOME says %llu metadata bytes, the region "
			       "has %llu", (unsigned long long)wel.meta_bytes,
			       (unsigned long long)kva_arena_info(a)->meta_bytes);
		goto fail;
	}
	if (wel.slot == KVA__NO_SLOT) {
		ret = kva__err(-EPROTO, "protocol: WELCOME without a slot for a worker");
		goto fail;
	}
	if ((wel.flags & KVA__WELCOME_DEVICE) && (ret = import_device(at, fd, a)) < 0)
		goto fail;
	t1 = now_ns();
	if ((ret = kva_worker_adopt(a, wel.slot, wel.generation, name, out)) < 0)
		goto fail;
	/* one way: the agent learns the slot is LIVE (it restores that word if
	 * another worker overwrites it); no answer to wait for */
	{
		union kva__msg m;

		kva__msg_init(&m, KVA__MSG_ADOPTED);
		kva__sock_send(fd, &m, NULL, 0);
	}
	at->fd = fd;
	at->arena = a;
	(*out)->doorbell = at->doorbell;
	(*out)->host_map = at->host_map;
	(*out)->host_bytes = at->host_bytes;
	(*out)->rec_fp = kva__rec_fingerprint(kva_arena_info(a));
	(*out)->on_leave = attach_leave;
	(*out)->on_leave_ctx = at;
	at->times.adopt_ns = now_ns() - t1;
	at->times.total_ns = now_ns() - t0;
	return 0;
fail:
	kva__err_hold(true); /* the message is the cause, not the cleanup's */
	send_bye(fd);        /* the agent takes its reservation back */
	close(fd);
	if (at->doorbell >= 0)
		close(at->doorbell);
	if (at->host_map)
		munmap(at->host_map, at->host_bytes);
	kva_arena_close(a);
	free(at);
	kva__err_hold(false);
	return ret;
}

void kva_detach(struct kva_worker *w)
{
	kva_worker_leave(w);
}

static struct attach *attached(const struct kva_worker *w)
{
	return w && w->on_leave == attach_leave ? w->on_leave_ctx : NULL;
}

int kva_worker_attach_times(const struct kva_worker *w, struct kva_attach_times *t)
{
	struct attach *at = attached(w);

	if (!at || !t)
		return -EINVAL;
	*t = at->times;
	return 0;
}

int kva_worker_fd(const struct kva_worker *w)
{
	struct attach *at = attached(w);

	return at ? at->fd : -EINVAL;
}

int kva_worker_poll(struct kva_worker *w)
{
	struct attach *at = attached(w);
	char buf[sizeof(union kva__msg)];
	union kva__msg m;
	int fds[KVA__MAX_FDS], nfds, n;

	if (!at)
		return -EINVAL;
	while (!at->stopping) {
		n = kva__sock_recv(at->fd, buf, sizeof(buf), fds, &nfds, 0);
		if (n == -ETIMEDOUT)
			return 0; /* nothing pending */
		if (n == -ECONNRESET)
			return kva__err(-ECONNRESET, "the agent is gone: the arena still works, "
					"but nobody reclaims the blocks of workers that die");
		if (n < 0)
			return n;
		if (kva__msg_decode(buf, (size_t)n, nfds, &m) < 0) {
			while (nfds)
				close(fds[--nfds]);
			return -EPROTO;
		}
		if (m.h.type == KVA__MSG_SHUTDOWN)
			at->stopping = true;
	}
	return kva__err(-ESHUTDOWN, "the agent is shutting down: free what you hold and "
			"detach");
}

int kva_observe(const char *socket_path, struct kva_arena **out, struct kva_agent_info *info)
{
	struct kva__welcome wel;
	struct kva_attach_times t;
	int fds[KVA__MAX_FDS], fd, ret, meta_fd, data_fd, doorbell, host_fd;

	if (!out)
		return kva__err(-EINVAL, "kva_observe: NULL argument");
	kva__err_clear();
	if ((ret = hello(socket_path, "observer", KVA__HELLO_OBSERVER, &fd, &wel, fds, &t)) < 0)
		return ret;
	send_bye(fd);
	close(fd); /* an observer keeps no connection: the mapping is all it needs */
	welcome_fds(&wel, fds, &meta_fd, &data_fd, &doorbell, &host_fd);
	if (wel.slot != KVA__NO_SLOT || !(wel.flags & KVA__WELCOME_READONLY) || doorbell >= 0 ||
	    host_fd >= 0)
		ret = kva__err(-EPROTO, "protocol: an observer was given a worker's welcome");
	else /* a GPU arena's observer maps the metadata alone */
		ret = kva_arena_open_flags(meta_fd, data_fd, KVA_OPEN_READONLY, out);
	for (int k = 0; k < 4; k++) {
		int f = k == 0 ? meta_fd : k == 1 ? data_fd : k == 2 ? doorbell : host_fd;

		if (f >= 0)
			close(f);
	}
	if (ret == 0 && info) {
		memset(info, 0, sizeof(*info));
		info->pid = wel.agent_pid;
		memcpy(info->arena, wel.arena, sizeof(info->arena));
	}
	return ret;
}
