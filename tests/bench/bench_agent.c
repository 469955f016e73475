/* SPDX-License-Identifier: MIT */
/*
 * bench_agent.c - `kvarena-bench attach` and `kvarena-bench reclaim-agent`:
 * what a worker pays to enter a real kvarena-agent's arena, and how soon the
 * blocks of a SIGKILLed worker are free again when the agent reclaims them.
 *
 * Both start the kvarena-agent program (--agent PATH; by default the one of
 * this build tree) on a socket of their own, in a fresh directory under /tmp
 * whose agent.log takes the agent's stdout and stderr, and stop it with
 * SIGTERM at the end: the run fails unless the agent exits 0 and has removed
 * its socket. The directory is removed after a good run and kept, with its
 * log, after a failed one.
 *
 * attach: a few unmeasured rounds, then N rounds of each of
 *   socket() + connect() + close() to the agent's socket    (connect_only)
 *   kva_attach(); kva_detach()                               (attach, attach_detach)
 * taking turns of ATTACH_TURN rounds, so that a slow spell of the machine
 * falls on both alike (attach_rounds). connect_only is the floor: no attach
 * can cost less than reaching the agent.
 *
 * attach --backend cuda: the same against an agent whose arena is on a GPU
 * (over tests/cudastub's driver stand-in where there is no GPU: put it first
 * on LD_LIBRARY_PATH; the lines say "driver": "stand-in"), and one more line
 * with the parts of each attach (kva_worker_attach_times): where a GPU
 * attach spends its time is in the driver's import and map of each chunk.
 * With no driver at all, one line says "no device" and why, and the run
 * exits 0.
 *
 * reclaim-agent: this process holds a kva_observe() mapping. Each repetition
 * forks a victim that attaches, takes `hold` blocks (in batches of
 * VICTIM_BATCH, keeping the arena's default worker cache), tells this process
 * its slot and waits. This process reads the clock, SIGKILLs the victim and
 * spins on the victim's slot word (one load) until it reads FREE: the agent
 * stores FREE only after its sweep has returned every block. One
 * kva_arena_stats() then confirms that every block of the arena is free.
 *
 * Output: one JSON object per line on stdout, with these fields:
 *
 *   bench           "attach" or "reclaim-agent"
 *   mode            attach: "connect_only", "attach" (kva_attach alone),
 *                   "attach_detach" (kva_attach + kva_detach), "parts" (the
 *                   medians of kva_attach's parts, below);
 *                   reclaim-agent: "sigkill"
 *   backend         attach: "host" or "cuda"
 *   device, driver  attach --backend cuda: the GPU's name, and "cuda" or
 *                   "stand-in" (the project's driver stand-in: host memory)
 *   chunks, chunk_bytes, ipc   attach --backend cuda: how the region is cut
 *                   and shared ("fd" or "legacy")
 *   status, reason  attach --backend cuda with no driver: "no device", and why
 *   connect_us, welcome_us, meta_us, driver_us, reserve_us, recv_us,
 *   import_us, map_us, access_us, adopt_us, total_us   attach "parts":
 *                   medians over the measured attaches of struct
 *                   kva_attach_times's fields; messages: chunk messages
 *   samples         rounds (attach) or repetitions (reclaim-agent) measured
 *   blocks          the arena's size, as the agent was started with
 *   median_us, p99_us, max_us   attach: microseconds per round; the p99 is
 *                   the nearest-rank percentile (bench_percentile)
 *   target_median_us  attach, attach_detach: the goal, 1000
 *   ratio_vs_connect  attach, attach_detach: median_us / connect_only's
 *   blocks_held     reclaim-agent: blocks the victim took
 *   worker_cache    reclaim-agent: the arena's default worker cache, which
 *                   the victim kept (what is in it is reclaimed too)
 *   median_ms, p99_ms, max_ms   reclaim-agent: SIGKILL until every block is
 *                   free as this process sees it (with 20 repetitions, the
 *                   p99 is the slowest)
 *   target_p99_ms   reclaim-agent: the goal, 10
 *   agent_reclaim_ms_median, agent_reclaim_ms_max   kva_arena_reclaim()
 *                   inside the agent, from the line its log has for each
 *                   victim; null if a victim's line is missing
 *   agent_blocks_returned  median of the blocks the agent says it returned
 *                   (blocks_held and what the victim's cache held)
 *   notice_ms_median, notice_ms_max  median and largest of (sample - the
 *                   agent's reclaim of that victim): the victim's exit, the
 *                   agent's wake-up on its pidfd, and this process reading
 *                   FREE; where a slow sample's time went when the agent's
 *                   own reclaim was quick
 *
 * Progress and diagnostics go to stderr; stdout carries nothing but lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvarena.h"
#include "bench.h"

#ifndef KVA_BENCH_AGENT
#define KVA_BENCH_AGENT "kvarena-agent" /* meson passes the build tree's */
#endif

#define READY_TIMEOUT_MS 10000   /* from exec to a socket that answers */
#define STOP_TIMEOUT_MS 15000    /* SIGTERM to exit: the agent's grace is 5 s */
#define VICTIM_TIMEOUT_MS 60000  /* a victim attaches and takes its blocks */
#define RECLAIM_TIMEOUT_NS 10000000000ull
#define ATTACH_WARMUP 10u
#define ATTACH_TURN 10u          /* rounds of one kind before the other's turn */
#define VICTIM_BATCH 32u         /* blocks per kva_alloc(), a request's worth */
#define TARGET_ATTACH_MEDIAN_US 1000
#define TARGET_RECLAIM_P99_MS 10

