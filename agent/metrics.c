/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - GET /metrics over HTTP (--metrics ADDR:PORT), served by
 * libmicrohttpd inside the agent's own epoll loop. MHD runs with external
 * polling: its epoll fd is one more watch of the agent's (W_METRICS), and
 * MHD_run is called when that fd is readable and when MHD_get_timeout says,
 * or a second has passed (the loop sleeps no longer than that). So the text
 * (metrics_text.c) is made on the agent's one thread from its own table and
 * counters, with no lock and no thread of MHD's.
 *
 * Anyone who can reach the port is input, and none of them may stop the
 * agent admitting and reclaiming. What one can cost:
 *   - a scrape: the text scans every block and index entry, so it is made
 *     at most once a second, and the same response (MHD counts its
 *     references) is queued to every scrape until the next;
 *   - a connection: 32 at most, 8 from one address, 16 KiB of memory each
 *     (a longer URL or header block is answered 414 or 431 by MHD and
 *     closed), closed after 5 s without a byte (MHD's idle timeout), and
 *     shut down when its request takes over 10 s to arrive or its answer
 *     over 30 s to leave (a slowloris sending a byte every few seconds is
 *     never idle for long);
 *   - a request: GET or HEAD of /metrics; anything else is answered at
 *     once, without reading a body: 404 (another path), 405 (another
 *     method, with Allow), 413 (a GET with a body); after an answer given
 *     before the request was whole, MHD closes the connection.
 * MHD's own messages go to the log at debug level: a flood must not fill
 * the log, and nothing a peer does here is an error of the agent's.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_pvt.h"
#include "metrics.h"

#define NS 1000000000ull
#define RENDER_EVERY_NS NS            /* the text is made at most this often */
#define CONN_LIMIT 32u
#define CONN_PER_IP 8u
#define CONN_IDLE_S 5u
#define CONN_MEMORY ((size_t)16 * 1024)
#define REQUEST_DEADLINE_NS (10 * NS) /* for a request to arrive whole */
#define ANSWER_DEADLINE_NS (30 * NS)  /* for an answer to leave */
#define WAKE_WINDOW_NS (NS / 10)      /* MHD's epoll fd wakes the loop at most */
#define WAKES_PER_WINDOW 100u         /* this often, or is left unwatched */
#define PAUSE_MAX_NS NS

/* An open connection, from MHD's notification: its socket, and since when
 * it has been reading a request or sending an answer. */
struct conn {
	struct MHD_Connection *c; /* NULL: unused */
	int fd;
	bool answering, cut;
	uint64_t since_ns;
};

struct metrics {
	struct MHD_Daemon *d;
	int epfd;                 /* MHD's: watched, closed by MHD */
	uint64_t due_ns;          /* MHD_run by then (MHD_get_timeout) */
	/* wakeups by MHD's epoll fd in this window; while paused, it is not
	 * watched until resume_ns (the pause doubles while it goes on) */
	uint64_t window_ns, resume_ns, pause_ns;
	unsigned wakes;
	bool paused;
	struct MHD_Response *page; /* the text, as last made */
	uint64_t page_ns;         /* when it was made (or tried) */
	struct MHD_Response *answer[MA_N]; /* the others, made once */
	struct metrics_http http;
	struct metrics_text *text;
	struct conn conns[CONN_LIMIT];
};

static const char site_mhd[] = "metrics: libmicrohttpd";

/* MHD's messages: a peer's doing, or start-up detail. Debug, rate-limited. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char line[256];
	size_t n;

	(void)cls;
	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = '\0';
	agent_log_at(LOG_DEBUG, site_mhd, "metrics: %s", line);
}

static struct conn *conn_of(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *i =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return i ? i->socket_context : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **ctx,
			  enum MHD_ConnectionNotificationCode what)
{
	struct metrics *m = ((struct agent *)cls)->metrics;
	struct conn *k = *ctx;

	if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (k) {
			k->c = NULL;
			m->http.connections--;
		}
		*ctx = NULL;
		return;
	}
	/* MHD admits CONN_LIMIT at most: a free entry is always there */
	for (k = m->conns; k < m->conns + CONN_LIMIT && k->c; k++)
		;
	if (k == m->conns + CONN_LIMIT) {
		*ctx = NULL;
		return;
	}
	{
		const union MHD_ConnectionInfo *i =
			MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);

		*k = (struct conn){ .c = c, .fd = i ? i->connect_fd : -1,
				    .since_ns = agent_now_ns() };
	}
	m->http.connections++;
	*ctx = k;
}

