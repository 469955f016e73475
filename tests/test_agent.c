/* SPDX-License-Identifier: MIT */
/*
 * test_agent.c - the real kvarena-agent and kvarena-ctl binaries (their
 * paths are this program's arguments): workers attach over the socket and
 * are SIGKILLed at random moments, the agent reclaims them; refusals (a
 * disallowed uid, a lying pid, malformed and foreign HELLOs, no free slot);
 * reservations never adopted; SIGTERM with workers attached; a stale socket;
 * bad flags; read-only observers; the agent's own death.
 *
 * KVA_TEST_AGENT_KILLS sets the kills of the first test (default 220).
 */
#include <errno.h>
#include <json-c/json.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena_pvt.h"
#include "proto_pvt.h"
#include "testutil.h"

static const char *agent_path, *ctl_path;

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	nanosleep(&ts, NULL);
}

static void start(struct tu_agent *ag, const char *const *args)
{
	int ret = tu_agent_start(ag, agent_path, args);

	if (ret < 0)
		fail_msg("starting %s: %s (its log: %s)", agent_path, strerror(-ret), ag->log);
}

static void stop_cleanly(struct tu_agent *ag)
{
	int status;
	struct stat st;

	assert_int_equal(tu_agent_stop(ag, SIGTERM, 10000, &status), 0);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(stat(ag->socket, &st), -1); /* no socket file left */
	tu_agent_cleanup(ag);
}

static struct kva_arena *observe(const struct tu_agent *ag)
{
	struct kva_arena *a = NULL;

	assert_int_equal(kva_observe(ag->socket, &a, NULL), 0);
	return a;
}

/* wait until no slot names @pid: the agent reclaimed (or released) it */
static bool gone_from_slots(struct kva_arena *a, pid_t pid, int timeout_ms)
{
	for (int waited = 0; waited < timeout_ms; waited += 1) {
		if (tu_slot_of(a, pid) < 0)
			return true;
		sleep_us(1000);
	}
	return false;
}

/* kvarena-ctl --json status, parsed */
static struct json_object *ctl_status(const struct tu_agent *ag)
{
	const char *argv[] = { ctl_path, "--socket", ag->socket, "--json", "status", NULL };
	char out[4096];

	assert_int_equal(tu_run(argv, out, sizeof(out)), 0);
	return json_tokener_parse(out);
}

static int64_t jint(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v))
		fail_msg("no \"%s\" in kvarena-ctl's JSON", key);
	return json_object_get_int64(v);
}

/* ------------------------------------------------------------------------ */

#define WORKERS 4
#define BLOCKS 2048u

struct cell {
	_Atomic uint32_t phase, stop, stopped, attached;
};

struct shared {
	struct tu_board board;
	struct cell cells[WORKERS];
};

static void worker(const char *sock, struct shared *sh, struct cell *c, struct tu_view *view,
		   uint64_t seed, int go_fd)
{
	static const uint32_t caches[] = { 0, 4, 32, 128 };
	struct kva_worker *w;
	struct tu_work t;
	char ch;

	if (kva_attach(sock, "attached", &w) || kva_worker_set_cache(w, caches[seed % 4]))
		_exit(1);
	atomic_store(&c->attached, 1);
	tu_work_init(&t, w, &sh->board, 40, seed);
	t.phase = &c->phase;
	while (!atomic_load(&c->stop))
		tu_work_step(&t);
	tu_view_capture(w, view);
	atomic_store(&c->stopped, 1);
	if (read(go_fd, &ch, 1) != 1)
		_exit(2);
	tu_work_drain(&t);
	tu_work_fini(&t);
	kva_detach(w);
	_exit(0);
}