/* ------------------------------------------------------------ the agent */


static void sleep_ms(unsigned ms)
{
	bench_sleep_until(bench_now_ns() + ms * 1000000ull);
}

/* agent_log_tail - the end of the agent's log, on stderr, to say why it failed. */
static void agent_log_tail(const struct bench_agent *ap)
{
	char buf[3072], *start = buf;
	FILE *f = fopen(ap->log, "r");
	long size;
	size_t n;

	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, size > (long)sizeof(buf) - 1 ? size - (long)sizeof(buf) + 1 : 0, SEEK_SET);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (size > (long)sizeof(buf) - 1 && (start = strchr(buf, '\n')))
		start++; /* from the first whole line */
	if (start && *start)
		fprintf(stderr, "%s: the agent's log ends with:\n%s%s", ap->who, start,
			buf[n ? n - 1 : 0] == '\n' ? "" : "\n");
	else if (size == 0)
		fprintf(stderr, "%s: the agent's log is empty\n", ap->who);
}

/* exit_status - what a wait status says, in words. */
static const char *exit_status(int status, char *buf, size_t len)
{
	if (WIFEXITED(status))
		snprintf(buf, len, "exit status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "signal %s", strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "wait status %#x", (unsigned)status);
	return buf;
}

/*
 * agent_exec - in the child: the agent's log as stdout and stderr, nothing of
 * this process's environment that would make it talk to systemd, then exec.
 * Tells exec's errno on @err_fd (close-on-exec: the parent reads end of file
 * when exec worked). Never returns.
 */
static void agent_exec(const char *path, char *const argv[], int log_fd, int err_fd,
		       pid_t parent)
{
	sigset_t none;
	int err;

	/* an agent must not outlive the benchmark that started it (which may
	 * have died before the prctl: then it is no longer our parent) */
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (getppid() != parent)
		_exit(1);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	/* set when the benchmark runs under systemd; the agent would tell our unit READY=1 */
	unsetenv("NOTIFY_SOCKET");
	unsetenv("JOURNAL_STREAM");
	if (dup2(log_fd, STDOUT_FILENO) >= 0 && dup2(log_fd, STDERR_FILENO) >= 0) {
		if (strchr(path, '/'))
			execv(path, argv);
		else
			execvp(path, argv);
	}
	err = errno;
	_exit(write(err_fd, &err, sizeof(err)) == (ssize_t)sizeof(err) ? 127 : 126);
}

/* agent_remove_dir - the socket (if left), the log, the directory. */
static void agent_remove_dir(const struct bench_agent *ap)
{
	unlink(ap->socket);
	unlink(ap->log);
	rmdir(ap->dir);
}

static int agent_finish(struct bench_agent *ap, int status);

/*
 * agent_start - start @path on a socket in a fresh directory with an arena of
 * @blocks blocks, and wait until it answers: @observer is then a read-only
 * mapping of its arena (kva_observe). Failures are told on stderr.
 * Return: 0, or -errno; an agent that was started is then stopped, and its
 * directory kept if its log may say why (agent_finish).
 */
static int agent_start(const char *path, uint32_t blocks, struct bench_agent *ap,
		       struct kva_arena **observer)
{
	char blocks_arg[16];
	const char *extra[] = { "--blocks", blocks_arg, NULL };

	snprintf(blocks_arg, sizeof(blocks_arg), "%u", blocks);
	return bench_agent_start(path, extra, ap, observer);
}

int bench_agent_start(const char *path, const char *const *extra, struct bench_agent *ap,
		      struct kva_arena **observer)
{
	char *argv[48] = {
		(char *)path, (char *)"--socket", ap->socket, (char *)"--name",
		(char *)"kvarena-bench",
	};
	unsigned argc = 5;
	struct kva_agent_info info;
	int log_fd, err_pipe[2], err = 0, ret, status;
	uint64_t t0, deadline;
	pid_t self = getpid();
	ssize_t n;

	snprintf(ap->dir, sizeof(ap->dir), "/tmp/kvarena-bench.XXXXXX");
	if (!mkdtemp(ap->dir)) {
		ret = -errno;
		fprintf(stderr, "%s: mkdtemp %s: %s\n", ap->who, ap->dir, strerror(-ret));
		return ret;
	}
	snprintf(ap->socket, sizeof(ap->socket), "%s/agent.sock", ap->dir);
	snprintf(ap->log, sizeof(ap->log), "%s/agent.log", ap->dir);
	for (; extra && *extra && argc < 47; extra++)
		argv[argc++] = (char *)*extra;
	argv[argc] = NULL;
	log_fd = open(ap->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (log_fd < 0 || pipe2(err_pipe, O_CLOEXEC) < 0) {
		ret = -errno;
		fprintf(stderr, "%s: %s: %s\n", ap->who, log_fd < 0 ? ap->log : "pipe",
			strerror(-ret));
		if (log_fd >= 0)
			close(log_fd);
		agent_remove_dir(ap);
		return ret;
	}
	fflush(stdout);
	fflush(stderr);
	t0 = bench_now_ns();
	ap->pid = fork();
	if (ap->pid == 0)
		agent_exec(path, argv, log_fd, err_pipe[1], self);
	ret = ap->pid < 0 ? -errno : 0;
	close(log_fd);
	close(err_pipe[1]);
	if (ret < 0) {
		ap->pid = 0;
		close(err_pipe[0]);
		fprintf(stderr, "%s: fork: %s\n", ap->who, strerror(-ret));
		agent_remove_dir(ap);
		return ret;
	}
	while ((n = read(err_pipe[0], &err, sizeof(err))) < 0 && errno == EINTR)
		;
	close(err_pipe[0]);
	if (n == (ssize_t)sizeof(err)) {
		bench_reap(ap->pid);
		ap->pid = 0;
		fprintf(stderr, "%s: cannot run the agent %s: %s (--agent PATH names another)\n",
			ap->who, path, strerror(err));
		agent_remove_dir(ap);
		return -err;
	}

	/* exec worked: poll until the socket answers, or the agent dies */
	deadline = t0 + READY_TIMEOUT_MS * 1000000ull;
	for (;;) {
		ret = kva_observe(ap->socket, observer, &info);
		if (ret == 0)
			break;
		if (waitpid(ap->pid, &status, WNOHANG) == ap->pid) {
			char why[64];

			ap->pid = 0;
			fprintf(stderr, "%s: the agent %s ended before it answered (%s)\n", ap->who,
				path, exit_status(status, why, sizeof(why)));
			return agent_finish(ap, -ECHILD);
		}
		if (ret != -ENOENT && ret != -ECONNREFUSED) {
			fprintf(stderr, "%s: kva_observe %s: %s\n", ap->who, ap->socket,
				kva_errmsg());
			return agent_finish(ap, ret);
		}
		if (bench_now_ns() > deadline) {
			fprintf(stderr, "%s: the agent did not answer on %s within %d ms\n",
				ap->who, ap->socket, READY_TIMEOUT_MS);
			return agent_finish(ap, -ETIMEDOUT);
		}
		sleep_ms(2);
	}
	if (info.pid != ap->pid) {
		kva_arena_close(*observer);
		*observer = NULL;
		fprintf(stderr, "%s: process %d answers on %s, not our agent %d\n", ap->who,
			(int)info.pid, ap->socket, (int)ap->pid);
		return agent_finish(ap, -EPROTO);
	}
	fprintf(stderr, "%s: agent %s pid %d, %u blocks, ready on %s in %.1f ms\n", ap->who,
		path, (int)ap->pid, kva_arena_info(*observer)->blocks, ap->socket,
		(double)(bench_now_ns() - t0) / 1e6);
	return 0;
}

/*
 * agent_stop - SIGTERM, and check the agent's end: exit status 0 within
 * STOP_TIMEOUT_MS, and its socket gone. An agent that does not stop is
 * SIGKILLed. Failures are told on stderr. Return: 0, -ETIMEDOUT, -ECHILD
 * (another end than exit 0), -EEXIST (the socket is left).
 */
static int agent_stop(struct bench_agent *ap)
{
	uint64_t deadline = bench_now_ns() + STOP_TIMEOUT_MS * 1000000ull;
	struct stat st;
	char why[64];
	int status = 0;
	pid_t got;

	if (!ap->pid)
		return 0;
	kill(ap->pid, SIGTERM);
	while ((got = waitpid(ap->pid, &status, WNOHANG)) == 0 && bench_now_ns() < deadline)
		sleep_ms(5);
	if (got == 0) {
		kill(ap->pid, SIGKILL);
		bench_reap(ap->pid);
		ap->pid = 0;
		fprintf(stderr, "%s: the agent did not exit within %d ms of SIGTERM: killed\n",
			ap->who, STOP_TIMEOUT_MS);
		return -ETIMEDOUT;
	}
	ap->pid = 0;
	if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "%s: the agent ended with %s after SIGTERM, not exit 0\n",
			ap->who, got < 0 ? strerror(errno) : exit_status(status, why, sizeof(why)));
		return -ECHILD;
	}
	if (lstat(ap->socket, &st) == 0) {
		fprintf(stderr, "%s: the agent exited 0 but left its socket %s\n", ap->who,
			ap->socket);
		return -EEXIST;
	}
	return 0;
}

