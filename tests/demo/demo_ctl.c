/* SPDX-License-Identifier: MIT */
/*
 * demo_ctl.c - kvarena-demo's parent runs kvarena-ctl to show the agent's
 * own view of the arena (its map and status), as an operator would see it.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "demo.h"

#define CTL_MAX_ARGS 16
#define CTL_TIMEOUT_MS 10000

int demo_ctl(const char *ctl, const char *socket, ...)
{
	/* execvp() takes char *const[] for history's sake; it writes nothing */
	char *argv[CTL_MAX_ARGS + 4] = { (char *)ctl, "--socket", (char *)socket };
	unsigned argc = 3, waited_ms = 0;
	char what[128] = "";      /* the command, for messages: "map --width 64" */
	const char *arg;
	va_list ap;
	pid_t pid;
	int status;

	va_start(ap, socket);
	while ((arg = va_arg(ap, const char *)) && argc < CTL_MAX_ARGS + 3) {
		size_t used = strlen(what);

		snprintf(what + used, sizeof(what) - used, "%s%s", used ? " " : "", arg);
		argv[argc++] = (char *)arg;
	}
	va_end(ap);
	argv[argc] = NULL;

	/* what the demo printed comes before what kvarena-ctl prints */
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "kvarena-demo: fork for %s: %s\n", ctl, strerror(errno));
		return -1;
	}
	if (pid == 0) {
		/* the demo ignores SIGPIPE, which exec would pass on */
		signal(SIGPIPE, SIG_DFL);
		execvp(ctl, argv);
		fprintf(stderr, "kvarena-demo: running %s: %s\n", ctl, strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &status, WNOHANG) != pid) {
		if (waited_ms++ >= CTL_TIMEOUT_MS) {
			fprintf(stderr, "kvarena-demo: %s %s did not finish in %d s: killed\n", ctl,
				what, CTL_TIMEOUT_MS / 1000);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return -1;
		}
		sleep_ns(1000000);
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	if (WIFEXITED(status))
		fprintf(stderr, "kvarena-demo: %s %s failed (exit status %d)\n", ctl, what,
			WEXITSTATUS(status));
	else
		fprintf(stderr, "kvarena-demo: %s %s died of signal %d\n", ctl, what,
			WTERMSIG(status));
	return -1;
}