/* a request answered (or abandoned): the connection reads the next one */
static void on_completed(void *cls, struct MHD_Connection *c, void **req,
			 enum MHD_RequestTerminationCode why)
{
	struct conn *k = conn_of(c);

	(void)cls;
	(void)req;
	(void)why;
	if (k) {
		k->answering = false;
		k->since_ns = agent_now_ns();
	}
}

/* the text, made again if it is a second old; NULL if it never could be */
static struct MHD_Response *page(struct agent *ag, struct metrics *m)
{
	uint64_t now = agent_now_ns();
	struct MHD_Response *r;
	char *text;
	size_t len;

	if (m->page_ns && now - m->page_ns < RENDER_EVERY_NS)
		return m->page;
	m->page_ns = now; /* a failure waits its second too */
	m->http.renders++;
	if (metrics_text_render(m->text, ag, &m->http, &text, &len) < 0) {
		agent_log_at(LOG_WARN, "metrics: out of memory", "metrics: out of memory making "
			     "the text: serving the last one");
		return m->page;
	}
	r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(text);
		return m->page;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				"text/plain; version=0.0.4; charset=utf-8");
	/* scrapes still sending the old text keep it until they are done */
	if (m->page)
		MHD_destroy_response(m->page);
	m->page = r;
	m->http.render_seconds = (double)(agent_now_ns() - now) / 1e9;
	return r;
}

static enum MHD_Result answer(struct metrics *m, struct MHD_Connection *c, enum metrics_answer a)
{
	static const unsigned status[MA_N] = {
		[MA_200] = MHD_HTTP_OK, [MA_404] = MHD_HTTP_NOT_FOUND,
		[MA_405] = MHD_HTTP_METHOD_NOT_ALLOWED, [MA_413] = MHD_HTTP_CONTENT_TOO_LARGE,
		[MA_503] = MHD_HTTP_SERVICE_UNAVAILABLE,
	};

	m->http.answers[a]++;
	return MHD_queue_response(c, status[a], m->answer[a]);
}

/*
 * A request that is not a scrape is answered at its first call, when its
 * headers are in: nothing of a body is ever read (MHD then closes the
 * connection). A scrape, GET or HEAD of /metrics without a body, is
 * answered at the second, once MHD has the request whole, so that the
 * connection stays open for the next one.
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **req)
{
	struct agent *ag = cls;
	struct metrics *m = ag->metrics;
	struct conn *k = conn_of(c);
	struct MHD_Response *r;
	const char *length;

	(void)version;
	(void)upload;
	if (!*req) {
		if (k) {
			k->answering = true;
			k->since_ns = agent_now_ns();
		}
		if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
			return answer(m, c, MA_405);
		if (strcmp(url, "/metrics"))
			return answer(m, c, MA_404);
		length = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
						     MHD_HTTP_HEADER_CONTENT_LENGTH);
		if ((length && strcmp(length, "0")) || *upload_size ||
		    MHD_lookup_connection_value(c, MHD_HEADER_KIND,
						MHD_HTTP_HEADER_TRANSFER_ENCODING))
			return answer(m, c, MA_413);
		*req = m; /* any address: "headers seen" */
		return MHD_YES;
	}
	if (*upload_size)
		return answer(m, c, MA_413);
	if (!(r = page(ag, m)))
		return answer(m, c, MA_503);
	m->http.answers[MA_200]++;
	return MHD_queue_response(c, MHD_HTTP_OK, r);
}

/* ------------------------------------------------------------ the loop's side */

/* connections that took too long (MHD's idle timeout does not see a peer
 * that sends a byte now and then): shut down, and MHD closes them */
static void cut_slow(struct metrics *m, uint64_t now)
{
	for (struct conn *k = m->conns; k < m->conns + CONN_LIMIT; k++) {
		uint64_t limit = k->answering ? ANSWER_DEADLINE_NS : REQUEST_DEADLINE_NS;

		if (!k->c || k->cut || k->fd < 0 || now - k->since_ns <= limit)
			continue;
		/* the descriptor is MHD's and stays open: a shutdown, not a
		 * close, so it cannot be reused under MHD */
		shutdown(k->fd, SHUT_RDWR);
		k->cut = true;
		m->http.cut++;
		agent_log_at(LOG_DEBUG, "metrics: cut", "metrics: a connection %s for over %llu s: "
			     "shut down", k->answering ? "took its answer" : "sent its request",
			     (unsigned long long)(limit / NS));
	}
}