/*
 * agent_finish - the end of a run that started @ap: stop the agent if it is
 * still running and, after a good run, remove its directory; after a failed
 * one (@status < 0) keep it and show the end of the log. Return: @status if
 * it is an error, else agent_stop()'s.
 */
int bench_agent_stop(struct bench_agent *ap, int status)
{
	return agent_finish(ap, status);
}

static int agent_finish(struct bench_agent *ap, int status)
{
	int ret = agent_stop(ap);

	if (status < 0 || ret < 0) {
		agent_log_tail(ap);
		fprintf(stderr, "%s: the agent's log is kept in %s\n", ap->who, ap->log);
		return status < 0 ? status : ret;
	}
	agent_remove_dir(ap);
	return 0;
}

/* ------------------------------------------------------------ figures */

struct spread {
	double median, p99, max;
};

static struct spread spread_of(double *v, unsigned n)
{
	struct spread s;

	s.p99 = bench_percentile(v, n, 99);
	s.median = bench_median(v, n);
	s.max = v[n - 1]; /* sorted by both */
	return s;
}

/* ------------------------------------------------------------ attach */

/*
 * connect_once - the floor of an attach: a SEQPACKET socket connected to the
 * agent's listening socket and closed. The kernel completes the connection
 * on its own; the agent only accepts it, reads end of file and forgets it,
 * after this has returned.
 */
static int connect_once(const struct sockaddr_un *sa, double *us)
{
	uint64_t t0 = bench_now_ns();
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), ret = 0;

	if (fd < 0)
		return -errno;
	if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) < 0)
		ret = -errno;
	close(fd);
	*us = (double)(bench_now_ns() - t0) / 1e3;
	return ret;
}

static int attach_once(const char *socket_path, double *attach_us, double *round_us,
		       struct kva_attach_times *parts)
{
	struct kva_worker *w = NULL;
	uint64_t t0, t1;
	int ret;

