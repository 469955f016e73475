/* SPDX-License-Identifier: MIT */
/*
 * log.c - one line per event on stderr, with its level. Under systemd (the
 * journal sets JOURNAL_STREAM) the level is given as sd-daemon's "<N>"
 * prefix, so the journal records it as a priority.
 *
 * What goes into a line comes partly from outside (worker names, bytes of
 * shared memory, a peer's message): every byte that is not printable UTF-8
 * is written as \xNN, so nobody can forge a line or break a reader's
 * decoding. A call site that fires more than LOG_BURST times in a second
 * (a flood of connections, a retry) is held to one line a second saying how
 * many lines like it were left out. Thread-safe: the tier thread logs too.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent_pvt.h"
#include "text.h"

int agent_log_level = LOG_INFO;

/*
 * Errors and warnings, counted as they happen (kvarena_agent_log_messages_total):
 * those the log level or the rate limit leave out too, since a flood that
 * the log shows as one line a second is still a flood. Relaxed: a count
 * for the metrics, which order nothing by it; the tier thread counts too.
 */
static _Atomic uint64_t events[LOG_WARN + 1];

uint64_t agent_log_events(int level)
{
	return level >= 0 && level <= LOG_WARN
		       ? atomic_load_explicit(&events[level], memory_order_relaxed)
		       : 0;
}

static void count(int level)
{
	if (level >= 0 && level <= LOG_WARN)
		atomic_fetch_add_explicit(&events[level], 1, memory_order_relaxed);
}

static const char *const names[] = { "error", "warn", "info", "debug" };
static const int sd_prio[] = { 3, 4, 6, 7 }; /* LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */

int agent_log_level_parse(const char *s)
{
	for (int k = 0; k <= LOG_DEBUG; k++)
		if (!strcmp(s, names[k]))
			return k;
	return -1;
}

/* rate limit per call site (its format string) */
struct site {
	const char *fmt;
	uint64_t window;    /* the second it counts in */
	unsigned lines, dropped;
};

static struct site sites[64];
static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;

static bool let_through(const char *fmt, unsigned *dropped_before)
{
	struct timespec ts;
	uint64_t sec;
	struct site *s = NULL;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	sec = (uint64_t)ts.tv_sec;
	*dropped_before = 0;
	for (unsigned k = 0; k < 64 && !s; k++)
		if (sites[k].fmt == fmt || !sites[k].fmt)
			s = &sites[k];
	if (!s) /* more sites than kept: the least recently used one goes */
		for (unsigned k = 0, oldest = 0; k < 64; k++)
			if (sites[k].window <= sites[oldest].window)
				s = &sites[oldest = k];
	if (s->fmt != fmt)
		*s = (struct site){ .fmt = fmt, .window = sec };
	if (s->window != sec) {
		*dropped_before = s->dropped;
		s->window = sec;
		s->lines = s->dropped = 0;
	}
	if (++s->lines > LOG_BURST) {
		s->dropped++;
		return false;
	}
	return true;
}

static void vlog(int level, const char *site, const char *fmt, va_list ap);

/* a line about lines already counted */
static void log_uncounted(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_uncounted(int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, fmt, fmt, ap);
	va_end(ap);
}

/*
 * agent_log_flush - on the clock: a call site whose second is over and that
 * left lines out says how many, even if it logs nothing more (a flood that
 * ended).
 */
void agent_log_flush(void)
{
	struct timespec ts;
	struct { const char *fmt; unsigned dropped; } said[64];
	unsigned n = 0;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	pthread_mutex_lock(&sites_lock);
	for (unsigned k = 0; k < 64; k++) {
		struct site *s = &sites[k];

		if (!s->fmt || !s->dropped || s->window == (uint64_t)ts.tv_sec)
			continue;
		said[n].fmt = s->fmt;
		said[n++].dropped = s->dropped;
		s->dropped = 0;
	}
	pthread_mutex_unlock(&sites_lock);
	for (unsigned k = 0; k < n; k++)
		log_uncounted(LOG_WARN, "%u more lines like \"%.60s\" were left out in the last "
			      "second", said[k].dropped, said[k].fmt);
}

static void vlog(int level, const char *site, const char *fmt, va_list ap)
{
	static int journal = -1;
	char raw[1024], line[1200];
	unsigned dropped;
	bool go;
	int n;

	if (level > agent_log_level)
		return;
	pthread_mutex_lock(&sites_lock);
	go = let_through(site, &dropped);
	if (journal < 0)
		journal = getenv("JOURNAL_STREAM") != NULL;
	pthread_mutex_unlock(&sites_lock);
	if (!go)
		return;
	if (journal) {
		n = snprintf(line, sizeof(line), "<%d>", sd_prio[level]);
	} else {
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		localtime_r(&ts.tv_sec, &tm);
		n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld kvarena-agent[%d] %s: ",
			     tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, (int)getpid(),
			     names[level]);
	}
	vsnprintf(raw, sizeof(raw), fmt, ap);
	text_escape(raw, line + n, sizeof(line) - (size_t)n - 64, false);
	n = (int)strlen(line);
	if (dropped)
		n += snprintf(line + n, sizeof(line) - (size_t)n,
			      " [%u more lines like this one were left out in the last second]",
			      dropped);
	/* one write per line: lines from concurrent writers do not interleave */
	if (n < (int)sizeof(line) - 1)
		line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
}

void agent_log(int level, const char *fmt, ...)
{
	va_list ap;

	count(level);
	va_start(ap, fmt);
	vlog(level, fmt, fmt, ap);
	va_end(ap);
}

void agent_log_at(int level, const char *site, const char *fmt, ...)
{
	va_list ap;

	count(level);
	va_start(ap, fmt);
	vlog(level, site, fmt, ap);
	va_end(ap);
}