static void test_attached_workers_sigkilled_at_random_lose_nothing(void **state)
{
	static const char *const args[] = { "--blocks", "2048", "--max-workers", "16",
					     "--check-interval", "0.2", NULL };
	struct tu_agent ag;
	struct kva_arena *a;
	struct shared *sh = tu_shared_alloc(sizeof(*sh));
	size_t vb = tu_view_bytes(BLOCKS);
	uint8_t *views = tu_shared_alloc(vb * WORKERS);
	struct tu_view *vp[WORKERS];
	struct tu_mismatch m;
	struct kva_check_report cr;
	struct json_object *st;
	const char *env = getenv("KVA_TEST_AGENT_KILLS");
	unsigned target = env ? (unsigned)atoi(env) : 220, kills = 0, hist[TU_NPHASE] = { 0 };
	uint64_t rng = 7, seed = 1;
	pid_t pids[WORKERS];
	int go[2], status;
	const char *check[] = { ctl_path, "--socket", NULL, "check", NULL };
	char out[1024];

	(void)state;
	start(&ag, args);
	a = observe(&ag);
	assert_int_equal(pipe(go), 0);
	for (unsigned n = 0; n < WORKERS; n++) {
		vp[n] = (struct tu_view *)(views + n * vb);
		vp[n]->slot = -1;
	}
#define SPAWN(n)                                                                             \
	do {                                                                                 \
		memset(&sh->cells[n], 0, sizeof(sh->cells[n]));                              \
		pids[n] = tu_fork();                                                         \
		assert_true(pids[n] >= 0);                                                   \
		if (pids[n] == 0)                                                            \
			worker(ag.socket, sh, &sh->cells[n], vp[n], seed, go[0]);            \
		seed++;                                                                      \
	} while (0)
	for (unsigned n = 0; n < WORKERS; n++)
		SPAWN(n);

	while (kills < target) {
		unsigned victim = (unsigned)(tu_rand(&rng) % WORKERS);

		sleep_us((long)(tu_rand(&rng) % 3000));
		hist[atomic_load(&sh->cells[victim].phase)]++;
		kill(pids[victim], SIGKILL);
		assert_int_equal(waitpid(pids[victim], &status, 0), pids[victim]);
		assert_true(WIFSIGNALED(status));
		kills++;
		/* the agent, not this test, gives back what it held */
		if (!gone_from_slots(a, pids[victim], 3000))
			fail_msg("kill %u: pid %d's slot was not reclaimed within 3 s", kills,
				 (int)pids[victim]);
		for (unsigned n = 0; n < WORKERS; n++) /* nobody half-way through attaching */
			while (n != victim && !atomic_load(&sh->cells[n].attached)) {
				if (waitpid(pids[n], &status, WNOHANG) == pids[n])
					fail_msg("worker %u died attaching: status %#x (agent log %s)",
						 n, status, ag.log);
				sleep_us(100);
			}
		kva_arena_check(a, &cr);
		if (cr.bad_descriptors || cr.stale_owners || cr.dead_holders)
			fail_msg("after kill %u: %s", kills, kva_errmsg());
		SPAWN(victim);
	}

	for (unsigned n = 0; n < WORKERS; n++)
		atomic_store(&sh->cells[n].stop, 1);
	for (unsigned n = 0; n < WORKERS; n++)
		while (!atomic_load(&sh->cells[n].stopped)) {
			if (waitpid(pids[n], &status, WNOHANG) == pids[n])
				fail_msg("worker %u died: status %#x", n, status);
			sleep_us(100);
		}
	assert_true(tu_views_match(a, vp, WORKERS, &m));
	for (unsigned n = 0; n < WORKERS; n++)
		assert_int_equal(write(go[1], "g", 1), 1);
	for (unsigned n = 0; n < WORKERS; n++) {
		assert_int_equal(waitpid(pids[n], &status, 0), pids[n]);
		assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	assert_int_equal(atomic_load(&sh->board.errors), 0);
	assert_int_equal(atomic_load(&sh->board.unexpected), 0);

	/* as the operator sees it */
	st = ctl_status(&ag);
	assert_non_null(st);
	assert_int_equal(jint(st, "free_blocks"), jint(st, "total_blocks"));
	assert_int_equal(jint(st, "total_blocks"), BLOCKS);
	assert_int_equal(jint(st, "workers"), 0);
	json_object_put(st);
	check[2] = ag.socket;
	assert_int_equal(tu_run(check, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "ok:"));
	fprintf(stderr, "  %u kills; killed while in:", kills);
	for (unsigned p = 0; p < TU_NPHASE; p++)
		fprintf(stderr, " %s %u", tu_phase_name[p], hist[p]);
	fprintf(stderr, "\n  agent log: %u \"died holding\" reclaims, %u reservations taken back\n",
		tu_agent_log_count(&ag, "died holding"), tu_agent_log_count(&ag, "never adopted"));
	assert_true(tu_agent_log_count(&ag, "died holding") > 0);
	kva_arena_close(a);
	stop_cleanly(&ag);
	close(go[0]);
	close(go[1]);
	tu_shared_free(views, vb * WORKERS);
	tu_shared_free(sh, sizeof(*sh));
}

static void test_a_disallowed_uid_is_refused(void **state)
{
	static const char *const args[] = { "--socket-mode", "0666", NULL };
	struct tu_agent ag;
	struct kva_arena *a;
	struct kva_stats st;
	char line[128];
	int p[2], ok = 0, status;
	pid_t pid;

	(void)state;
	start(&ag, args); /* the default policy: the agent's own uid, root here */
	assert_int_equal(pipe(p), 0);
	pid = tu_fork();
	if (pid == 0) {
		struct kva_worker *w;
		int ret;

		if (setgid(65534) || setuid(65534))
			_exit(3);
		ret = kva_attach(ag.socket, "intruder", &w);
		ok = ret == -EACCES && strstr(kva_errmsg(), "not allowed") != NULL;
		_exit(write(p[1], &ok, sizeof(ok)) == sizeof(ok) ? 0 : 4);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(read(p[0], &ok, sizeof(ok)), sizeof(ok));
	assert_int_equal(ok, 1);
	snprintf(line, sizeof(line), "refused pid %d uid 65534", (int)pid);
	assert_int_equal(tu_agent_log_count(&ag, line), 1);
	a = observe(&ag);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.workers, 0); /* no slot was used */
	kva_arena_close(a);
	close(p[0]);
	close(p[1]);
	stop_cleanly(&ag);
}

/* a raw connection: send @m (its own length), read the answer */
static int raw_exchange(const char *sock, const void *m, size_t len, union kva__msg *answer,
			int fds[KVA__MAX_FDS], int *nfds)
{
	char buf[sizeof(union kva__msg)];
	int fd, n;

	assert_int_equal(kva__sock_connect(sock, &fd), 0);
	assert_int_equal(send(fd, m, len, 0), (ssize_t)len);
	n = kva__sock_recv(fd, buf, sizeof(buf), fds, nfds, 3000);
	assert_true(n > 0);
	assert_int_equal(kva__msg_decode(buf, (size_t)n, *nfds, answer), 0);
	return fd;
}

static void test_a_hello_with_a_lying_pid_is_refused(void **state)
{
	struct tu_agent ag;
	union kva__msg m, answer;
	int fds[KVA__MAX_FDS], nfds, fd;

	(void)state;
	start(&ag, NULL);
	kva__msg_init(&m, KVA__MSG_HELLO);
	m.hello.pid = 1; /* not us */
	kva__msg_str(m.hello.name, sizeof(m.hello.name), "liar");
	fd = raw_exchange(ag.socket, &m, m.h.length, &answer, fds, &nfds);
	assert_int_equal(answer.h.type, KVA__MSG_REFUSE);
	assert_int_equal(answer.refuse.reason, KVA__REFUSE_PID_MISMATCH);
	close(fd);
	assert_int_equal(tu_agent_log_count(&ag, "pid does not match the credentials"), 1);
	stop_cleanly(&ag);
}

static void test_malformed_and_foreign_hellos_close_only_their_connection(void **state)
{
	struct tu_agent ag;
	struct kva_worker *w;
	union kva__msg m, answer;
	char junk[5] = "junk";
	uint32_t ids[10];
	int fds[KVA__MAX_FDS], nfds, fd;

	(void)state;
	start(&ag, NULL);
	assert_int_equal(kva_attach(ag.socket, "bystander", &w), 0);

	fd = raw_exchange(ag.socket, junk, sizeof(junk), &answer, fds, &nfds);
	assert_int_equal(answer.refuse.reason, KVA__REFUSE_PROTOCOL);
	close(fd);
	kva__msg_init(&m, KVA__MSG_HELLO);
	m.hello.pid = getpid();
	m.h.version = 7;
	fd = raw_exchange(ag.socket, &m, m.h.length, &answer, fds, &nfds);
	assert_int_equal(answer.refuse.reason, KVA__REFUSE_VERSION);
	assert_int_equal(kva__refusal_errno(answer.refuse.reason), -EPROTONOSUPPORT);
	close(fd);
	kva__msg_init(&m, KVA__MSG_BYE); /* not a HELLO */
	fd = raw_exchange(ag.socket, &m, m.h.length, &answer, fds, &nfds);
	assert_int_equal(answer.refuse.reason, KVA__REFUSE_PROTOCOL);
	close(fd);
	kva__msg_init(&m, KVA__MSG_HELLO); /* trailing bytes */
	m.hello.pid = getpid();
	m.h.length += 4;
	{
		char longer[sizeof(struct kva__hello) + 4] = { 0 };

		memcpy(longer, &m, sizeof(struct kva__hello));
		fd = raw_exchange(ag.socket, longer, sizeof(longer), &answer, fds, &nfds);
	}
	assert_int_equal(answer.refuse.reason, KVA__REFUSE_PROTOCOL);
	close(fd);
	assert_true(tu_agent_log_count(&ag, "trailing bytes") >= 1);

	/* the others were not touched */
	assert_int_equal(kva_worker_poll(w), 0);
	assert_int_equal(kva_alloc(w, 10, ids), 0);
	assert_int_equal(kva_free(w, ids, 10), 0);
	kva_detach(w);
	stop_cleanly(&ag);
}

static void test_no_free_slot_is_eusers_and_a_leaver_makes_room(void **state)
{
	static const char *const args[] = { "--max-workers", "2", NULL };
	struct tu_agent ag;
	struct kva_worker *w[3];

	(void)state;
	start(&ag, args);
	assert_int_equal(kva_attach(ag.socket, "one", &w[0]), 0);
	assert_int_equal(kva_attach(ag.socket, "two", &w[1]), 0);
	assert_int_equal(kva_attach(ag.socket, "three", &w[2]), -EUSERS);
	assert_non_null(strstr(kva_errmsg(), "no free worker slot"));
	kva_detach(w[0]);
	for (int k = 0; k < 100 && kva_attach(ag.socket, "three", &w[2]); k++)
		sleep_us(10000); /* the agent sees the BYE */
	assert_int_equal(kva_worker_slot(w[2]) >= 0, 1);
	kva_detach(w[1]);
	kva_detach(w[2]);
	stop_cleanly(&ag);
}

/*
 * A worker that detaches and attaches again at once: its BYE is queued
 * behind the new HELLO, and the agent must read it before it says the
 * arena is full (-EUSERS) or the process is over its limit (-EDQUOT).
 */
static void test_detach_then_attach_at_once_is_never_refused(void **state)
{
	static const char *const full[] = { "--max-workers", "2", NULL };
	static const char *const limit[] = { "--max-workers", "8", "--max-slots-per-pid", "2",
					      NULL };
	const char *const *args[] = { full, limit };

	(void)state;
	for (int k = 0; k < 2; k++) {
		struct tu_agent ag;
		struct kva_worker *w[2];

		start(&ag, args[k]);
		assert_int_equal(kva_attach(ag.socket, "one", &w[0]), 0);
		assert_int_equal(kva_attach(ag.socket, "two", &w[1]), 0);
		for (int r = 0; r < 300; r++) {
			kva_detach(w[r % 2]);
			if (kva_attach(ag.socket, "again", &w[r % 2]) < 0)
				fail_msg("%s: round %d: %s", k ? "--max-slots-per-pid 2" :
				 "--max-workers 2", r, kva_errmsg());
		}
		kva_detach(w[0]);
		kva_detach(w[1]);
		stop_cleanly(&ag);
	}
}

static void test_a_reservation_never_adopted_is_taken_back(void **state)
{
	struct tu_agent ag;
	struct kva_arena *a;
	union kva__msg m, answer;
	enum kva_slot_state s;
	int fds[KVA__MAX_FDS], nfds, fd, k;

	(void)state;
	start(&ag, NULL);
	a = observe(&ag);
	kva__msg_init(&m, KVA__MSG_HELLO);
	m.hello.pid = getpid();
	kva__msg_str(m.hello.name, sizeof(m.hello.name), "fickle");
	fd = raw_exchange(ag.socket, &m, m.h.length, &answer, fds, &nfds);
	assert_int_equal(answer.h.type, KVA__MSG_WELCOME);
	assert_int_equal(nfds, 2);
	assert_int_equal(kva_arena_slot(a, answer.welcome.slot, &s, NULL, NULL), 0);
	assert_int_equal(s, KVA_SLOT_JOINING);
	close(fds[0]);
	close(fds[1]);
	close(fd); /* leave without adopting */
	for (k = 0; k < 300; k++) {
		kva_arena_slot(a, answer.welcome.slot, &s, NULL, NULL);
		if (s == KVA_SLOT_FREE)
			break;
		sleep_us(10000);
	}
	assert_int_equal(s, KVA_SLOT_FREE);
	/* the agent logs right after it takes the slot back */
	for (k = 0; k < 200 && !tu_agent_log_count(&ag, "never adopted"); k++)
		sleep_us(10000);
	assert_int_equal(tu_agent_log_count(&ag, "never adopted"), 1);
	kva_arena_close(a);
	stop_cleanly(&ag);
}

static void test_sigterm_tells_attached_workers_and_exits_clean(void **state)
{
	static const char *const args[] = { "--shutdown-grace", "5", NULL };
	struct tu_agent ag;
	int p[2], status, results[2];
	pid_t pids[2];

	(void)state;
	start(&ag, args);
	assert_int_equal(pipe(p), 0);
	for (int n = 0; n < 2; n++) {
		pids[n] = tu_fork();
		if (pids[n] == 0) {
			struct kva_worker *w;
			uint32_t ids[64];
			int seen = 0, ret;

			if (kva_attach(ag.socket, "stayer", &w) || kva_alloc(w, 64, ids))
				_exit(1);
			if (write(p[1], "a", 1) != 1)
				_exit(2);
			for (int k = 0; k < 10000 && (ret = kva_worker_poll(w)) == 0; k++)
				sleep_us(1000);
			seen = ret == -ESHUTDOWN;
			/* new blocks are refused while the agent stops; frees work */
			seen += kva_alloc(w, 1000, ids) == -ESHUTDOWN;
			seen += kva_free(w, ids, 64) == 0;
			kva_detach(w);
			_exit(seen == 3 ? 0 : 10 + seen);
		}
	}
	for (int n = 0; n < 2; n++) {
		char c;

		assert_int_equal(read(p[0], &c, 1), 1);
	}
	stop_cleanly(&ag); /* exits 0, socket gone */
	for (int n = 0; n < 2; n++) {
		assert_int_equal(waitpid(pids[n], &status, 0), pids[n]);
		results[n] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	}
	assert_int_equal(results[0], 0);
	assert_int_equal(results[1], 0);
	close(p[0]);
	close(p[1]);
}

static void test_a_stale_socket_is_replaced_and_a_live_one_is_not(void **state)
{
	struct tu_agent ag, second;
	struct stat st;
	struct kva_worker *w;
	char cmd[512];
	int status;

	(void)state;
	start(&ag, NULL);
	/* another agent on the same live socket refuses to start */
	snprintf(cmd, sizeof(cmd), "%s --socket %s 2>/dev/null", agent_path, ag.socket);
	assert_int_not_equal(system(cmd), 0);
	assert_int_equal(tu_agent_stop(&ag, SIGKILL, 2000, &status), 0);
	assert_int_equal(stat(ag.socket, &st), 0); /* a dead agent's socket file */
	second = ag;
	{
		const char *argv[] = { agent_path, "--socket", ag.socket, NULL };

		second.pid = tu_fork();
		if (second.pid == 0) {
			execv(agent_path, (char *const *)argv);
			_exit(127);
		}
	}
	for (int k = 0; k < 300 && kva_attach(ag.socket, "after", &w); k++)
		sleep_us(10000);
	assert_int_equal(kva_worker_slot(w), 0);
	kva_detach(w);
	stop_cleanly(&second);
}

static void test_bad_flags_are_refused_by_name(void **state)
{
	static const struct {
		const char *flags, *says;
	} cases[] = {
		{ "--blocks 0", "--blocks" },
		{ "--blocks many", "--blocks" },
		{ "--dtype f64", "--dtype" },
		{ "--layout diagonal", "--layout" },
		{ "--memory 12Q", "--memory" },
		{ "--backend tpu", "host or cuda" },
		{ "--device 0", "are for --backend cuda" },
		{ "--ipc fd", "are for --backend cuda" },
		{ "--backend cuda --memory-fraction 1.5", "--memory-fraction" },
		{ "--backend cuda --memory-fraction nan", "--memory-fraction" },
		{ "--backend cuda --ipc carrier", "--ipc" },
		{ "--backend cuda --hugepages", "--hugepages" },
		{ "--backend cuda --chunk-bytes 0", "--chunk-bytes" },
		{ "--max-workers 49", "--max-workers" },
		{ "--socket-mode 999", "--socket-mode" },
		{ "--allow-uid nosuchuser", "no such user" },
		{ "--no-such-flag", "unknown flag" },
		{ "--head-dim 0", "--head-dim" },
	};
	char dir[] = "/tmp/kva-cfg-XXXXXX", path[64], cmd[512], out[1024];
	FILE *f;

	(void)state;
	for (unsigned k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		FILE *p;
		size_t n;
		int status;

		snprintf(cmd, sizeof(cmd), "%s --socket /tmp/kva-never.sock %s 2>&1", agent_path,
			 cases[k].flags);
		p = popen(cmd, "r");
		n = fread(out, 1, sizeof(out) - 1, p);
		out[n] = '\0';
		status = pclose(p);
		if (WEXITSTATUS(status) != 2 || !strstr(out, cases[k].says))
			fail_msg("%s: exit %d, said \"%s\"", cases[k].flags, WEXITSTATUS(status), out);
	}
	/* a GPU arena where there is no driver: refused at start, and why */
	{
		struct kva_cuda_device d;

		if (kva_cuda_device_query(NULL, &d) < 0) {
			FILE *p;
			size_t n;
			int status;

			snprintf(cmd, sizeof(cmd), "%s --socket /tmp/kva-never.sock --backend cuda "
				 "2>&1", agent_path);
			p = popen(cmd, "r");
			n = fread(out, 1, sizeof(out) - 1, p);
			out[n] = '\0';
			status = pclose(p);
			if (WEXITSTATUS(status) != 1 || !strstr(out, "--backend cuda: cuda:"))
				fail_msg("--backend cuda without a driver: exit %d, said \"%s\"",
					 WEXITSTATUS(status), out);
		}
	}
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/agent.conf", dir);
	f = fopen(path, "w");
	fprintf(f, "# a comment\nblocks = 64\n\ncolour = blue\n");
	fclose(f);
	snprintf(cmd, sizeof(cmd), "%s --config %s 2>&1", agent_path, path);
	{
		FILE *p = popen(cmd, "r");
		size_t n = fread(out, 1, sizeof(out) - 1, p);

		out[n] = '\0';
		assert_int_equal(WEXITSTATUS(pclose(p)), 2);
		assert_non_null(strstr(out, ":4: unknown key \"colour\""));
	}
	unlink(path);
	rmdir(dir);
	snprintf(cmd, sizeof(cmd), "%s --help | grep -q -- --numa-node", agent_path);
	assert_int_equal(system(cmd), 0);
}

static void test_a_config_file_sets_the_same_keys(void **state)
{
	struct tu_agent ag;
	struct kva_arena *a;
	char conf[160];
	const char *args[] = { "--config", conf, NULL };
	FILE *f;

	(void)state;
	snprintf(conf, sizeof(conf), "/tmp/kva-conf-%d.conf", (int)getpid());
	f = fopen(conf, "w");
	fprintf(f, "blocks = 300\nlayers = 2\ndtype = bf16\nname = fromfile\nhugepages = false\n");
	fclose(f);
	start(&ag, args);
	a = observe(&ag);
	assert_int_equal(kva_arena_info(a)->blocks, 300);
	assert_int_equal(kva_arena_info(a)->geometry.layers, 2);
	assert_int_equal(kva_arena_info(a)->geometry.dtype, KVA_BF16);
	assert_string_equal(kva_arena_info(a)->name, "fromfile");
	kva_arena_close(a);
	unlink(conf);
	stop_cleanly(&ag);
}

static void test_observers_are_read_only(void **state)
{
	struct tu_agent ag;
	struct kva_arena *a;
	struct kva_worker *w;
	struct kva_agent_info info;
	uint32_t slot, gen;

	(void)state;
	start(&ag, NULL);
	assert_int_equal(kva_observe(ag.socket, &a, &info), 0);
	assert_int_equal(info.pid, ag.pid);
	assert_int_equal(kva_worker_join(a, "sneaky", &w), -EROFS);
	assert_int_equal(kva_arena_reserve_slot(a, getpid(), &slot, &gen), -EROFS);
	assert_int_equal(kva_arena_reclaim(a, 0, NULL), -EROFS);
	assert_int_equal(kva_arena_agent(a, NULL), KVA_AGENT_RUNNING);
	assert_int_equal(kva_arena_check(a, NULL), 0);
	kva_arena_close(a);
	stop_cleanly(&ag);
}

static void test_workers_keep_working_when_the_agent_dies(void **state)
{
	struct tu_agent ag;
	struct kva_worker *w;
	uint32_t ids[100];
	int status;

	(void)state;
	start(&ag, NULL);
	assert_int_equal(kva_attach(ag.socket, "survivor", &w), 0);
	assert_int_equal(kva_alloc(w, 50, ids), 0);
	assert_int_equal(tu_agent_stop(&ag, SIGKILL, 2000, &status), 0);
	assert_int_equal(kva_worker_poll(w), -ECONNRESET);
	assert_int_equal(kva_alloc(w, 50, ids + 50), 0);
	assert_int_equal(kva_share(w, ids, 10), 0);
	assert_int_equal(kva_free(w, ids, 100), 0);
	assert_int_equal(kva_free(w, ids, 10), 0);
	kva_detach(w);
	tu_agent_cleanup(&ag);
}

static void test_corrupt_shared_memory_is_logged_and_skipped(void **state)
{
	static const char *const args[] = { "--blocks", "1000", "--check-interval", "0.1", NULL };
	struct tu_agent ag;
	struct kva_worker *w;
	struct kva_arena *a;
	uint64_t saved[4], saved_l0;
	uint32_t ids[4];
	int p[2], status;
	pid_t victim;
	char c;

	(void)state;
	start(&ag, args);
	assert_int_equal(kva_attach(ag.socket, "scribbler", &w), 0);
	assert_int_equal(pipe(p), 0);
	victim = tu_fork();
	if (victim == 0) {
		struct kva_worker *v;
		uint32_t mine[64];

		if (kva_attach(ag.socket, "victim", &v) || kva_alloc(v, 64, mine) ||
		    kva_share(v, mine, 8) || write(p[1], "r", 1) != 1)
			_exit(1);
		pause();
	}
	assert_int_equal(read(p[0], &c, 1), 1);
	assert_int_equal(kva_alloc(w, 4, ids), 0);
	/* four words no writer of the arena ever stores, over our own blocks;
	 * and hint bits past the end of the arena */
	a = w->arena;
	for (int k = 0; k < 4; k++)
		saved[k] = atomic_load(&a->desc[ids[k]]);
	atomic_store(&a->desc[ids[0]], 3ull << 62);                            /* no such kind */
	atomic_store(&a->desc[ids[1]], kva__d_make(KVA__D_OWNED, 0, 200));     /* slot 200 */
	atomic_store(&a->desc[ids[2]], kva__d_make(KVA__D_SHARED, 0, 1ull << 47)); /* slot 47 of 48 unused */
	atomic_store(&a->desc[ids[3]], kva__d_make(KVA__D_SHARED, 0, 0) | (1ull << 60)); /* flags */
	saved_l0 = atomic_load(&a->l0[a->l0_words - 1]);
	atomic_fetch_or(&a->l0[a->l0_words - 1], ~0ull);
	/* a reclaim sweeps over them; a check reads them */
	kill(victim, SIGKILL);
	assert_int_equal(waitpid(victim, &status, 0), victim);
	{
		struct kva_arena *o = observe(&ag);

		assert_true(gone_from_slots(o, victim, 3000));
		kva_arena_close(o);
	}
	for (int k = 0; k < 300 && !tu_agent_log_count(&ag, "corrupt descriptors"); k++)
		sleep_us(10000);
	assert_true(tu_agent_log_count(&ag, "corrupt descriptors") >= 1);
	assert_int_equal(tu_agent_log_count(&ag, "died holding slot"), 1);
	/* the agent is alive and serving */
	{
		struct kva_worker *x;

		assert_int_equal(kva_attach(ag.socket, "after", &x), 0);
		kva_detach(x);
	}
	for (int k = 0; k < 4; k++)
		atomic_store(&a->desc[ids[k]], saved[k]);
	atomic_store(&a->l0[a->l0_words - 1], saved_l0);
	assert_int_equal(kva_free(w, ids, 4), 0);
	assert_int_equal(kva_arena_check(a, NULL), 0);
	kva_detach(w);
	close(p[0]);
	close(p[1]);
	stop_cleanly(&ag);
}

static void test_systemd_is_told_ready_and_stopping(void **state)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct tu_agent ag;
	char buf[512], got[1024] = "";
	int fd;

	(void)state;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "/tmp/kva-notify-%d", (int)getpid());
	unlink(sa.sun_path);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setenv("NOTIFY_SOCKET", sa.sun_path, 1);
	start(&ag, NULL);
	unsetenv("NOTIFY_SOCKET");
	stop_cleanly(&ag);
	for (;;) { /* everything the agent said, in order */
		ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);

		if (n <= 0)
			break;
		buf[n] = '\0';
		strncat(got, buf, sizeof(got) - strlen(got) - 2);
		strcat(got, "|");
	}
	close(fd);
	unlink(sa.sun_path);
	assert_non_null(strstr(got, "READY=1"));
	assert_non_null(strstr(got, "STOPPING=1"));
	assert_true(strstr(got, "READY=1") < strstr(got, "STOPPING=1"));
}