	t0 = bench_now_ns();
	ret = kva_attach(socket_path, "bench", &w);
	t1 = bench_now_ns();
	if (ret < 0)
		return ret;
	if (parts)
		kva_worker_attach_times(w, parts);
	kva_detach(w);
	*attach_us = (double)(t1 - t0) / 1e3;
	*round_us = (double)(bench_now_ns() - t0) / 1e3;
	return 0;
}

struct attach_samples {
	double *connect_us, *attach_us, *round_us;
	struct kva_attach_times *parts;
};

/*
 * attach_rounds - @n rounds of each kind, in turns of ATTACH_TURN connects
 * then ATTACH_TURN attach rounds. Each connect leaves the agent an accept and
 * an end of file to handle after the connect has returned; one unmeasured
 * attach round between the kinds lets the agent finish them, so that a
 * measured attach waits only for what attaches leave (the previous detach's
 * BYE and end of file), as it would in a fleet of workers that start one
 * after another.
 */
static int attach_rounds(const struct bench_agent *ap, unsigned n, struct attach_samples *s)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	double scratch[3];
	int ret = 0;

	memcpy(sa.sun_path, ap->socket, strlen(ap->socket) + 1);
	/* unmeasured: page faults, lazy binding, the agent's first allocations */
	for (unsigned k = 0; k < ATTACH_WARMUP && ret == 0; k++)
		if ((ret = connect_once(&sa, &scratch[0])) == 0)
			ret = attach_once(ap->socket, &scratch[1], &scratch[2], NULL);
	for (unsigned turn = 0; turn < n && ret == 0; turn += ATTACH_TURN) {
		unsigned end = n - turn < ATTACH_TURN ? n : turn + ATTACH_TURN;

		for (unsigned k = turn; k < end && ret == 0; k++)
			ret = connect_once(&sa, &s->connect_us[k]);
		if (ret == 0)
			ret = attach_once(ap->socket, &scratch[1], &scratch[2], NULL);
		for (unsigned k = turn; k < end && ret == 0; k++)
			ret = attach_once(ap->socket, &s->attach_us[k], &s->round_us[k],
					  &s->parts[k]);
	}
	if (ret < 0)
		fprintf(stderr, "attach: %s (%s)\n", strerror(-ret), kva_errmsg());
	return ret;
}

/* arena_all_free - nobody joined and every block free, as @a shows it now. */
static int arena_all_free(struct kva_arena *a, const char *who, const char *when)
{
	struct kva_stats st;
	int ret = kva_arena_stats(a, &st);

	if (ret < 0) {
		fprintf(stderr, "%s: kva_arena_stats: %s\n", who, strerror(-ret));
		return ret;
	}
	if (st.workers || st.free_blocks != st.total_blocks) {
		fprintf(stderr, "%s: %s, %u workers are joined and %u of %u blocks free\n", who,
			when, st.workers, st.free_blocks, st.total_blocks);
		return -EUCLEAN;
	}
	return 0;
}

/* what every attach line says of the arena's home */
struct attach_where {
	const char *backend;     /* "host", "cuda" */
	char device[64];         /* cuda: the GPU's name, printable */
	const char *driver;      /* cuda: "cuda" or "stand-in" */
	const struct kva_arena_info *info;
};

static void where_fields(struct bench_line *l, const struct attach_where *w)
{
	bench_line_str(l, "backend", w->backend);
	if (strcmp(w->backend, "cuda"))
		return;
	bench_line_str(l, "device", w->device);
	bench_line_str(l, "driver", w->driver);
	if (w->info) {
		bench_line_num(l, "chunks", w->info->chunks, 0);
		bench_line_num(l, "chunk_bytes", (double)w->info->chunk_bytes, 0);
		bench_line_str(l, "ipc", w->info->ipc == KVA_IPC_FD ? "fd" : "legacy");
	}
}

static int attach_print(const char *mode, unsigned n, uint32_t blocks, struct spread s,
			double target, double connect_median, const struct attach_where *w)
{
	struct bench_line l;

	bench_line_begin(&l, "attach", mode);
	bench_line_num(&l, "samples", n, 0);
	bench_line_num(&l, "blocks", blocks, 0);
	where_fields(&l, w);
	bench_line_num(&l, "median_us", s.median, 2);
	bench_line_num(&l, "p99_us", s.p99, 2);
	bench_line_num(&l, "max_us", s.max, 2);
	if (target > 0) {
		bench_line_num(&l, "target_median_us", target, 0);
		bench_line_num(&l, "ratio_vs_connect", s.median / connect_median, 2);
	}
	return bench_line_print(&l);
}

/* the medians of kva_attach's parts over @n attaches */
static int parts_print(const struct kva_attach_times *p, unsigned n, uint32_t blocks,
		       const struct attach_where *w)
{
	static const struct {
		const char *key;
		size_t off;
	} parts[] = {
#define P(f) { #f, offsetof(struct kva_attach_times, f) }
		P(connect_ns), P(welcome_ns), P(meta_ns), P(driver_ns), P(reserve_ns),
		P(recv_ns), P(import_ns), P(map_ns), P(access_ns), P(adopt_ns), P(total_ns),
#undef P
	};
	double *v = calloc(n, sizeof(double));
	struct bench_line l;

	if (!v)
		return -ENOMEM;
	bench_line_begin(&l, "attach", "parts");
	bench_line_num(&l, "samples", n, 0);
	bench_line_num(&l, "blocks", blocks, 0);
	where_fields(&l, w);
	for (size_t k = 0; k < sizeof(parts) / sizeof(parts[0]); k++) {
		char key[32];

		for (unsigned i = 0; i < n; i++) {
			uint64_t ns;

			memcpy(&ns, (const char *)&p[i] + parts[k].off, sizeof(ns));
			v[i] = (double)ns / 1e3;
		}
		/* "connect_ns" -> "connect_us" */
		snprintf(key, sizeof(key), "%.*sus", (int)strlen(parts[k].key) - 2, parts[k].key);
		bench_line_num(&l, key, bench_median(v, n), 2);
	}
	bench_line_num(&l, "messages", p[n - 1].messages, 0);
	free(v);
	return bench_line_print(&l);
}

