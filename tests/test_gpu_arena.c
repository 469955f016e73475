/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_arena.c - a GPU arena end to end: kvarena-agent --backend cuda,
 * worker processes (gpu_worker, exec'd) attaching to it, the spill tiers
 * under it, kvarena-ctl over it.
 *
 * Run twice by meson:
 *   --stand-in   over tests/cudastub's libcuda.so.1 (first on the loader
 *                path), strict: every process that loads it exits 87 if it
 *                leaves anything reserved, mapped or unreleased, 88 if it
 *                broke the driver API's contract. The agent runs with
 *                KVA_CUDASTUB_NO_CPU, so a CPU touch of device memory by it
 *                is a crash. Failures are injected (tests the stand-in alone
 *                can do are skipped on a device).
 *   --device     on the machine's own driver: the same checks on a real GPU,
 *                with the CUDA kernels; exit 77 (skipped), saying why, where
 *                there is no driver or no device.
 *
 * usage: test_gpu_arena --stand-in|--device AGENT CTL GPU_WORKER
 */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvarena.h"
#include "kvarena_tiers.h"
#include "testutil.h"

#define STAND_IN "kvarena CUDA driver stand-in"
/* what gpu_worker exits with when kva_attach failed */
#define ATTACH_FAILED 3

static const char *agent_path, *ctl_path, *worker_path;
static bool stand_in;

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ environments */

/* NULL-ended "NAME=value" lists, set in a child before it execs */
struct env {
	const char *set[8];
};

static void env_apply(const struct env *e)
{
	for (int k = 0; e && k < 8 && e->set[k]; k++) {
		char name[64];
		const char *eq = strchr(e->set[k], '=');

		snprintf(name, sizeof(name), "%.*s", (int)(eq - e->set[k]), e->set[k]);
		setenv(name, eq + 1, 1);
	}
}

/* the agent: the stand-in makes device memory untouchable by its CPU */
static void agent_env(void *arg)
{
	if (stand_in)
		setenv("KVA_CUDASTUB_NO_CPU", "1", 1);
	env_apply(arg);
}

/* f32, 32 KiB blocks: the workers check every value exactly */
#define GEOMETRY "--block-tokens", "16", "--layers", "2", "--kv-heads", "2", "--head-dim", "64", \
		 "--dtype", "f32"