/*
 * MHD's epoll fd is level-triggered in the agent's, and MHD can leave it
 * readable without anything to do: out of descriptors with no connection
 * open, it leaves its listening socket watched and retries accept() at
 * every run ("busy waiting for system resources", its log says), which
 * made the agent spin. More wakeups in a window than any scraping needs
 * take the fd out of the agent's epoll for 100 ms, doubling to a second
 * while it goes on; MHD still runs on its timeout meanwhile.
 */
static void throttle(struct agent *ag, struct metrics *m, uint64_t now)
{
	if (now - m->window_ns >= WAKE_WINDOW_NS) {
		if (m->wakes <= WAKES_PER_WINDOW)
			m->pause_ns = 0; /* a quiet window: the next pause starts short */
		m->window_ns = now;
		m->wakes = 0;
	}
	if (m->paused || ++m->wakes <= WAKES_PER_WINDOW)
		return;
	m->pause_ns = m->pause_ns ? (m->pause_ns * 2 > PAUSE_MAX_NS ? PAUSE_MAX_NS : m->pause_ns * 2)
				  : WAKE_WINDOW_NS;
	if (epoll_ctl(ag->ep, EPOLL_CTL_DEL, m->epfd, NULL) < 0)
		return;
	m->paused = true;
	m->resume_ns = now + m->pause_ns;
	m->http.paused++;
	agent_log_at(LOG_DEBUG, "metrics: paused", "metrics: libmicrohttpd woke the loop %u times in "
		     "%llu ms: not watched for %llu ms", m->wakes,
		     (unsigned long long)(WAKE_WINDOW_NS / 1000000),
		     (unsigned long long)(m->pause_ns / 1000000));
}

void metrics_poll(struct agent *ag, bool ready)
{
	struct metrics *m = ag->metrics;
	MHD_UNSIGNED_LONG_LONG ms;
	unsigned before;
	uint64_t now;

	if (!m)
		return;
	now = agent_now_ns();
	if (ready)
		throttle(ag, m, now);
	if (m->paused && now >= m->resume_ns && agent_watch(ag, m->epfd, &ag->wmetrics) == 0) {
		m->paused = false;
		ready = true; /* what came meanwhile */
	}
	if (ready || now >= m->due_ns) {
		before = m->http.connections;
		MHD_run(m->d);
		/* At its connection limit MHD takes its listening socket out of
		 * its epoll set, and puts it back only at the start of a run: a
		 * run that closed connections is followed by one more, or the
		 * queue of connections waiting to be accepted would wait for an
		 * event that cannot come. */
		if (m->http.connections < before)
			MHD_run(m->d);
		now = agent_now_ns();
		/* MHD's timeout, and a run a second whatever it says */
		m->due_ns = now + (MHD_get_timeout(m->d, &ms) == MHD_YES && ms < 1000 ? ms : 1000) *
					  1000000ull;
	}
	cut_slow(m, now);
}

int metrics_timeout_ms(struct agent *ag, int max_ms)
{
	struct metrics *m = ag->metrics;
	uint64_t now, due, ms;

	if (!m)
		return max_ms;
	now = agent_now_ns();
	due = m->paused && m->resume_ns < m->due_ns ? m->resume_ns : m->due_ns;
	if (due <= now)
		return 0;
	ms = (due - now + 999999) / 1000000;
	return ms < (uint64_t)max_ms ? (int)ms : max_ms;
}

/* ------------------------------------------------------------ start, stop */

/* "127.0.0.1:9400", "[::1]:9400" */
static void addr_text(const struct sockaddr_storage *sa, char *out, size_t len)
{
	char host[INET6_ADDRSTRLEN];

	if (sa->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;

		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(out, len, "[%s]:%u", host, ntohs(a->sin6_port));
	} else {
		const struct sockaddr_in *a = (const struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(out, len, "%s:%u", host, ntohs(a->sin_port));
	}
}

static bool loopback(const struct sockaddr_storage *sa)
{
	if (sa->ss_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;

		return IN6_IS_ADDR_LOOPBACK(a) ||
		       (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
	}
	return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
}

/* the listening socket, bound by us so that a failure says what and where */
static int listen_tcp(const struct agent_config *c, const char *where, int *out)
{
	socklen_t len = c->metrics_addr.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
							      : sizeof(struct sockaddr_in);
	int fd = socket(c->metrics_addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1, ret;

	if (fd < 0) {
		ret = -errno;
		log_err("--metrics %s: socket: %s", where, strerror(errno));
		return ret;
	}
	/* a restarted agent binds again at once, whatever connections of the
	 * last one linger in TIME_WAIT */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)&c->metrics_addr, len) < 0 ||
	    listen(fd, 64) < 0) {
		ret = -errno;
		log_err("--metrics %s: cannot listen there: %s", where, strerror(errno));
		close(fd);
		return ret;
	}
	*out = fd;
	return 0;
}