/* ------------------------------------------------------------ options */

/* What differs between the two subcommands' command lines. */
struct agent_cmd {
	const char *name;
	uint32_t samples, samples_quick, blocks;
	bool takes_hold;
	const char *text; /* what it measures, for --help */
};

struct agent_opts {
	const char *agent;
	uint32_t samples, blocks, hold;
	bool quick;
	const char *backend;      /* attach: "host" or "cuda" */
	const char *chunk_bytes;  /* attach --backend cuda: passed to the agent */
	const char *ipc;
};

static const struct agent_cmd attach_cmd = {
	.name = "attach", .samples = 500, .samples_quick = 50, .blocks = 4096,
	.text = "Cost of kva_attach() and of kva_attach() + kva_detach() against a real\n"
		"kvarena-agent this program starts, next to a bare socket()+connect()+close()\n"
		"to the same socket, taking turns, and the attach's parts. One JSON line per\n"
		"mode. --backend cuda: the arena on a GPU (the driver stand-in of the tests,\n"
		"tests/cudastub, where LD_LIBRARY_PATH puts it first).\n",
};

static const struct agent_cmd reclaim_cmd = {
	.name = "reclaim-agent", .samples = 20, .samples_quick = 3, .blocks = 65536,
	.takes_hold = true,
	.text = "Time from SIGKILL of an attached worker holding blocks until the agent this\n"
		"program starts has made every block free again, as a read-only observer\n"
		"mapping (kva_observe) sees it. One JSON line.\n",
};

static void usage(const struct agent_cmd *c, FILE *f)
{
	fprintf(f, "usage: kvarena-bench %s [options]\n\n%s\n", c->name, c->text);
	fprintf(f, "  --agent PATH      the kvarena-agent to start (default %s)\n",
		KVA_BENCH_AGENT);
	fprintf(f, "  --samples N       %s measured (default %u)\n",
		c->takes_hold ? "repetitions" : "rounds", c->samples);
	fprintf(f, "  --blocks N        arena size given to the agent (default %u)\n", c->blocks);
	if (c->takes_hold)
		fprintf(f, "  --hold N          blocks the killed worker holds (default 50000)\n");
	else
		fprintf(f, "  --backend B       host (default) or cuda: where the agent's arena is\n"
			   "  --chunk-bytes S   cuda: the agent's --chunk-bytes (default its own)\n"
			   "  --ipc M           cuda: the agent's --ipc (auto, fd, legacy)\n");
	fprintf(f, "  --quick           %u %s, for the test suite\n"
		   "  --help            this text\n",
		c->samples_quick, c->takes_hold ? "repetitions" : "rounds");
}

static int usage_error(const struct agent_cmd *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int usage_error(const struct agent_cmd *c, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvarena-bench %s: ", c->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(kvarena-bench %s --help lists the options)\n", c->name);
	return -EINVAL;
}