/* the prefix cache through the agent: flags, kvarena-ctl prefix / seqs / status */
static void test_prefix_cache_flags_and_ctl(void **state)
{
	static const char *const args[] = { "--blocks", "64", "--evict-policy", "clock",
					     "--cache-limit", "8", "--quota-inference", "40",
					     "--tenant-quota", "7:20", NULL };
	struct kva_seq_opts o = { .kind = KVA_OWNER_INFERENCE, .model = "m", .tenant = 7 };
	struct json_object *j, *v, *q;
	struct tu_agent ag;
	struct kva_worker *w;
	struct kva_seq *s, *s2;
	int32_t tok[12 * 16];
	size_t m;
	char out[8192];
	const char *prefix[] = { ctl_path, "--socket", NULL, "--json", "prefix", NULL };
	const char *seqs[] = { ctl_path, "--socket", NULL, "--json", "seqs", NULL };

	(void)state;
	start(&ag, args);
	prefix[2] = seqs[2] = ag.socket;
	assert_int_equal(kva_attach(ag.socket, "engine", &w), 0);
	for (int i = 0; i < 12 * 16; i++)
		tok[i] = i * 3 + 1;
	/* tenant 7 may hold 20 blocks */
	assert_int_equal(kva_seq_open(w, &o, &s), 0);
	assert_int_equal(kva_seq_reserve(s, 21 * 16), -EDQUOT);
	/* 12 full blocks; the cache limit keeps 8 of them published */
	assert_int_equal(kva_seq_append(s, tok, 12 * 16), 0);
	assert_int_equal(tu_run(seqs, out, sizeof(out)), 0);
	j = json_tokener_parse(out);
	assert_non_null(j);
	assert_int_equal(jint(j, "open_seqs"), 1);
	assert_int_equal(jint(j, "inference"), 12);
	json_object_put(j);
	kva_seq_close(s);
	assert_int_equal(kva_seq_open(w, &o, &s2), 0);
	assert_int_equal(kva_seq_match(s2, tok, 12 * 16, &m), 0);
	assert_int_equal(m, 8 * 16);
	kva_seq_close(s2);

	assert_int_equal(tu_run(prefix, out, sizeof(out)), 0);
	j = json_tokener_parse(out);
	assert_non_null(j);
	assert_int_equal(json_object_object_get_ex(j, "policy", &v), 1);
	assert_string_equal(json_object_get_string(v), "clock");
	assert_int_equal(jint(j, "published"), 8);
	assert_int_equal(jint(j, "index_full"), 4);
	assert_int_equal(jint(j, "hits"), 8);
	assert_int_equal(jint(j, "misses"), 4);
	assert_int_equal(jint(j, "cached_blocks"), 8);
	assert_int_equal(json_object_object_get_ex(j, "quotas", &q), 1);
	assert_int_equal(jint(q, "inference"), 40);
	json_object_put(j);
	j = ctl_status(&ag);
	assert_int_equal(jint(j, "prefix_hits"), 8);
	assert_int_equal(jint(j, "prefix_misses"), 4);
	assert_int_equal(jint(j, "prefix_cached_blocks"), 8);
	assert_int_equal(jint(j, "evictions"), 0);
	json_object_put(j);
	kva_detach(w);
	stop_cleanly(&ag);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attached_workers_sigkilled_at_random_lose_nothing),
		cmocka_unit_test(test_a_disallowed_uid_is_refused),
		cmocka_unit_test(test_a_hello_with_a_lying_pid_is_refused),
		cmocka_unit_test(test_malformed_and_foreign_hellos_close_only_their_connection),
		cmocka_unit_test(test_no_free_slot_is_eusers_and_a_leaver_makes_room),
		cmocka_unit_test(test_detach_then_attach_at_once_is_never_refused),
		cmocka_unit_test(test_a_reservation_never_adopted_is_taken_back),
		cmocka_unit_test(test_sigterm_tells_attached_workers_and_exits_clean),
		cmocka_unit_test(test_a_stale_socket_is_replaced_and_a_live_one_is_not),
		cmocka_unit_test(test_bad_flags_are_refused_by_name),
		cmocka_unit_test(test_a_config_file_sets_the_same_keys),
		cmocka_unit_test(test_observers_are_read_only),
		cmocka_unit_test(test_prefix_cache_flags_and_ctl),
		cmocka_unit_test(test_workers_keep_working_when_the_agent_dies),
		cmocka_unit_test(test_corrupt_shared_memory_is_logged_and_skipped),
		cmocka_unit_test(test_systemd_is_told_ready_and_stopping),
	};

	if (argc != 3) {
		fprintf(stderr, "usage: test_agent KVARENA-AGENT KVARENA-CTL\n");
		return 2;
	}
	agent_path = argv[1];
	ctl_path = argv[2];
	return cmocka_run_group_tests_name("agent", tests, NULL, NULL);
}