int metrics_start(struct agent *ag)
{
	static const char *const body[MA_N] = {
		[MA_404] = "not found: the metrics are at /metrics\n",
		[MA_405] = "method not allowed: GET or HEAD\n",
		[MA_413] = "a scrape has no body\n",
		[MA_503] = "the metrics could not be made\n",
	};
	const struct agent_config *c = ag->cfg;
	struct sockaddr_storage bound;
	socklen_t blen = sizeof(bound);
	struct metrics *m;
	const union MHD_DaemonInfo *info;
	char where[80];
	int fd = -1, ret;

	addr_text(&c->metrics_addr, where, sizeof(where));
	if ((ret = listen_tcp(c, where, &fd)) < 0)
		return ret;
	if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0)
		addr_text(&bound, where, sizeof(where)); /* port 0: the one given */
	m = calloc(1, sizeof(*m));
	if (!m || !(m->text = metrics_text_new())) {
		log_err("--metrics %s: out of memory", where);
		free(m);
		close(fd);
		return -ENOMEM;
	}
	ag->metrics = m;
	m->epfd = -1;
	m->due_ns = 0; /* MHD_run at the first turn of the loop */
	m->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
					(c->metrics_addr.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
				0, NULL, NULL, on_request, ag,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
				MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
				MHD_OPTION_CONNECTION_LIMIT, CONN_LIMIT,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, CONN_PER_IP,
				MHD_OPTION_CONNECTION_TIMEOUT, CONN_IDLE_S,
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, CONN_MEMORY,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, ag,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, ag,
				/* the agent ignores SIGPIPE (server.c) */
				MHD_OPTION_SIGPIPE_HANDLED_BY_APP, (int)1,
				MHD_OPTION_END);
	if (!m->d) {
		/* the listening socket may be MHD's by now: left to the exit */
		log_err("--metrics %s: libmicrohttpd would not start (%s)", where, strerror(errno));
		ret = -EIO;
		goto fail;
	}
	for (int a = MA_404; a < MA_N; a++) {
		m->answer[a] = MHD_create_response_from_buffer(strlen(body[a]), (void *)body[a],
								 MHD_RESPMEM_PERSISTENT);
		if (!m->answer[a] ||
		    MHD_add_response_header(m->answer[a], MHD_HTTP_HEADER_CONTENT_TYPE,
					    "text/plain; charset=utf-8") != MHD_YES) {
			log_err("--metrics %s: out of memory", where);
			ret = -ENOMEM;
			goto fail;
		}
	}
	MHD_add_response_header(m->answer[MA_405], MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_EPOLL_FD);
	m->epfd = info ? info->epoll_fd : -1;
	ag->wmetrics = (struct watch){ W_METRICS, NULL, NULL };
	if (m->epfd < 0 || (ret = agent_watch(ag, m->epfd, &ag->wmetrics)) < 0) {
		log_err("--metrics %s: watching libmicrohttpd's epoll: %s", where,
			strerror(m->epfd < 0 ? EBADF : -ret));
		m->epfd = -1;
		ret = -EIO;
		goto fail;
	}
	if (loopback(&c->metrics_addr))
		log_info("metrics on http://%s/metrics", where);
	else
		log_info("metrics on http://%s/metrics (not loopback: whoever reaches the port "
			 "reads the arena's workers and counters)", where);
	return 0;
fail:
	metrics_stop(ag);
	return ret;
}

void metrics_stop(struct agent *ag)
{
	struct metrics *m = ag->metrics;

	if (!m)
		return;
	if (m->epfd >= 0 && !m->paused)
		epoll_ctl(ag->ep, EPOLL_CTL_DEL, m->epfd, NULL);
	/* closes every connection (their references on the responses too),
	 * the listening socket and the epoll fd */
	if (m->d)
		MHD_stop_daemon(m->d);
	if (m->page)
		MHD_destroy_response(m->page);
	for (int a = 0; a < MA_N; a++)
		if (m->answer[a])
			MHD_destroy_response(m->answer[a]);
	metrics_text_free(m->text);
	free(m);
	ag->metrics = NULL;
}