/* parse - fill @o from the command line; 1 for --help, -EINVAL (told on stderr) if wrong. */
static int parse(const struct agent_cmd *c, int argc, char **argv, struct agent_opts *o)
{
	static const struct option longopts[] = {
		{ "agent", required_argument, NULL, 'a' },
		{ "samples", required_argument, NULL, 'n' },
		{ "blocks", required_argument, NULL, 'b' },
		{ "hold", required_argument, NULL, 'H' },
		{ "backend", required_argument, NULL, 'B' },
		{ "chunk-bytes", required_argument, NULL, 'C' },
		{ "ipc", required_argument, NULL, 'I' },
		{ "quick", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	uint32_t samples = 0;
	int ch;

	*o = (struct agent_opts){ .agent = KVA_BENCH_AGENT, .blocks = c->blocks, .hold = 50000,
				  .backend = "host" };
	opterr = 0;
	optind = 1;
	while ((ch = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (ch) {
		case 'a':
			if (!*optarg)
				return usage_error(c, "--agent: an empty path");
			o->agent = optarg;
			break;
		case 'n':
			if (bench_parse_u32(optarg, 1, 100000, &samples) < 0)
				return usage_error(c, "--samples '%s': 1 to 100000", optarg);
			break;
		case 'b':
			if (bench_parse_u32(optarg, 256, 1u << 26, &o->blocks) < 0)
				return usage_error(c, "--blocks '%s': 256 to 67108864", optarg);
			break;
		case 'H':
			if (!c->takes_hold)
				return usage_error(c, "unknown option '--hold'");
			if (bench_parse_u32(optarg, 1, 1u << 26, &o->hold) < 0)
				return usage_error(c, "--hold '%s': 1 to 67108864", optarg);
			break;
		case 'B':
			if (c->takes_hold || (strcmp(optarg, "host") && strcmp(optarg, "cuda")))
				return usage_error(c, "--backend '%s': host or cuda", optarg);
			o->backend = optarg;
			break;
		case 'C':
		case 'I':
			if (c->takes_hold)
				return usage_error(c, "unknown option '%s'", argv[optind - 1]);
			*(ch == 'C' ? &o->chunk_bytes : &o->ipc) = optarg;
			break;
		case 'q':
			o->quick = true;
			break;
		case 'h':
			return 1;
		case ':':
			return usage_error(c, "option '%s' needs a value", argv[optind - 1]);
		default:
			return usage_error(c, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_error(c, "unexpected argument '%s'", argv[optind]);
	if ((o->chunk_bytes || o->ipc) && strcmp(o->backend, "cuda"))
		return usage_error(c, "--chunk-bytes and --ipc are for --backend cuda");
	o->samples = samples ? samples : o->quick ? c->samples_quick : c->samples;
	if (c->takes_hold && o->hold >= o->blocks)
		return usage_error(c, "--hold %u: must be fewer than the arena's %u blocks",
				   o->hold, o->blocks);
	return 0;
}

/* parse_or_exit - 0 to go on, else the exit status: 0 after --help, 2 for bad usage. */
static int parse_or_exit(const struct agent_cmd *c, int argc, char **argv, struct agent_opts *o,
			 bool *go)
{
	int ret = parse(c, argc, argv, o);

	*go = ret == 0;
	if (ret > 0)
		usage(c, stdout);
	return ret > 0 ? 0 : ret < 0 ? 2 : 0;
}

/*
 * The GPU the agent will use, as this process's driver sees it. No driver:
 * one line that says so, and 1 (nothing to measure, not a failure).
 */
static int attach_device(struct attach_where *w)
{
	static const char stand_in[] = "kvarena CUDA driver stand-in";
	struct kva_cuda_device d;
	struct bench_line l;

	if (kva_cuda_device_query(NULL, &d) < 0) {
		char reason[200];

		snprintf(reason, sizeof(reason), "%s", kva_errmsg());
		for (char *c = reason; *c; c++)
			if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
				*c = '\'';
		bench_line_begin(&l, "attach", "attach");
		bench_line_str(&l, "backend", "cuda");
		bench_line_str(&l, "status", "no device");
		bench_line_str(&l, "reason", reason);
		bench_line_print(&l);
		fprintf(stderr, "attach: no GPU: %s\n", reason);
		return 1;
	}
	snprintf(w->device, sizeof(w->device), "%s", d.name);
	for (char *c = w->device; *c; c++)
		if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
			*c = '\'';
	w->driver = strncmp(d.name, stand_in, sizeof(stand_in) - 1) ? "cuda" : "stand-in";
	fprintf(stderr, "attach: GPU %s (%s), driver %s\n", d.name, d.uuid, w->driver);
	return 0;
}

int bench_attach_main(int argc, char **argv)
{
	struct bench_agent ap = { .who = "attach" };
	struct attach_samples s = { 0 };
	struct kva_arena *observer = NULL;
	struct spread connect, attach, round;
	struct attach_where where = { .backend = "host" };
	struct kva_arena_info info;
	struct agent_opts o;
	const char *why = NULL; /* when strerror would not say it */
	const char *extra[12];
	char blocks_arg[16];
	unsigned n = 0;
	bool go;
	int ret = parse_or_exit(&attach_cmd, argc, argv, &o, &go);

	if (!go)
		return ret;
	where.backend = o.backend;
	if (!strcmp(o.backend, "cuda") && attach_device(&where) > 0)
		return 0;
	snprintf(blocks_arg, sizeof(blocks_arg), "%u", o.blocks);
	extra[n++] = "--blocks";
	extra[n++] = blocks_arg;
	extra[n++] = "--backend";
	extra[n++] = o.backend;
	if (o.chunk_bytes) {
		extra[n++] = "--chunk-bytes";
		extra[n++] = o.chunk_bytes;
	}
	if (o.ipc) {
		extra[n++] = "--ipc";
		extra[n++] = o.ipc;
	}
	extra[n] = NULL;
	s.connect_us = calloc(o.samples, sizeof(double));
	s.attach_us = calloc(o.samples, sizeof(double));
	s.round_us = calloc(o.samples, sizeof(double));
	s.parts = calloc(o.samples, sizeof(*s.parts));
	if (!s.connect_us || !s.attach_us || !s.round_us || !s.parts) {
		ret = -ENOMEM;
		goto out;
	}
	if ((ret = bench_agent_start(o.agent, extra, &ap, &observer)) < 0) {
		why = "no agent to measure";
		goto out;
	}
	info = *kva_arena_info(observer);
	where.info = &info;
	fprintf(stderr, "attach: %u warm-up rounds, then %u measured\n", ATTACH_WARMUP, o.samples);
	if ((ret = attach_rounds(&ap, o.samples, &s)) == 0)
		ret = arena_all_free(observer, "attach", "after every worker detached");
	kva_arena_close(observer);
	ret = agent_finish(&ap, ret);
	if (ret < 0)
		goto out;
	connect = spread_of(s.connect_us, o.samples);
	attach = spread_of(s.attach_us, o.samples);
	round = spread_of(s.round_us, o.samples);
	fprintf(stderr, "attach: median %.1f us connect, %.1f us attach, %.1f us attach+detach\n",
		connect.median, attach.median, round.median);
	if ((ret = attach_print("connect_only", o.samples, o.blocks, connect, 0, 0, &where)) == 0 &&
	    (ret = attach_print("attach", o.samples, o.blocks, attach, TARGET_ATTACH_MEDIAN_US,
				connect.median, &where)) == 0 &&
	    (ret = attach_print("attach_detach", o.samples, o.blocks, round,
				TARGET_ATTACH_MEDIAN_US, connect.median, &where)) == 0)
		ret = parts_print(s.parts, o.samples, o.blocks, &where);
out:
	free(s.connect_us);
	free(s.attach_us);
	free(s.round_us);
	free(s.parts);
	if (ret < 0)
		fprintf(stderr, "kvarena-bench attach: failed: %s\n", why ? why : strerror(-ret));
	return ret < 0 ? 1 : 0;
}

/* ------------------------------------------------------------ reclaim-agent */

/*
 * victim_run - the worker the agent reclaims, in a child process: attach,
 * take @hold blocks VICTIM_BATCH at a time, tell the parent the slot (or a
 * -errno) on @fd, and wait to be killed. Never returns.
 */
static void victim_run(const char *socket_path, uint32_t hold, int fd)
{
	uint32_t *ids = malloc((size_t)hold * sizeof(*ids)), n;
	struct kva_worker *w = NULL;
	int ret = -ENOMEM;

	/* it waits to be killed: if the parent dies first, that must still happen */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (!ids || (ret = kva_attach(socket_path, "reclaim-victim", &w)) < 0)
		goto fail;
	for (uint32_t got = 0; got < hold; got += n) {
		n = hold - got < VICTIM_BATCH ? hold - got : VICTIM_BATCH;
		if ((ret = kva_alloc(w, n, ids + got)) < 0)
			goto fail;
	}
	bench_victim_hold(fd, kva_worker_slot(w), "reclaim-agent: victim");
fail:
	bench_victim_hold(fd, ret, "reclaim-agent: victim");
}

/* victim_start - fork a victim and wait until it holds its blocks; its slot goes to @slot. */
static int victim_start(const char *socket_path, uint32_t hold, pid_t *pid, uint32_t *slot)
{
	int32_t answer = -EIO;
	int fds[2], ret;

	if (pipe2(fds, O_CLOEXEC) < 0)
		return -errno;
	fflush(stdout);
	fflush(stderr);
	*pid = fork();
	if (*pid == 0) {
		close(fds[0]);
		victim_run(socket_path, hold, fds[1]);
	}
	ret = *pid < 0 ? -errno : 0;
	close(fds[1]);
	if (ret == 0)
		ret = bench_read_full(fds[0], &answer, sizeof(answer), VICTIM_TIMEOUT_MS);
	close(fds[0]);
	if (ret == 0 && answer < 0)
		ret = answer;
	if (ret < 0) {
		if (*pid > 0) {
			kill(*pid, SIGKILL);
			bench_reap(*pid);
		}
		fprintf(stderr, "reclaim-agent: the victim did not get its %u blocks: %s\n", hold,
			strerror(-ret));
		return ret;
	}
	*slot = (uint32_t)answer;
	return 0;
}

/*
 * reclaim_once - one victim, killed; @ms is SIGKILL until this process reads
 * the victim's slot FREE. Checked before: the slot is the victim's and holds
 * @hold blocks; after: every block of the arena is free and the victim died
 * of the SIGKILL.
 */
static int reclaim_once(struct kva_arena *obs, const char *socket_path, uint32_t hold,
			pid_t *victim, double *ms)
{
	enum kva_slot_state state;
	struct kva_stats st;
	uint64_t t0, t1, spins = 0;
	uint32_t slot = 0;
	int32_t holder = 0;
	int ret, status;
	pid_t pid = 0;

	if ((ret = victim_start(socket_path, hold, &pid, &slot)) < 0)
		return ret;
	*victim = pid;
	if ((ret = kva_arena_slot(obs, slot, &state, NULL, &holder)) < 0 ||
	    (ret = kva_arena_stats(obs, &st)) < 0)
		goto kill;
	if (state != KVA_SLOT_LIVE || holder != pid || st.slots[slot].owned < hold) {
		fprintf(stderr, "reclaim-agent: slot %u is in state %d of pid %d holding %u "
			"blocks, not live of the victim %d holding %u\n", slot, (int)state,
			(int)holder, st.slots[slot].owned, (int)pid, hold);
		ret = -EPROTO;
		goto kill;
	}

	t0 = bench_now_ns();
	kill(pid, SIGKILL);
	/* One load per look. sched_yield: on a small machine the victim's exit
	 * and the agent may need this CPU; it returns at once when they do not. */
	for (;;) {
		kva_arena_slot(obs, slot, &state, NULL, NULL);
		if (state == KVA_SLOT_FREE)
			break;
		if (++spins % 1024 == 0 && bench_now_ns() - t0 > RECLAIM_TIMEOUT_NS) {
			fprintf(stderr, "reclaim-agent: slot %u not free %.0f s after the kill\n",
				slot, RECLAIM_TIMEOUT_NS / 1e9);
			ret = -ETIMEDOUT;
			break;
		}
		sched_yield();
	}
	t1 = bench_now_ns();
	*ms = (double)(t1 - t0) / 1e6;
kill:
	if (ret < 0)
		kill(pid, SIGKILL);
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return ret < 0 ? ret : -errno;
	if (ret < 0)
		return ret;
	if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
		char why[64];

		fprintf(stderr, "reclaim-agent: the victim ended with %s, not SIGKILL\n",
			exit_status(status, why, sizeof(why)));
		return -ECHILD;
	}
	return arena_all_free(obs, "reclaim-agent", "when the victim's slot read FREE");
}

/* What the agent's log says of one victim's reclaim. */
struct agent_reclaim {
	double ms;
	double blocks;
};

/*
 * agent_reclaims - find the agent's log line for each victim in @pid ("worker
 * ... pid P died holding slot S: reclaimed B blocks ... (F freed) in X ms").
 * @r[k] is NaN where none was found. Return: how many were found.
 */
static unsigned agent_reclaims(const char *log, const pid_t *pid, unsigned n,
			       struct agent_reclaim *r)
{
	char line[1024];
	unsigned found = 0;
	FILE *f = fopen(log, "r");

	for (unsigned k = 0; k < n; k++)
		r[k] = (struct agent_reclaim){ NAN, NAN };
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "\" pid "), *q;
		unsigned slot, blocks;
		int who;

		if (!p || sscanf(p, "\" pid %d died holding slot %u: reclaimed %u blocks", &who,
				 &slot, &blocks) != 3 || !(q = strstr(p, "freed) in ")))
			continue;
		for (unsigned k = 0; k < n; k++)
			if (pid[k] == who && isnan(r[k].ms)) {
				r[k] = (struct agent_reclaim){ strtod(q + strlen("freed) in "), NULL),
							       blocks };
				found++;
				break;
			}
	}
	fclose(f);
	return found;
}

struct reclaim_run {
	double *ms;       /* per repetition */
	pid_t *victim;
	struct agent_reclaim *agent;
	double *scratch;
};

static int reclaim_print(const struct agent_opts *o, struct kva_arena *obs, struct reclaim_run *r,
			 bool have_agent)
{
	unsigned n = o->samples;
	struct spread s, agent = { NAN, NAN, NAN }, notice = { NAN, NAN, NAN };
	double returned = NAN;
	struct bench_line l;

	if (have_agent) {
		for (unsigned k = 0; k < n; k++)
			r->scratch[k] = r->ms[k] - r->agent[k].ms;
		notice = spread_of(r->scratch, n);
		for (unsigned k = 0; k < n; k++)
			r->scratch[k] = r->agent[k].blocks;
		returned = bench_median(r->scratch, n);
		for (unsigned k = 0; k < n; k++)
			r->scratch[k] = r->agent[k].ms;
		agent = spread_of(r->scratch, n);
	}
	s = spread_of(r->ms, n);
	fprintf(stderr, "reclaim-agent: median %.3f ms, p99 %.3f ms, max %.3f ms; the agent's "
		"reclaim: median %.3f ms\n", s.median, s.p99, s.max, agent.median);
	bench_line_begin(&l, "reclaim-agent", "sigkill");
	bench_line_num(&l, "samples", n, 0);
	bench_line_num(&l, "blocks", o->blocks, 0);
	bench_line_num(&l, "blocks_held", o->hold, 0);
	bench_line_num(&l, "worker_cache", kva_arena_info(obs)->cache_blocks, 0);
	bench_line_num(&l, "median_ms", s.median, 3);
	bench_line_num(&l, "p99_ms", s.p99, 3);
	bench_line_num(&l, "max_ms", s.max, 3);
	bench_line_num(&l, "target_p99_ms", TARGET_RECLAIM_P99_MS, 0);
	bench_line_num(&l, "agent_reclaim_ms_median", agent.median, 3);
	bench_line_num(&l, "agent_reclaim_ms_max", agent.max, 3);
	bench_line_num(&l, "agent_blocks_returned", returned, 0);
	bench_line_num(&l, "notice_ms_median", notice.median, 3);
	bench_line_num(&l, "notice_ms_max", notice.max, 3);
	return bench_line_print(&l);
}

int bench_reclaim_agent_main(int argc, char **argv)
{
	struct bench_agent ap = { .who = "reclaim-agent" };
	struct kva_arena *observer = NULL;
	struct reclaim_run r = { 0 };
	struct agent_opts o;
	const char *why = NULL; /* when strerror would not say it */
	unsigned found;
	bool go;
	int ret = parse_or_exit(&reclaim_cmd, argc, argv, &o, &go);

	if (!go)
		return ret;
	r.ms = calloc(o.samples, sizeof(*r.ms));
	r.victim = calloc(o.samples, sizeof(*r.victim));
	r.agent = calloc(o.samples, sizeof(*r.agent));
	r.scratch = calloc(o.samples, sizeof(*r.scratch));
	if (!r.ms || !r.victim || !r.agent || !r.scratch) {
		ret = -ENOMEM;
		goto out;
	}
	if ((ret = agent_start(o.agent, o.blocks, &ap, &observer)) < 0) {
		why = "no agent to measure";
		goto out;
	}
	fprintf(stderr, "reclaim-agent: %u repetitions, the victim holds %u of %u blocks\n",
		o.samples, o.hold, o.blocks);
	for (unsigned k = 0; k < o.samples && ret == 0; k++) {
		if ((ret = reclaim_once(observer, ap.socket, o.hold, &r.victim[k], &r.ms[k])) == 0)
			fprintf(stderr, "reclaim-agent: %u: %.3f ms\n", k, r.ms[k]);
	}
	if (ret == 0 && (ret = agent_stop(&ap)) == 0) {
		/* the log is complete once the agent has exited */
		found = agent_reclaims(ap.log, r.victim, o.samples, r.agent);
		if (found != o.samples)
			fprintf(stderr, "reclaim-agent: the agent's log tells %u of %u reclaims: "
				"its figures are left null\n", found, o.samples);
		ret = reclaim_print(&o, observer, &r, found == o.samples);
	}
	kva_arena_close(observer);
	ret = agent_finish(&ap, ret);
out:
	free(r.ms);
	free(r.victim);
	free(r.agent);
	free(r.scratch);
	if (ret < 0)
		fprintf(stderr, "kvarena-bench reclaim-agent: failed: %s\n", why ? why : strerror(-ret));
	return ret < 0 ? 1 : 0;
}