static int start_agent(struct tu_agent *ag, const struct env *e, const char *const *extra)
{
	const char *argv[40] = { "--backend", "cuda", GEOMETRY };
	unsigned n = 12;

	for (; extra && *extra && n < 39; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	return tu_agent_start_ex(ag, agent_path, argv, agent_env, (void *)e);
}

static void start(struct tu_agent *ag, const struct env *e, const char *const *extra)
{
	int ret = start_agent(ag, e, extra);

	if (ret < 0)
		fail_msg("kvarena-agent --backend cuda did not start: %s (log %s)", strerror(-ret),
			 ag->log);
}

/* stopped by SIGTERM, and exited 0: under the strict stand-in, nothing left */
static void stop(struct tu_agent *ag)
{
	int status = 0;

	assert_int_equal(tu_agent_stop(ag, SIGTERM, 10000, &status), 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fail_msg("the agent exited with status %#x (87: left device memory behind, 88: broke "
			 "the driver's contract; log %s)", status, ag->log);
	tu_agent_cleanup(ag);
}

/* ------------------------------------------------------------ workers */

struct proc {
	pid_t pid;
	FILE *out;   /* its stdout */
	int in;      /* its stdin */
};

static void spawn(struct proc *p, const struct tu_agent *ag, const struct env *e,
		  rlim_t nofile, const char *const *args)
{
	const char *argv[12] = { worker_path, ag->socket };
	int o[2], i[2];
	unsigned n = 2;

	for (; args && *args && n < 11; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	assert_int_equal(pipe(o), 0);
	assert_int_equal(pipe(i), 0);
	p->pid = tu_fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		dup2(o[1], STDOUT_FILENO);
		dup2(i[0], STDIN_FILENO);
		close(o[0]);
		close(i[1]);
		env_apply(e);
		if (nofile) {
			struct rlimit rl = { nofile, nofile };

			setrlimit(RLIMIT_NOFILE, &rl);
		}
		execv(worker_path, (char *const *)argv);
		_exit(127);
	}
	close(o[1]);
	close(i[0]);
	p->out = fdopen(o[0], "r");
	p->in = i[1];
}

/* its exit status (waitpid's), its last line of output in @line */
static int reap(struct proc *p, char *line, size_t len)
{
	char buf[1024];
	int status = 0;

	if (line)
		line[0] = '\0';
	while (fgets(buf, sizeof(buf), p->out)) {
		size_t n = strnlen(buf, len ? len - 1 : 0);

		if (line) {
			memcpy(line, buf, n);
			line[n] = '\0';
		}
	}
	fclose(p->out);
	close(p->in);
	waitpid(p->pid, &status, 0);
	return status;
}

static void expect_exit(int status, int code, const char *what, const char *line)
{
	if (WIFEXITED(status) && WEXITSTATUS(status) == code)
		return;
	fail_msg("%s: worker status %#x, not exit %d (87: device memory left behind, 88: the "
		 "driver's contract broken); it said: %s", what, status, code, line);
}

/* run a worker to its end; 0 expected */
static void run_worker(const struct tu_agent *ag, const struct env *e, const char *const *args)
{
	struct proc p;
	char l[1024];

	spawn(&p, ag, e, 0, args);
	expect_exit(reap(&p, l, sizeof(l)), 0, args[0], l);
}

/* ------------------------------------------------------------ observers */

static struct kva_arena *observe(const struct tu_agent *ag)
{
	struct kva_arena *a;

	if (kva_observe(ag->socket, &a, NULL) < 0)
		fail_msg("observe: %s", kva_errmsg());
	return a;
}

/* kvarena-ctl check exits 0, and the stats say every block is free */
static void check_clean(const struct tu_agent *ag, uint32_t held_by_agent)
{
	const char *argv[] = { ctl_path, "--socket", ag->socket, "check", NULL };
	char out[4096];
	struct kva_arena *a;
	struct kva_stats st;
	int ret = -1;

	for (int k = 0; k < 300; k++) { /* reclaims are retried: 3 s */
		ret = tu_run(argv, out, sizeof(out));
		a = observe(ag);
		assert_int_equal(kva_arena_stats(a, &st), 0);
		kva_arena_close(a);
		if (ret == 0 && st.free_blocks + st.prefix_cached_blocks + held_by_agent ==
					st.total_blocks)
			return;
		sleep_ms(10);
	}
	fail_msg("kvarena-ctl check exits %d (%s), %u of %u blocks free, %u cached", ret, out,
		 st.free_blocks, st.total_blocks, st.prefix_cached_blocks);
}

static json_object *ctl_json(const struct tu_agent *ag, const char *cmd)
{
	const char *argv[] = { ctl_path, "--socket", ag->socket, "--json", cmd, NULL };
	static char out[65536];
	json_object *o;

	assert_int_equal(tu_run(argv, out, sizeof(out)), 0);
	o = json_tokener_parse(out);
	if (!o)
		fail_msg("kvarena-ctl %s --json printed no JSON: %s", cmd, out);
	return o;
}

static const char *jstr(json_object *o, const char *k)
{
	json_object *v;

	if (!json_object_object_get_ex(o, k, &v))
		fail_msg("no \"%s\" in %s", k, json_object_to_json_string(o));
	return json_object_get_string(v);
}

static int64_t jint(json_object *o, const char *k)
{
	json_object *v;

	if (!json_object_object_get_ex(o, k, &v))
		fail_msg("no \"%s\" in %s", k, json_object_to_json_string(o));
	return json_object_get_int64(v);
}

static void needs_stand_in(void)
{
	if (!stand_in)
		skip(); /* injected failures and a second device: the stand-in's */
}

/* ------------------------------------------------------------ the tests */

/* @workers processes publish their prefixes on the device and read each
 * other's: every value, and a decode over the arena's own pointers */
static void share_on(struct tu_agent *ag, unsigned workers)
{
	struct proc p[8];
	char i[8][4], n[4], line[1024];

	snprintf(n, sizeof(n), "%u", workers);
	for (unsigned k = 0; k < workers; k++) {
		snprintf(i[k], sizeof(i[k]), "%u", k);
		spawn(&p[k], ag, NULL, 0, (const char *[]){ "share", i[k], n, NULL });
	}
	for (unsigned k = 0; k < workers; k++)
		expect_exit(reap(&p[k], line, sizeof(line)), 0, "share", line);
	check_clean(ag, 0);
}

static void share(const char *const *agent_args, unsigned workers)
{
	struct tu_agent ag;

	start(&ag, NULL, agent_args);
	share_on(&ag, workers);
	stop(&ag);
}

static void test_four_workers_share_blocks_on_the_gpu(void **state)
{
	(void)state;
	share((const char *[]){ "--memory", "16M", NULL }, 4);
}

static void test_legacy_ipc_shares_the_same_way(void **state)
{
	struct kva_cuda_device d;

	(void)state;
	if (!stand_in && (kva_cuda_device_query(NULL, &d) < 0 || !d.vmm))
		skip();
	share((const char *[]){ "--memory", "16M", "--ipc", "legacy", NULL }, 3);
}

static void test_a_killed_worker_costs_only_its_blocks(void **state)
{
	struct tu_agent ag;
	struct proc p;
	char line[256];
	int status;

	(void)state;
	start(&ag, NULL, (const char *[]){ "--memory", "8M", NULL });
	for (int round = 0; round < 3; round++) {
		spawn(&p, &ag, NULL, 0, (const char *[]){ "hold", "200", NULL });
		if (!fgets(line, sizeof(line), p.out) || strncmp(line, "held", 4))
			fail_msg("the holder said \"%s\"", line);
		kill(p.pid, SIGKILL);
		status = reap(&p, NULL, 0);
		assert_true(WIFSIGNALED(status));
		check_clean(&ag, 0);
	}
	/* the arena is whole: all of it again, for another process */
	spawn(&p, &ag, NULL, 0, (const char *[]){ "hold", "256", NULL });
	if (!fgets(line, sizeof(line), p.out) || strncmp(line, "held", 4))
		fail_msg("a holder of the whole arena said \"%s\"", line);
	kill(p.pid, SIGKILL);
	reap(&p, NULL, 0);
	check_clean(&ag, 0);
	assert_true(tu_agent_log_count(&ag, "reclaimed") >= 4);
	stop(&ag);
}

static void test_chunks_beyond_one_message(void **state)
{
	struct tu_agent ag;
	struct kva_arena *a;
	struct proc p;
	json_object *o;
	char line[1024];
	uint32_t chunks;

	(void)state;
	/* the stand-in's granularity is 128 KiB here (the meson test's
	 * environment), a real device's 2 MiB: over 253 chunks either way */
	start(&ag, NULL, (const char *[]){ "--memory", stand_in ? "40M" : "640M", "--chunk-bytes",
					   stand_in ? "128K" : "2M", NULL });
	a = observe(&ag);
	chunks = kva_arena_info(a)->chunks;
	kva_arena_close(a);
	if (chunks <= 253)
		fail_msg("%u chunks: not past one message's 253", chunks);
	/* a worker whose descriptor limit is under the chunk count: it holds
	 * one message's fds at a time */
	spawn(&p, &ag, NULL, 253 + 16, (const char *[]){ "attach", "3", NULL });
	expect_exit(reap(&p, line, sizeof(line)), 0, "attach", line);
	o = json_tokener_parse(line);
	assert_non_null(o);
	assert_int_equal(jint(o, "chunks"), chunks);
	assert_int_equal(jint(o, "messages"), (chunks + 252) / 253);
	json_object_put(o);
	share_on(&ag, 2);
	stop(&ag);
}

/* the agent fails to start, exits 1 (not 87 or 88: nothing left), and says @why */
static void agent_refuses(const struct env *e, const char *const *extra, const char *why)
{
	struct tu_agent ag;
	int ret = start_agent(&ag, e, extra);
	int status = 0;

	if (ret != -ECHILD) {
		tu_agent_stop(&ag, SIGKILL, 1000, &status);
		tu_agent_cleanup(&ag);
		fail_msg("the agent started (%d) where it should have said: %s", ret, why);
	}
	if (tu_agent_log_count(&ag, why) == 0) {
		char cmd[256];

		snprintf(cmd, sizeof(cmd), "cat %s >&2", ag.log);
		if (system(cmd)) {
			/* the log was shown, or not: the failure says what matters */
		}
		fail_msg("the agent's log does not say \"%s\"", why);
	}
	tu_agent_cleanup(&ag);
}

static void test_a_device_found_by_uuid_not_ordinal(void **state)
{
	static const struct env two = { { "KVA_CUDASTUB_DEVICES=2" } };
	static const struct env sees_it = { { "KVA_CUDASTUB_DEVICES=2", "CUDA_VISIBLE_DEVICES=1" } };
	static const struct env blind = { { "KVA_CUDASTUB_DEVICES=2", "CUDA_VISIBLE_DEVICES=0" } };
	struct tu_agent ag;
	struct kva_arena *a;
	struct proc p;
	char line[1024];

	(void)state;
	needs_stand_in();
	/* a prefix both devices' UUIDs share names neither */
	agent_refuses(&two, (const char *[]){ "--memory", "8M", "--device", "GPU-6b766173", NULL },
		      "names more than one device");
	/* device 1, named by its UUID */
	start(&ag, &two, (const char *[]){ "--memory", "8M", "--device",
					   "GPU-6b766173-7475-622d-0000-000000000001", NULL });
	a = observe(&ag);
	assert_string_equal(kva_arena_info(a)->device_uuid, "GPU-6b766173-7475-622d-0000-000000000001");
	assert_non_null(strstr(kva_arena_info(a)->device_name, "(device 1)"));
	kva_arena_close(a);
	/* a worker that sees it as its device 0 */
	run_worker(&ag, &sees_it, (const char *[]){ "attach", NULL });
	/* and one that does not see it at all */
	spawn(&p, &ag, &blind, 0, (const char *[]){ "attach", NULL });
	expect_exit(reap(&p, line, sizeof(line)), ATTACH_FAILED, "attach", line);
	if (!strstr(line, "not visible") || !strstr(line, "CUDA_VISIBLE_DEVICES=0"))
		fail_msg("a worker that cannot see the device was told: %s", line);
	check_clean(&ag, 0);
	stop(&ag);
}

static void test_injected_failures_end_in_clear_errors(void **state)
{
	static const struct env oom3 = { { "KVA_CUDASTUB_FAIL=create:3" } };
	static const struct env no_fd = { { "KVA_CUDASTUB_FAIL=export:unsupported" } };
	static const struct env export2 = { { "KVA_CUDASTUB_FAIL=export:2" } };
	static const struct env no_vmm = { { "KVA_CUDASTUB_FAIL=vmm:unsupported" } };
	static const struct env import2 = { { "KVA_CUDASTUB_FAIL=import:2" } };
	static const struct env map1 = { { "KVA_CUDASTUB_FAIL=map:1" } };
	static const struct env ipc_open = { { "KVA_CUDASTUB_FAIL=ipc_open" } };
	static const struct env small = { { "KVA_CUDASTUB_MEMORY=64M" } };
	const char *const chunked[] = { "--memory", "8M", "--chunk-bytes", "1M", NULL };
	struct tu_agent ag;
	struct kva_arena *a;
	struct proc p;
	char line[1024];

	(void)state;
	needs_stand_in();
	/* the agent's side: out of device memory at the third chunk */
	agent_refuses(&oom3, chunked, "cuMemCreate of chunk 2 of 8");
	/* more than the device has */
	agent_refuses(&small, (const char *[]){ "--memory", "100M", NULL }, "GiB free of");
	/* --ipc fd where the device cannot export fds */
	agent_refuses(&no_fd, (const char *[]){ "--memory", "8M", "--ipc", "fd", NULL },
		      "cannot share VMM memory as POSIX fds");

	/* auto: the legacy way, said so, and workers share through it */
	start(&ag, &no_fd, (const char *[]){ "--memory", "8M", NULL });
	a = observe(&ag);
	assert_int_equal(kva_arena_info(a)->ipc, KVA_IPC_LEGACY);
	kva_arena_close(a);
	assert_true(tu_agent_log_count(&ag, "legacy CUDA IPC handle") >= 1);
	run_worker(&ag, NULL, (const char *[]){ "attach", "2", NULL });
	stop(&ag);
	/* the device says it can, the second export says it cannot: undone,
	 * then legacy */
	start(&ag, &export2, chunked);
	a = observe(&ag);
	assert_int_equal(kva_arena_info(a)->ipc, KVA_IPC_LEGACY);
	kva_arena_close(a);
	stop(&ag);
	/* no VMM at all: legacy */
	start(&ag, &no_vmm, (const char *[]){ "--memory", "8M", NULL });
	run_worker(&ag, NULL, (const char *[]){ "attach", NULL });
	stop(&ag);

	/* the workers' side: each failure a clear error, nothing left
	 * behind (the worker exits 3, not 87), the agent unharmed */
	start(&ag, NULL, chunked);
	spawn(&p, &ag, &import2, 0, (const char *[]){ "attach", NULL });
	expect_exit(reap(&p, line, sizeof(line)), ATTACH_FAILED, "attach", line);
	if (!strstr(line, "cuMemImportFromShareableHandle of chunk 1"))
		fail_msg("an import that failed was told: %s", line);
	spawn(&p, &ag, &map1, 0, (const char *[]){ "attach", NULL });
	expect_exit(reap(&p, line, sizeof(line)), ATTACH_FAILED, "attach", line);
	if (!strstr(line, "cuMemMap of chunk 0"))
		fail_msg("a map that failed was told: %s", line);
	run_worker(&ag, NULL, (const char *[]){ "attach", NULL });
	check_clean(&ag, 0);
	stop(&ag);
	start(&ag, NULL, (const char *[]){ "--memory", "8M", "--ipc", "legacy", NULL });
	spawn(&p, &ag, &ipc_open, 0, (const char *[]){ "attach", NULL });
	expect_exit(reap(&p, line, sizeof(line)), ATTACH_FAILED, "attach", line);
	if (!strstr(line, "cuIpcOpenMemHandle"))
		fail_msg("an IPC open that failed was told: %s", line);
	run_worker(&ag, NULL, (const char *[]){ "attach", NULL });
	check_clean(&ag, 0);
	stop(&ag);
}

static void test_memory_fraction_sizes_from_free_memory(void **state)
{
	static const struct env small = { { "KVA_CUDASTUB_MEMORY=256M" } };
	struct tu_agent ag;
	struct kva_arena *a;
	uint64_t data;

	(void)state;
	needs_stand_in();
	start(&ag, &small, (const char *[]){ "--memory-fraction", "0.25", NULL });
	a = observe(&ag);
	data = kva_arena_info(a)->layout.data_bytes;
	kva_arena_close(a);
	/* a quarter of 256 MiB, in whole 32 KiB blocks */
	if (data > (64ull << 20) || data < (64ull << 20) - (64u << 10))
		fail_msg("--memory-fraction 0.25 of 256 MiB made %llu bytes of blocks",
			 (unsigned long long)data);
	stop(&ag);
}

static void test_ctl_status_shows_the_gpu(void **state)
{
	struct tu_agent ag;
	json_object *o;
	char out[4096];
	const char *argv[6];

	(void)state;
	start(&ag, NULL, (const char *[]){ "--memory", "8M", "--chunk-bytes", "2M", NULL });
	o = ctl_json(&ag, "status");
	assert_string_equal(jstr(o, "backend"), "cuda");
	assert_string_equal(jstr(o, "ipc"), "fd");
	assert_int_equal(strncmp(jstr(o, "device_uuid"), "GPU-", 4), 0);
	assert_true(strlen(jstr(o, "device_name")) > 0);
	assert_true(jint(o, "granularity") > 0);
	assert_int_equal(jint(o, "chunk_bytes") % jint(o, "granularity"), 0);
	assert_int_equal(jint(o, "chunks"), (8 << 20) / jint(o, "chunk_bytes"));
	assert_true(jint(o, "device_total_bytes") > 0);
	assert_true(jint(o, "device_free_bytes") > 0);
	assert_true(jint(o, "device_free_bytes") <= jint(o, "device_total_bytes"));
	if (stand_in)
		assert_int_equal(strncmp(jstr(o, "device_name"), STAND_IN, strlen(STAND_IN)), 0);
	json_object_put(o);
	/* and in words */
	argv[0] = ctl_path;
	argv[1] = "--socket";
	argv[2] = ag.socket;
	argv[3] = "status";
	argv[4] = NULL;
	assert_int_equal(tu_run(argv, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "backend  cuda"));
	assert_non_null(strstr(out, "granularity"));
	assert_non_null(strstr(out, "GiB free of"));
	stop(&ag);
}

/* a block's bytes from its key, through kva_block_write / kva_block_read */
static void fill(uint8_t *b, size_t n, const uint64_t key[2])
{
	uint64_t s = key[0] ^ (key[1] * 0x9e3779b97f4a7c15ull) ^ 1;

	for (size_t o = 0; o + 8 <= n; o += 8) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		memcpy(b + o, &s, 8);
	}
}

static const struct kva_seq_opts tier_opts = { .kind = KVA_OWNER_INFERENCE, .model = "gpu-tiers" };

static int32_t *doc(struct kva_worker *w, uint32_t d, uint32_t n, uint64_t (*keys)[2])
{
	uint32_t bt = kva_arena_info(kva_worker_arena(w))->geometry.block_tokens;
	int32_t *tok = malloc(sizeof(*tok) * n * bt);
	uint64_t salt[2];

	assert_non_null(tok);
	for (uint32_t k = 0; k < n * bt; k++)
		tok[k] = (int32_t)((d * 1000003u + k * 7919u) % 90000u);
	kva_prefix_salt(tier_opts.model, NULL, 0, salt);
	for (uint32_t j = 0; j < n; j++)
		kva_prefix_hash(j ? keys[j - 1] : NULL, salt, tok + j * bt, bt, keys[j]);
	return tok;
}

static void publish(struct kva_worker *w, uint32_t d, uint32_t n)
{
	const struct kva_arena_info *info = kva_arena_info(kva_worker_arena(w));
	uint64_t(*keys)[2] = calloc(n, sizeof(*keys));
	int32_t *tok = doc(w, d, n, keys);
	uint8_t *b = malloc(info->layout.block_bytes);
	const uint32_t *ids;
	struct kva_seq *s;
	size_t nb, nt;

	assert_int_equal(kva_seq_open(w, &tier_opts, &s), 0);
	assert_int_equal(kva_seq_reserve(s, (size_t)n * info->geometry.block_tokens), 0);
	kva_seq_block_table(s, &ids, &nb, &nt);
	for (uint32_t j = 0; j < n; j++) {
		fill(b, info->layout.block_bytes, keys[j]);
		assert_int_equal(kva_block_write(w, ids[j], 0, b, info->layout.block_bytes), 0);
	}
	assert_int_equal(kva_seq_append(s, tok, (size_t)n * info->geometry.block_tokens), 0);
	kva_seq_close(s);
	free(b);
	free(tok);
	free(keys);
}

/* match document @d, fetch what is below, check every byte; blocks from
 * (the arena, the host tier, the disk tier) added to @from */
static void fetch(struct kva_worker *w, uint32_t d, uint32_t n, uint32_t from[3])
{
	const struct kva_arena_info *info = kva_arena_info(kva_worker_arena(w));
	uint32_t bt = info->geometry.block_tokens;
	uint64_t(*keys)[2] = calloc(n, sizeof(*keys));
	int32_t *tok = doc(w, d, n, keys);
	uint8_t *want = malloc(info->layout.block_bytes), *got = malloc(info->layout.block_bytes);
	struct kva_fetch_result r = { 0 };
	struct kva_match m;
	const uint32_t *ids;
	struct kva_seq *s;
	size_t nb, nt;

	assert_int_equal(kva_seq_open(w, &tier_opts, &s), 0);
	assert_int_equal(kva_seq_match_tiers(s, tok, (size_t)n * bt, &m), 0);
	from[0] += (uint32_t)(m.tokens / bt);
	if (m.below_tokens) {
		assert_int_equal(kva_seq_fetch_start(s, 0), 0);
		assert_int_equal(kva_seq_fetch_wait(s, 10000, &r), 0);
		from[1] += r.host_blocks;
		from[2] += r.disk_blocks;
	}
	kva_seq_block_table(s, &ids, &nb, &nt);
	if (nt != (size_t)n * bt)
		fail_msg("document %u: %zu tokens of %u after the fetch (%u failed)", d, nt, n * bt,
			 r.failed_blocks);
	for (uint32_t j = 0; j < n; j++) {
		fill(want, info->layout.block_bytes, keys[j]);
		assert_int_equal(kva_block_read(w, ids[j], 0, got, info->layout.block_bytes), 0);
		if (memcmp(want, got, info->layout.block_bytes))
			fail_msg("document %u block %u: not its bytes after the fetch", d, j);
	}
	kva_seq_close(s);
	free(want);
	free(got);
	free(tok);
	free(keys);
}

static void wait_backed(const struct tu_agent *ag, uint64_t n)
{
	uint64_t t0 = now_ms();
	struct kva_tiers_stats st;

	for (;;) {
		struct kva_arena *a = observe(ag);

		kva_arena_tier_stats(a, &st);
		kva_arena_close(a);
		if (st.backed >= n)
			return;
		if (now_ms() - t0 > 10000)
			fail_msg("the agent copied %llu blocks of %llu below in 10 s",
				 (unsigned long long)st.backed, (unsigned long long)n);
		sleep_ms(10);
	}
}

static void test_blocks_spill_from_the_gpu_and_come_back(void **state)
{
	char dir[64] = "/var/tmp/kva-gpu-tiers-XXXXXX", cmd[128];
	struct tu_agent ag;
	struct kva_worker *pub, *get;
	uint32_t from[3] = { 0 };

	(void)state;
	assert_non_null(mkdtemp(dir));
	/* 64 blocks of 32 KiB; a host tier of 24 records, a disk behind it */
	start(&ag, NULL, (const char *[]){ "--blocks", "64", "--host-bytes", "1M", "--disk-dir",
					   dir, "--disk-bytes", "16M", NULL });
	if (kva_attach(ag.socket, "publisher", &pub) < 0 || kva_attach(ag.socket, "fetcher", &get) < 0)
		fail_msg("attach: %s", kva_errmsg());
	for (uint32_t d = 0; d < 6; d++) {
		publish(pub, d, 8);
		wait_backed(&ag, 8 * (d + 1));
		assert_int_equal(tu_evict_all(pub), 0);
	}
	for (uint32_t d = 0; d < 6; d++) {
		fetch(get, d, 8, from);
		assert_int_equal(tu_evict_all(get), 0);
	}
	if (!from[1] || !from[2])
		fail_msg("blocks came back from the arena %u, the host tier %u, the disk tier %u: "
			 "both tiers should have served", from[0], from[1], from[2]);
	assert_int_equal(tu_agent_log_count(&ag, "did not verify"), 0);
	assert_int_equal(tu_agent_log_count(&ag, "GPU copy"), 0);
	kva_detach(pub);
	kva_detach(get);
	check_clean(&ag, 0);
	stop(&ag);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_detach_and_fork_leave_nothing_and_touch_nothing(void **state)
{
	/* the worker's own copies (read, write, a fork's partial block) go
	 * through the driver: with the CPU barred from device memory they
	 * still work */
	static const struct env no_cpu = { { "KVA_CUDASTUB_NO_CPU=1" } };
	struct tu_agent ag;

	(void)state;
	needs_stand_in();
	start(&ag, NULL, (const char *[]){ "--memory", "8M", "--chunk-bytes", "1M", NULL });
	run_worker(&ag, &no_cpu, (const char *[]){ "attach", "20", NULL });
	run_worker(&ag, NULL, (const char *[]){ "fork", NULL });
	check_clean(&ag, 0);
	stop(&ag);
}

static void test_workers_outlive_the_agent(void **state)
{
	struct tu_agent ag;
	struct proc p;
	char line[256];
	int status = 0;

	(void)state;
	start(&ag, NULL, (const char *[]){ "--memory", "8M", "--shutdown-grace", "0.2", NULL });
	spawn(&p, &ag, NULL, 0, (const char *[]){ "outlive", NULL });
	if (!fgets(line, sizeof(line), p.out) || strncmp(line, "attached", 8))
		fail_msg("the worker said \"%s\"", line);
	/* the agent stops while the worker is attached: its exit releases its
	 * own mapping; the worker's keeps the memory */
	assert_int_equal(tu_agent_stop(&ag, SIGTERM, 10000, &status), 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fail_msg("the agent exited with status %#x", status);
	assert_int_equal(write(p.in, "go\n", 3), 3);
	expect_exit(reap(&p, line, sizeof(line)), 0, "outlive", line);
	tu_agent_cleanup(&ag);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_four_workers_share_blocks_on_the_gpu),
		cmocka_unit_test(test_legacy_ipc_shares_the_same_way),
		cmocka_unit_test(test_a_killed_worker_costs_only_its_blocks),
		cmocka_unit_test(test_chunks_beyond_one_message),
		cmocka_unit_test(test_a_device_found_by_uuid_not_ordinal),
		cmocka_unit_test(test_injected_failures_end_in_clear_errors),
		cmocka_unit_test(test_memory_fraction_sizes_from_free_memory),
		cmocka_unit_test(test_ctl_status_shows_the_gpu),
		cmocka_unit_test(test_blocks_spill_from_the_gpu_and_come_back),
		cmocka_unit_test(test_detach_and_fork_leave_nothing_and_touch_nothing),
		cmocka_unit_test(test_workers_outlive_the_agent),
	};
	struct kva_cuda_device d;
	int ret;

	if (argc != 5 || (strcmp(argv[1], "--stand-in") && strcmp(argv[1], "--device"))) {
		fprintf(stderr, "usage: test_gpu_arena --stand-in|--device AGENT CTL GPU_WORKER\n");
		return 2;
	}
	agent_path = argv[2];
	ctl_path = argv[3];
	worker_path = argv[4];
	ret = kva_cuda_device_query(NULL, &d);
	stand_in = ret == 0 && !strncmp(d.name, STAND_IN, strlen(STAND_IN));
	if (!strcmp(argv[1], "--stand-in") && !stand_in) {
		fprintf(stderr, "test_gpu_arena: the driver stand-in is not the driver here (%s): "
			"LD_LIBRARY_PATH must name tests/cudastub first\n",
			ret ? kva_errmsg() : d.name);
		return 1;
	}
	if (!strcmp(argv[1], "--device") && (ret < 0 || stand_in)) {
		printf("SKIP: no GPU to run on: %s\n", ret < 0 ? kva_errmsg() : "the stand-in");
		return 77;
	}
	fprintf(stderr, "device: %s (%s), %.1f GiB\n", d.name, d.uuid,
		(double)d.total_bytes / (1ull << 30));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
