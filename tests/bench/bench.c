/* SPDX-License-Identifier: MIT */
/*
 * bench.c - trials in one or several processes, medians, JSON lines, and
 * the small parsing and I/O helpers the subcommands share.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "kvarena.h"

/* ------------------------------------------------------------ JSON lines */

static void line_add(struct bench_line *l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void line_add(struct bench_line *l, const char *fmt, ...)
{
	size_t room = sizeof(l->buf) - l->len;
	va_list ap;
	int n;

	if (l->overflow)
		return;
	va_start(ap, fmt);
	n = vsnprintf(l->buf + l->len, room, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= room)
		l->overflow = true;
	else
		l->len += (size_t)n;
}

void bench_line_begin(struct bench_line *l, const char *bench, const char *mode)
{
	l->len = 0;
	l->overflow = false;
	line_add(l, "{\"bench\":\"%s\"", bench);
	if (mode)
		line_add(l, ",\"mode\":\"%s\"", mode);
}

void bench_line_num(struct bench_line *l, const char *key, double v, int decimals)
{
	if (isfinite(v))
		line_add(l, ",\"%s\":%.*f", key, decimals, v);
	else
		line_add(l, ",\"%s\":null", key);
}

void bench_line_str(struct bench_line *l, const char *key, const char *v)
{
	line_add(l, ",\"%s\":\"%s\"", key, v);
}

void bench_line_text(struct bench_line *l, const char *key, const char *v)
{
	char esc[512];

	bench_json_escape(v, esc, sizeof(esc));
	line_add(l, ",\"%s\":\"%s\"", key, esc);
}

void bench_line_bool(struct bench_line *l, const char *key, bool v)
{
	line_add(l, ",\"%s\":%s", key, v ? "true" : "false");
}

int bench_line_print(struct bench_line *l)
{
	line_add(l, "}\n");
	if (l->overflow)
		return -ENOBUFS;
	/* flushed per line: a reader of a pipe sees each result as it is made */
	if (fputs(l->buf, stdout) == EOF || fflush(stdout) == EOF)
		return -EIO;
	return 0;
}

/* ----------------------------------------------------------- helpers */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double bench_median(double *v, unsigned n)
{
	if (!n)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double bench_percentile(double *v, unsigned n, double pct)
{
	double rank = ceil(pct / 100.0 * n);

	if (!n)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	return v[rank < 1 ? 0 : rank > n ? n - 1 : (unsigned)rank - 1];
}

int bench_read_full(int fd, void *buf, size_t len, int timeout_ms)
{
	char *p = buf;

	while (len) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		ssize_t n;
		int r = poll(&pfd, 1, timeout_ms);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ETIMEDOUT;
		n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EPIPE;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int bench_reap(pid_t pid)
{
	int status;

	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -ECHILD;
}

static int write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int bench_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int bench_parse_double(const char *s, double lo, double hi, double *out)
{
	double v;
	char *end;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi))
		return -EINVAL;
	*out = v;
	return 0;
}

/* -------------------------------------------------------------- trials */

static int cmp_figure(const void *a, const void *b)
{
	const struct bench_figure *x = a, *y = b;

	return (x->ops_per_s > y->ops_per_s) - (x->ops_per_s < y->ops_per_s);
}

struct bench_figure bench_figure_median(struct bench_figure *f, unsigned n)
{
	struct bench_figure m;

	qsort(f, n, sizeof(*f), cmp_figure);
	m = f[n / 2];
	m.pair_ns_min = f[n - 1].pair_ns;
	m.pair_ns_max = f[0].pair_ns;
	return m;
}

/* trial_figure - one trial of @procs processes, from what each did. */
static struct bench_figure trial_figure(const struct bench_result *r, unsigned procs)
{
	struct bench_figure f = { 0 };

	for (unsigned k = 0; k < procs; k++)
		f.ops_per_s += 1e9 * (double)r[k].pairs / (double)r[k].elapsed_ns;
	/* from the summed rate, not an average of the processes' own times: a
	 * lock that favours one process would make such an average say little */
	f.pair_ns = 1e9 * procs / f.ops_per_s;
	return f;
}

static uint64_t trial_len(const struct bench_plan *p, unsigned t)
{
	return t ? p->trial_ns : p->warmup_ns;
}

static int measure_here(const struct bench_subject *s, const struct bench_plan *p,
			struct bench_figure *out)
{
	struct bench_figure fig[BENCH_MAX_TRIALS];
	void *ctx = NULL;
	int ret;

	if ((ret = s->open(s->arg, 0, &ctx)) < 0)
		return ret;
	for (unsigned t = 0; t <= p->trials; t++) {
		uint64_t start = bench_now_ns();
		struct bench_result r;

		if ((ret = s->trial(ctx, start, start + trial_len(p, t), &r)) < 0) {
			fprintf(stderr, "kvarena-bench: %s: trial failed: %s\n", s->name,
				strerror(-ret));
			break;
		}
		if (t)
			fig[t - 1] = trial_figure(&r, 1);
	}
	s->close(ctx);
	if (ret < 0)
		return ret;
	*out = bench_figure_median(fig, p->trials);
	return 0;
}

/*
 * Messages between the parent and a child of measure_procs(). A child gets
 * one go message per trial on its own pipe (so no child can take another's)
 * and answers on the pipe they all share; each message is far below
 * PIPE_BUF, so the children's writes never interleave.
 */
struct go_msg {
	uint64_t start_ns, end_ns;
};

struct done_msg {
	uint32_t proc;
	int32_t status;           /* the first answer says whether open() worked */
	struct bench_result r;
};

/*
 * child_run - the life of child @proc: open, answer, then one trial per go
 * message until the parent closes the go pipe. Never returns.
 */
static void child_run(const struct bench_subject *s, unsigned proc, int go_fd, int done_fd)
{
	struct done_msg m = { .proc = proc };
	struct go_msg g;
	void *ctx = NULL;

	m.status = s->open(s->arg, proc, &ctx);
	if (write_full(done_fd, &m, sizeof(m)) < 0 || m.status < 0)
		_exit(1);
	while (bench_read_full(go_fd, &g, sizeof(g), -1) == 0) {
		m.status = s->trial(ctx, g.start_ns, g.end_ns, &m.r);
		if (m.status < 0)
			fprintf(stderr, "kvarena-bench: %s, process %u: trial failed: %s\n",
				s->name, proc, strerror(-m.status));
		if (write_full(done_fd, &m, sizeof(m)) < 0 || m.status < 0)
			break;
	}
	s->close(ctx);
	/* _exit: the stdio buffers are the parent's, not ours to flush */
	_exit(m.status < 0 ? 1 : 0);
}

/* Collect one answer from each of @procs children into @msg (indexed by child). */
static int collect(int done_fd, unsigned procs, int timeout_ms, struct done_msg *msg)
{
	for (unsigned k = 0; k < procs; k++) {
		struct done_msg m;
		int ret = bench_read_full(done_fd, &m, sizeof(m), timeout_ms);

		if (ret < 0)
			return ret;
		if (m.proc >= procs)
			return -EPROTO;
		if (m.status < 0)
			return m.status;
		msg[m.proc] = m;
	}
	return 0;
}

static int measure_procs(const struct bench_subject *s, const struct bench_plan *p,
			 unsigned procs, struct bench_figure *out)
{
	struct bench_figure fig[BENCH_MAX_TRIALS];
	struct done_msg msg[BENCH_MAX_PROCS];
	int go[BENCH_MAX_PROCS], done[2], ret = 0;
	pid_t pid[BENCH_MAX_PROCS];
	/* a child that stops answering for this long has hung or died */
	int timeout_ms = (int)(p->trial_ns / 1000000u) + 30000;
	unsigned started = 0;

	if (pipe2(done, O_CLOEXEC) < 0)
		return -errno;
	/* nothing buffered may be written twice by parent and child */
	fflush(stdout);
	fflush(stderr);
	for (; started < procs; started++) {
		int fds[2];

		if (pipe2(fds, O_CLOEXEC) < 0) {
			ret = -errno;
			break;
		}
		pid[started] = fork();
		if (pid[started] < 0) {
			ret = -errno;
			close(fds[0]);
			close(fds[1]);
			break;
		}
		if (pid[started] == 0) {
			/* only the parent may hold a go pipe's write end, so that
			 * closing it ends the child's loop */
			for (unsigned k = 0; k < started; k++)
				close(go[k]);
			close(fds[1]);
			close(done[0]);
			child_run(s, started, fds[0], done[1]);
		}
		close(fds[0]);
		go[started] = fds[1];
	}
	close(done[1]);
	if (ret == 0)
		ret = collect(done[0], procs, timeout_ms, msg);

	for (unsigned t = 0; ret == 0 && t <= p->trials; t++) {
		/* a start far enough ahead for every child to be woken and waiting */
		struct go_msg g = { .start_ns = bench_now_ns() + 2000000u };
		struct bench_result r[BENCH_MAX_PROCS];

		g.end_ns = g.start_ns + trial_len(p, t);
		for (unsigned k = 0; k < procs && ret == 0; k++)
			ret = write_full(go[k], &g, sizeof(g));
		if (ret == 0)
			ret = collect(done[0], procs, timeout_ms, msg);
		if (ret < 0 || !t)
			continue;
		for (unsigned k = 0; k < procs; k++)
			r[k] = msg[k].r;
		fig[t - 1] = trial_figure(r, procs);
	}

	for (unsigned k = 0; k < started; k++)
		close(go[k]);
	close(done[0]);
	for (unsigned k = 0; k < started; k++) {
		if (ret < 0)
			kill(pid[k], SIGKILL); /* it may be stuck: do not wait for it */
		if (bench_reap(pid[k]) < 0 && ret == 0)
			ret = -ECHILD;
	}
	if (ret < 0) {
		fprintf(stderr, "kvarena-bench: %s, %u processes: %s\n", s->name, procs,
			strerror(-ret));
		return ret;
	}
	*out = bench_figure_median(fig, p->trials);
	return 0;
}

int bench_measure(const struct bench_subject *s, const struct bench_plan *p, unsigned procs,
		  struct bench_figure *out)
{
	if (!s || !p || !out || !procs || procs > BENCH_MAX_PROCS || !p->trials ||
	    p->trials > BENCH_MAX_TRIALS)
		return -EINVAL;
	return procs == 1 ? measure_here(s, p, out) : measure_procs(s, p, procs, out);
}

int bench_measure_turns(const struct bench_subject *s, const unsigned *procs, unsigned n,
			const struct bench_plan *p, struct bench_figure *out)
{
	return bench_measure_turns_with(s, procs, n, p, out, NULL, NULL, NULL);
}

int bench_measure_turns_with(const struct bench_subject *s, const unsigned *procs, unsigned n,
			     const struct bench_plan *p, struct bench_figure *out,
			     int (*turn)(void *arg, unsigned t), void *arg,
			     struct bench_figure (*trials)[BENCH_MAX_TRIALS])
{
	struct bench_figure (*fig)[BENCH_MAX_TRIALS];
	struct bench_plan one;
	int ret = 0;

	if (!s || !procs || !p || !out || !p->trials || p->trials > BENCH_MAX_TRIALS)
		return -EINVAL;
	one = (struct bench_plan){ .trials = 1, .trial_ns = p->trial_ns,
				   .warmup_ns = p->warmup_ns };
	fig = calloc(n ? n : 1, sizeof(*fig));
	if (!fig)
		return -ENOMEM;
	for (unsigned t = 0; t < p->trials && ret == 0; t++) {
		if (turn)
			ret = turn(arg, t);
		for (unsigned i = 0; i < n && ret == 0; i++)
			ret = bench_measure(&s[i], &one, procs[i], &fig[i][t]);
	}
	for (unsigned i = 0; i < n && ret == 0; i++) {
		if (trials)
			memcpy(trials[i], fig[i], sizeof(fig[i][0]) * p->trials);
		out[i] = bench_figure_median(fig[i], p->trials);
	}
	free(fig);
	return ret;
}

void bench_victim_hold(int fd, int slot_or_err, const char *who)
{
	int answer = slot_or_err;

	if (slot_or_err < 0)
		fprintf(stderr, "%s: %s (%s)\n", who, strerror(-slot_or_err), kva_errmsg());
	if (write(fd, &answer, sizeof(answer)) != (ssize_t)sizeof(answer))
		_exit(2);
	if (slot_or_err < 0)
		_exit(1);
	for (;;)
		pause();
}
