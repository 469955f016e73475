/* SPDX-License-Identifier: MIT */
/*
 * log.c - one line per event on stderr, with its level. Under systemd (the
 * journal sets JOURNAL_STREAM) the level is given as sd-daemon's "<N>"
 * prefix, so the journal records it as a priority.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent_pvt.h"

int agent_log_level = LOG_INFO;

static const char *const names[] = { "error", "warn", "info", "debug" };
static const int sd_prio[] = { 3, 4, 6, 7 }; /* LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */

int agent_log_level_parse(const char *s)
{
	for (int k = 0; k <= LOG_DEBUG; k++)
		if (!strcmp(s, names[k]))
			return k;
	return -1;
}

void agent_log(int level, const char *fmt, ...)
{
	static int journal = -1;
	char line[1024];
	va_list ap;
	int n;

	if (level > agent_log_level)
		return;
	if (journal < 0)
		journal = getenv("JOURNAL_STREAM") != NULL;
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
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* one write per line: lines from concurrent writers do not interleave */
	n = (int)strlen(line);
	if (n < (int)sizeof(line) - 1)
		line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
}
