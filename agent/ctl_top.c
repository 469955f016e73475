/* SPDX-License-Identifier: MIT */
/*
 * ctl_top.c - kvarena-ctl top: the arena live, refreshed every --interval
 * seconds until q, a signal or --iterations. On a terminal, a screen in the
 * manner of top(1): the arena and its agent, blocks by state with a bar,
 * the prefix cache's hit ratio and rates, the tiers, a table of workers;
 * drawn on the alternate screen, fitted to the window, the terminal put
 * back as it was on every way out (q, ^C, SIGTERM, SIGHUP, ^Z, a crash).
 * Anywhere else (a pipe, a file), one plain line per refresh with no escape
 * sequence, or one JSON object per line with --json.
 *
 * Between refreshes it sleeps in ppoll() (the signals it handles are
 * blocked outside it, so none is lost between a check and the sleep), and
 * a refresh is a few passes over the descriptors: its CPU use is that of
 * kvarena-ctl status once per interval.
 */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "ctl_pvt.h"

/* One look at the arena. */
struct sample {
	double t;                  /* CLOCK_MONOTONIC, seconds */
	struct timespec wall;
	struct kva_stats st;
	struct kva_prefix_stats ps;
	struct kva_seq_slot_stats seq[KVA_MAX_WORKERS];
	struct kva_tiers_stats ts;
	struct kva_agent_report ar;
	enum kva_agent_state as;
	bool agent_alive;
	double agent_up;           /* seconds the agent process has run, < 0 unknown */
	struct ctl_census cs;
};

/* What changed between two looks, per second. */
struct rates {
	bool valid;                /* there was a look before this one */
	double dt;
	double hits, misses, published, evictions, refills, flushes, shares, ended;
	double ratio_now;          /* hits / (hits + misses) of the interval, < 0: no match */
	double tier_hits[KVA_TIERS], tier_in[KVA_TIERS], tier_out[KVA_TIERS];
	double fetched, backed;
	struct {
		bool valid;
		double hits, misses, published, evictions;
	} slot[KVA_MAX_WORKERS];
};

struct top {
	struct ctl *c;
	bool screen;               /* drawing on a terminal */
	bool alternate;            /* on its alternate screen (until q: with
				    * --iterations the last frame stays) */
	bool keys;                 /* reading keys from one */
	bool color;
	int cols, rows;
	int lines;                 /* lines of the frame being built */
	struct termios saved;
	bool termios_saved;
	char *frame;               /* the frame being built */
	size_t len, cap;
};

/* ------------------------------------------------------- the terminal */

static volatile sig_atomic_t got_quit, got_winch, got_tstp, got_cont;
/* for the crash handler: what puts the terminal back, set before
 * tty_active says it is needed */
static const char *tty_leave;
static size_t tty_leave_len;
static bool tty_termios;
static struct termios tty_saved;
static volatile sig_atomic_t tty_active;

/* the alternate screen (or not), the cursor hidden, cleared */
#define ENTER_ALT "\033[?1049h\033[?25l\033[H\033[2J"
#define ENTER_MAIN "\033[?25l\033[H\033[2J"
/* colors off, the cursor back, the screen as it was (or the last frame
 * left, the prompt below it) */
#define LEAVE_ALT "\033[0m\033[?25h\033[?1049l"
#define LEAVE_MAIN "\033[0m\033[?25h\n"

static void on_signal(int sig)
{
	if (sig == SIGWINCH)
		got_winch = 1;
	else if (sig == SIGTSTP)
		got_tstp = 1;
	else if (sig == SIGCONT)
		got_cont = 1;
	else
		got_quit = 1;
}

/* A crash must not leave the terminal without echo on the alternate
 * screen: put it back (write and tcsetattr are async-signal-safe), then
 * die of the same signal (SA_RESETHAND made the action the default). */
static void on_crash(int sig)
{
	if (tty_active) {
		ssize_t r = write(STDOUT_FILENO, tty_leave, tty_leave_len);

		(void)r;
		if (tty_termios)
			tcsetattr(STDIN_FILENO, TCSANOW, &tty_saved);
	}
	raise(sig);
}

static void window_size(struct top *t)
{
	struct winsize ws;

	t->cols = 80;
	t->rows = 24;
	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row) {
		t->cols = ws.ws_col;
		t->rows = ws.ws_row;
	}
	if (t->cols > 512)
		t->cols = 512;
}

static void write_all(const char *s, size_t n)
{
	while (n) {
		ssize_t w = write(STDOUT_FILENO, s, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

static void screen_enter(struct top *t)
{
	t->termios_saved = false;
	if (t->keys && tcgetattr(STDIN_FILENO, &t->saved) == 0) {
		struct termios raw = t->saved;

		/* keys one at a time and unechoed; ^C and ^Z still signals */
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		raw.c_cc[VMIN] = 0;
		raw.c_cc[VTIME] = 0;
		t->termios_saved = true;
		tty_saved = t->saved;
		tcsetattr(STDIN_FILENO, TCSANOW, &raw);
	}
	tty_termios = t->termios_saved;
	tty_leave = t->alternate ? LEAVE_ALT : LEAVE_MAIN;
	tty_leave_len = strlen(tty_leave);
	tty_active = 1;
	if (t->alternate)
		write_all(ENTER_ALT, sizeof(ENTER_ALT) - 1);
	else
		write_all(ENTER_MAIN, sizeof(ENTER_MAIN) - 1);
}

static void screen_leave(struct top *t)
{
	if (!tty_active)
		return;
	tty_active = 0;
	write_all(tty_leave, tty_leave_len);
	if (t->termios_saved)
		tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
}

/* --------------------------------------------------------- a sample */

static double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* how long process @pid has run (its start time in /proc against the
 * system's uptime), or -1 */
static double process_age(int32_t pid)
{
	char path[64], buf[1024];
	unsigned long long start = 0;
	double up = 0;
	const char *p;
	ssize_t n;
	FILE *f;
	int fd;

	if (pid <= 0)
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	/* the command name may hold anything, ')' included: fields start
	 * after the last one; starttime is the 20th of them */
	if (!(p = strrchr(buf, ')')))
		return -1;
	p++;
	for (int field = 0; field < 19 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p, " %llu", &start) != 1)
		return -1;
	if (!(f = fopen("/proc/uptime", "re")))
		return -1;
	if (fscanf(f, "%lf", &up) != 1)
		up = -1;
	fclose(f);
	if (up < 0)
		return -1;
	up -= (double)start / (double)sysconf(_SC_CLK_TCK);
	return up < 0 ? 0 : up;
}

static int take_sample(struct top *t, struct sample *s)
{
	struct kva_arena *a = t->c->a;
	int32_t pid = t->c->agent.pid;
	int ret;

	memset(s, 0, sizeof(*s));
	s->t = mono_now();
	clock_gettime(CLOCK_REALTIME, &s->wall);
	if ((ret = kva_arena_stats(a, &s->st)) < 0 || (ret = kva_arena_prefix_stats(a, &s->ps)) < 0 ||
	    (ret = kva_arena_tier_stats(a, &s->ts)) < 0 ||
	    (ret = kva_arena_agent_report(a, &s->ar)) < 0 || (ret = ctl_census(a, &s->cs)) < 0)
		return ret;
	for (uint32_t k = 0; k < s->st.max_workers; k++)
		if (s->st.slots[k].state != KVA_SLOT_FREE)
			kva_arena_seq_stats(a, k, &s->seq[k]);
	s->as = kva_arena_agent(a, NULL);
	/* the pid the agent gave us over its socket, not one from shared
	 * memory: kill(0 or -1, 0) would ask about whole process groups */
	s->agent_alive = pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
	s->agent_up = s->agent_alive ? process_age(pid) : -1;
	return 0;
}

/* a counter's growth per second; a counter that went back (a slot's moved
 * to the totals of slots gone, between two reads) counts as none */
static double per_s(uint64_t now, uint64_t before, double dt)
{
	return now > before ? (double)(now - before) / dt : 0.0;
}

static void compute_rates(const struct sample *prev, const struct sample *cur, struct rates *r)
{
	double dt = cur->t - prev->t;
	uint64_t dh, dm;

	memset(r, 0, sizeof(*r));
	if (dt <= 0)
		return;
	r->valid = true;
	r->dt = dt;
	r->hits = per_s(cur->ps.hits, prev->ps.hits, dt);
	r->misses = per_s(cur->ps.misses, prev->ps.misses, dt);
	r->published = per_s(cur->ps.published, prev->ps.published, dt);
	r->evictions = per_s(cur->ps.evictions, prev->ps.evictions, dt);
	dh = cur->ps.hits > prev->ps.hits ? cur->ps.hits - prev->ps.hits : 0;
	dm = cur->ps.misses > prev->ps.misses ? cur->ps.misses - prev->ps.misses : 0;
	r->ratio_now = dh + dm ? (double)dh / (double)(dh + dm) : -1;
	for (uint32_t k = 0; k < KVA_MAX_WORKERS; k++) {
		const struct kva_slot_stats *p = &prev->st.slots[k], *c = &cur->st.slots[k];
		/* the same life of the slot: its counters went on; a new life
		 * started from zero within the interval */
		bool same = p->state != KVA_SLOT_FREE && c->state != KVA_SLOT_FREE &&
			    p->generation == c->generation;

		if (p->state != KVA_SLOT_FREE && !same)
			r->ended += 1;
		if (c->state == KVA_SLOT_FREE)
			continue;
		r->refills += per_s(c->refills, same ? p->refills : 0, dt);
		r->flushes += per_s(c->flushes, same ? p->flushes : 0, dt);
		r->shares += per_s(c->shares, same ? p->shares : 0, dt);
		r->slot[k].valid = true;
		r->slot[k].hits = per_s(cur->seq[k].hits, same ? prev->seq[k].hits : 0, dt);
		r->slot[k].misses = per_s(cur->seq[k].misses, same ? prev->seq[k].misses : 0, dt);
		r->slot[k].published = per_s(cur->seq[k].published,
					     same ? prev->seq[k].published : 0, dt);
		r->slot[k].evictions = per_s(cur->seq[k].evictions,
					     same ? prev->seq[k].evictions : 0, dt);
	}
	r->ended /= dt;
	for (unsigned k = 0; k < KVA_TIERS; k++) {
		r->tier_hits[k] = per_s(cur->ts.tier[k].hits, prev->ts.tier[k].hits, dt);
		r->tier_in[k] = per_s(cur->ts.tier[k].bytes_in, prev->ts.tier[k].bytes_in, dt);
		r->tier_out[k] = per_s(cur->ts.tier[k].bytes_out, prev->ts.tier[k].bytes_out, dt);
	}
	r->fetched = per_s(cur->ts.fetched, prev->ts.fetched, dt);
	r->backed = per_s(cur->ts.backed, prev->ts.backed, dt);
}

static double ratio_total(const struct sample *s)
{
	return s->ps.hits + s->ps.misses ? (double)s->ps.hits / (double)(s->ps.hits + s->ps.misses)
					 : 0.0;
}

static uint64_t owned_drawn(const struct sample *s)
{
	uint64_t n = 0;

	for (unsigned k = 0; k < KVA_MAX_WORKERS; k++)
		n += s->cs.state[k];
	return n;
}

static const char *agent_word(const struct sample *s)
{
	static const char *const state[] = { "none", "running", "stopping" };

	if (!s->agent_alive)
		return "gone";
	return state[s->as % 3];
}

/* ---------------------------------------------------- plain and JSON */

/*
 * A value of a key=value line, as logfmt writes one: bare when it is one
 * word, else in double quotes with '"' and '\' escaped, so that a name
 * with spaces (printable, by now) cannot split the line's fields.
 */
static const char *plain_value(const char *v, char *out, size_t cap)
{
	size_t o = 0;

	if (*v && !strpbrk(v, " \"=\\"))
		return v;
	out[o++] = '"';
	for (; *v && o + 3 < cap; v++) {
		if (*v == '"' || *v == '\\')
			out[o++] = '\\';
		out[o++] = *v;
	}
	out[o++] = '"';
	out[o] = 0;
	return out;
}

static int plain_line(struct top *t, const struct sample *s, const struct rates *r)
{
	char when[32], name[64], quoted[140];
	struct tm tm;
	int ret;

	localtime_r(&s->wall.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	ret = printf("%s arena=%s agent=%s workers=%u/%u blocks=%u free=%u owned=%u shared=%u "
		     "refs=%u cached=%u pinned=%llu demoting=%llu fetching=%llu corrupt=%llu "
		     "in_caches=%u hit_ratio=%.4f hit_ratio_now=",
		     when,
		     plain_value(ctl_clean(kva_arena_info(t->c->a)->name, name, sizeof(name)), quoted,
				 sizeof(quoted)),
		     agent_word(s), s->st.workers, s->st.max_workers, s->st.total_blocks,
		     s->st.free_blocks, s->st.owned_blocks, s->st.shared_blocks, s->st.shared_refs,
		     s->st.prefix_cached_blocks, (unsigned long long)s->cs.pinned,
		     (unsigned long long)s->cs.kind[KVA_BLOCK_DEMOTING],
		     (unsigned long long)s->cs.kind[KVA_BLOCK_FETCHING],
		     (unsigned long long)s->cs.kind[KVA_BLOCK_BAD], s->st.cached_blocks,
		     ratio_total(s));
	if (r->ratio_now >= 0)
		printf("%.4f", r->ratio_now);
	else
		printf("-");
	printf(" hits/s=%.1f misses/s=%.1f published/s=%.1f evictions/s=%.1f refills/s=%.1f "
	       "flushes/s=%.1f shares/s=%.1f ended/s=%.1f open_seqs=%llu reclaims_pending=%u",
	       r->hits, r->misses, r->published, r->evictions, r->refills, r->flushes, r->shares,
	       r->ended, (unsigned long long)s->ps.open_seqs, s->ar.reclaims_pending);
	for (unsigned k = 0; k < KVA_TIERS; k++) {
		const struct kva_tier_stats *ts = &s->ts.tier[k];
		const char *tn = k == KVA_TIER_HOST ? "host" : "disk";

		if (!ts->enabled)
			continue;
		printf(" %s_used=%llu/%llu %s_hits/s=%.1f %s_in_MiB/s=%.2f %s_out_MiB/s=%.2f%s", tn,
		       (unsigned long long)ts->used_records, (unsigned long long)ts->capacity_records,
		       tn, r->tier_hits[k], tn, r->tier_in[k] / (1 << 20), tn,
		       r->tier_out[k] / (1 << 20), ts->degraded ? " degraded=1" : "");
	}
	putchar('\n');
	return ret < 0 || fflush(stdout) ? -EIO : 0;
}

static void add_u(struct json_object *o, const char *k, uint64_t v)
{
	json_object_object_add(o, k, json_object_new_uint64(v));
}

static void add_d(struct json_object *o, const char *k, double v)
{
	json_object_object_add(o, k, json_object_new_double(round(v * 1000) / 1000));
}

static int json_line(struct top *t, const struct sample *s, const struct rates *r)
{
	struct json_object *o = json_object_new_object(), *ra = json_object_new_object();
	struct json_object *slots = json_object_new_array(), *tiers = json_object_new_object();
	char name[64];
	int ret;

	add_d(o, "time", (double)s->wall.tv_sec + (double)s->wall.tv_nsec / 1e9);
	add_d(o, "interval_s", r->dt);
	json_object_object_add(o, "arena", json_object_new_string(
						   ctl_clean(kva_arena_info(t->c->a)->name, name,
							     sizeof(name))));
	json_object_object_add(o, "agent_pid", json_object_new_int64(t->c->agent.pid));
	json_object_object_add(o, "agent_state", json_object_new_string(agent_word(s)));
	if (s->agent_up >= 0)
		add_d(o, "agent_uptime_s", s->agent_up);
	add_u(o, "workers", s->st.workers);
	add_u(o, "max_workers", s->st.max_workers);
	add_u(o, "total_blocks", s->st.total_blocks);
	add_u(o, "free_blocks", s->st.free_blocks);
	add_u(o, "owned_blocks", s->st.owned_blocks);
	add_u(o, "shared_blocks", s->st.shared_blocks);
	add_u(o, "shared_refs", s->st.shared_refs);
	add_u(o, "prefix_cached_blocks", s->st.prefix_cached_blocks);
	add_u(o, "cached_blocks", s->st.cached_blocks);
	add_u(o, "pinned_blocks", s->cs.pinned);
	add_u(o, "demoting_blocks", s->cs.kind[KVA_BLOCK_DEMOTING]);
	add_u(o, "fetching_blocks", s->cs.kind[KVA_BLOCK_FETCHING]);
	add_u(o, "corrupt_blocks", s->cs.kind[KVA_BLOCK_BAD]);
	add_u(o, "hits", s->ps.hits);
	add_u(o, "misses", s->ps.misses);
	add_d(o, "hit_ratio", ratio_total(s));
	if (r->ratio_now >= 0)
		add_d(o, "hit_ratio_interval", r->ratio_now);
	else
		json_object_object_add(o, "hit_ratio_interval", NULL);
	add_d(ra, "hits", r->hits);
	add_d(ra, "misses", r->misses);
	add_d(ra, "published", r->published);
	add_d(ra, "evictions", r->evictions);
	add_d(ra, "refills", r->refills);
	add_d(ra, "flushes", r->flushes);
	add_d(ra, "shares", r->shares);
	add_d(ra, "ended", r->ended);
	json_object_object_add(o, "rates", ra);
	add_u(o, "open_seqs", s->ps.open_seqs);
	add_u(o, "reclaims_pending", s->ar.reclaims_pending);
	add_u(o, "repairs", s->ar.repairs);
	for (unsigned k = 0; k < KVA_TIERS; k++) {
		const struct kva_tier_stats *ts = &s->ts.tier[k];
		struct json_object *e = json_object_new_object();

		json_object_object_add(e, "enabled", json_object_new_boolean(ts->enabled));
		json_object_object_add(e, "degraded", json_object_new_boolean(ts->degraded));
		add_u(e, "used_records", ts->used_records);
		add_u(e, "capacity_records", ts->capacity_records);
		add_d(e, "hits_per_s", r->tier_hits[k]);
		add_d(e, "bytes_in_per_s", r->tier_in[k]);
		add_d(e, "bytes_out_per_s", r->tier_out[k]);
		json_object_object_add(tiers, k == KVA_TIER_HOST ? "host" : "disk", e);
	}
	add_d(tiers, "fetched_per_s", r->fetched);
	add_d(tiers, "backed_per_s", r->backed);
	json_object_object_add(o, "tiers", tiers);
	for (uint32_t k = 0; k < s->st.max_workers; k++) {
		static const char *const slot_state[] = { "free", "joining", "live", "reclaiming" };
		const struct kva_slot_stats *w = &s->st.slots[k];
		struct json_object *e;

		if (w->state == KVA_SLOT_FREE)
			continue;
		e = json_object_new_object();
		json_object_object_add(e, "slot", json_object_new_int64(k));
		json_object_object_add(e, "name", json_object_new_string(
							  ctl_clean(w->name, name, sizeof(name))));
		json_object_object_add(e, "pid", json_object_new_int64(w->pid));
		json_object_object_add(e, "state", json_object_new_string(slot_state[w->state & 3]));
		add_u(e, "owned", w->owned);
		add_u(e, "shared", w->shared);
		add_u(e, "cached", w->cached);
		add_u(e, "open_seqs", s->seq[k].open_seqs);
		add_u(e, "inference", s->seq[k].kind_blocks[KVA_OWNER_INFERENCE]);
		add_u(e, "training", s->seq[k].kind_blocks[KVA_OWNER_TRAINING]);
		add_u(e, "pinned", s->seq[k].kind_blocks[KVA_OWNER_PINNED]);
		add_d(e, "hits_per_s", r->slot[k].hits);
		add_d(e, "misses_per_s", r->slot[k].misses);
		add_d(e, "published_per_s", r->slot[k].published);
		add_d(e, "evictions_per_s", r->slot[k].evictions);
		json_object_array_add(slots, e);
	}
	json_object_object_add(o, "slots", slots);
	ret = puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) < 0 ||
			      fflush(stdout)
		      ? -EIO
		      : 0;
	json_object_put(o);
	return ret;
}

/* ------------------------------------------------------------ screen */

static void frame_put(struct top *t, const char *s, size_t n)
{
	if (t->len + n + 1 > t->cap) {
		size_t cap = (t->cap ? t->cap : 8192) * 2;
		char *f;

		while (cap < t->len + n + 1)
			cap *= 2;
		if (!(f = realloc(t->frame, cap)))
			return; /* a frame cut short, drawn whole next time */
		t->frame = f;
		t->cap = cap;
	}
	memcpy(t->frame + t->len, s, n);
	t->len += n;
}

/* A line of the screen: text counted in columns (one a code point: every
 * name is printable UTF-8 by now) and cut at the window's width; color
 * changes counted as nothing. */
struct line {
	struct top *t;
	int used;
};

static void line_sgr(struct line *l, const char *sgr)
{
	char buf[24];

	/* past the window's edge nothing more shows: line_end resets */
	if (!l->t->color || l->used >= l->t->cols || l->t->lines >= l->t->rows)
		return;
	snprintf(buf, sizeof(buf), "\033[%sm", sgr);
	frame_put(l->t, buf, strlen(buf));
}

static void line_text(struct line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line_text(struct line *l, const char *fmt, ...)
{
	char buf[1024];
	const unsigned char *p = (const unsigned char *)buf;
	va_list ap;

	if (l->t->lines >= l->t->rows)
		return; /* below the window: dropped, not scrolled */
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	while (*p && l->used < l->t->cols) {
		size_t n = 1;

		while ((p[n] & 0xc0) == 0x80)
			n++;
		frame_put(l->t, (const char *)p, n);
		p += n;
		l->used++;
	}
}

static void line_end(struct line *l)
{
	l->used = 0;
	if (l->t->lines >= l->t->rows)
		return;
	if (l->t->color)
		frame_put(l->t, "\033[0m", 4);
	frame_put(l->t, "\033[K\n", 4);
	l->t->lines++;
}

/* @s cut to @cols code points and padded to them */
static const char *fit(const char *s, int cols, char *out, size_t cap)
{
	size_t o = 0;
	int used = 0;
	const unsigned char *p = (const unsigned char *)s;

	while (*p && used < cols && o + 4 < cap) {
		size_t n = 1;

		while ((p[n] & 0xc0) == 0x80 && n < 4)
			n++;
		memcpy(out + o, p, n);
		o += n;
		p += n;
		used++;
	}
	while (used++ < cols && o + 1 < cap)
		out[o++] = ' ';
	out[o] = 0;
	return out;
}

/* the drawn states in the bar's order, their character and color */
static const struct {
	int state;                 /* -1: owned by any slot */
	char ch;
	const char *sgr;
	const char *name;
} bar_states[] = {
	{ -1, 'o', "34", "owned" },
	{ CTL_SHARED, '#', "35", "shared" },
	{ CTL_PINNED, 'P', "33", "pinned" },
	{ CTL_CACHED, '+', "32", "cached" },
	{ CTL_DEMOTING, 'v', "95", "demoting" },
	{ CTL_FETCHING, '^', "96", "fetching" },
	{ CTL_CORRUPT, '!', "1;31", "corrupt" },
	{ CTL_FREE, '.', "90", "free" },
};

static uint64_t bar_count(const struct sample *s, unsigned i)
{
	return bar_states[i].state < 0 ? owned_drawn(s) : s->cs.state[bar_states[i].state];
}

#define BAR_STATES (sizeof(bar_states) / sizeof(bar_states[0]))

static void draw_bar(struct top *t, const struct sample *s)
{
	struct line l = { t, 0 };
	int width = t->cols - 11, cols[BAR_STATES], sum = 0, largest = 0;
	uint64_t total = 0;

	if (width < (int)BAR_STATES)
		width = (int)BAR_STATES;
	for (unsigned i = 0; i < BAR_STATES; i++)
		total += bar_count(s, i);
	/* each state its share of the bar, and every state present at least
	 * one column (4 pinned blocks in a million are still worth seeing),
	 * taken from the largest */
	for (unsigned i = 0; i < BAR_STATES; i++) {
		uint64_t n = bar_count(s, i);

		cols[i] = total ? (int)((double)width * (double)n / (double)total + 0.5) : 0;
		if (n && !cols[i])
			cols[i] = 1;
		if (cols[i] > cols[largest])
			largest = (int)i;
		sum += cols[i];
	}
	cols[largest] += width - sum;
	if (cols[largest] < 0)
		cols[largest] = 0;
	line_text(&l, "blocks  [");
	for (unsigned i = 0; i < BAR_STATES; i++) {
		if (!cols[i])
			continue;
		line_sgr(&l, bar_states[i].sgr);
		for (int k = 0; k < cols[i]; k++)
			line_text(&l, "%c", bar_states[i].ch);
		line_sgr(&l, "0");
	}
	line_text(&l, "]");
	line_end(&l);
	/* the counts, in the bar's colors */
	line_text(&l, "       ");
	for (unsigned i = 0; i < BAR_STATES; i++) {
		uint64_t n = bar_count(s, i);

		line_text(&l, " ");
		line_sgr(&l, bar_states[i].sgr);
		line_text(&l, "%c", bar_states[i].ch);
		line_sgr(&l, "0");
		line_text(&l, " %s %llu", bar_states[i].name, (unsigned long long)n);
		if (bar_states[i].state == CTL_FREE || bar_states[i].state < 0)
			line_text(&l, " (%.1f%%)", 100.0 * (double)n / (double)total);
	}
	line_end(&l);
}

static void rate_text(struct line *l, const struct rates *r, const char *what, double v)
{
	if (r->valid)
		line_text(l, "%s %.1f/s", what, v);
	else
		line_text(l, "%s -/s", what);
}

static void duration(char *out, size_t cap, double s)
{
	unsigned long long x = (unsigned long long)s;

	if (s < 0)
		snprintf(out, cap, "?");
	else if (x < 3600)
		snprintf(out, cap, "%llum%02llus", x / 60, x % 60);
	else if (x < 86400)
		snprintf(out, cap, "%lluh%02llum", x / 3600, x / 60 % 60);
	else
		snprintf(out, cap, "%llud%02lluh", x / 86400, x / 3600 % 24);
}

static void draw(struct top *t, const struct sample *s, const struct rates *r)
{
	const struct kva_arena_info *info = kva_arena_info(t->c->a);
	struct line l = { t, 0 };
	char name[64], when[16], up[32], fitted[128];
	struct tm tm;
	int lines_left;
	unsigned shown = 0, workers = 0;

	t->len = 0;
	t->lines = 0;
	frame_put(t, "\033[H", 3);
	localtime_r(&s->wall.tv_sec, &tm);
	strftime(when, sizeof(when), "%H:%M:%S", &tm);
	duration(up, sizeof(up), s->agent_up);
	/* the arena, its agent */
	line_sgr(&l, "1");
	line_text(&l, "kvarena");
	line_sgr(&l, "0");
	line_text(&l, " arena \"%s\" \xc2\xb7 %s", ctl_clean(info->name, name, sizeof(name)),
		  info->backend == KVA_BACKEND_CUDA ? "cuda" : "host");
	if (info->backend == KVA_BACKEND_CUDA)
		line_text(&l, " %s", ctl_clean(info->device_name, fitted, sizeof(fitted)));
	line_text(&l, " \xc2\xb7 agent pid %d ", t->c->agent.pid);
	if (!s->agent_alive || s->as != KVA_AGENT_RUNNING)
		line_sgr(&l, "1;31");
	line_text(&l, "%s", agent_word(s));
	line_sgr(&l, "0");
	if (s->agent_alive)
		line_text(&l, ", up %s", up);
	line_text(&l, " \xc2\xb7 %s \xc2\xb7 every %.1fs \xc2\xb7 q quits", when, t->c->interval);
	line_end(&l);
	if (!s->agent_alive) {
		line_sgr(&l, "1;31");
		line_text(&l, "the agent is gone: what follows is the arena as its workers left it");
		line_end(&l);
	}
	/* blocks */
	draw_bar(t, s);
	line_text(&l, "        %u blocks of %.1f KiB \xc2\xb7 %u shared with %u references "
		  "\xc2\xb7 %u idle in worker caches \xc2\xb7 %llu pinned by the hint",
		  s->st.total_blocks, (double)info->layout.block_bytes / 1024, s->st.shared_blocks,
		  s->st.shared_refs, s->st.cached_blocks, (unsigned long long)s->cs.pinned);
	line_end(&l);
	/* the prefix cache */
	line_text(&l, "prefix  hit ratio %.3f", ratio_total(s));
	if (r->valid && r->ratio_now >= 0)
		line_text(&l, " (last %.1fs: %.3f)", r->dt, r->ratio_now);
	else if (r->valid)
		line_text(&l, " (last %.1fs: no match)", r->dt);
	line_text(&l, " \xc2\xb7 ");
	rate_text(&l, r, "hits", r->hits);
	line_text(&l, " \xc2\xb7 ");
	rate_text(&l, r, "misses", r->misses);
	line_text(&l, " \xc2\xb7 ");
	rate_text(&l, r, "published", r->published);
	line_text(&l, " \xc2\xb7 ");
	rate_text(&l, r, "evicted", r->evictions);
	line_text(&l, " \xc2\xb7 %llu open sequences", (unsigned long long)s->ps.open_seqs);
	line_end(&l);
	/* the allocator and the workers' comings and goings */
	line_text(&l, "alloc   ");
	rate_text(&l, r, "refills", r->refills);
	line_text(&l, " \xc2\xb7 ");
	rate_text(&l, r, "flushes", r->flushes);
	line_text(&l, " \xc2\xb7 ");
	rate_text(&l, r, "shares", r->shares);
	line_text(&l, " \xc2\xb7 workers %u of %u \xc2\xb7 ", s->st.workers, s->st.max_workers);
	rate_text(&l, r, "left or reclaimed", r->ended);
	line_text(&l, " \xc2\xb7 ");
	if (s->ar.reclaims_pending)
		line_sgr(&l, "1;31");
	line_text(&l, "%u reclaims pending", s->ar.reclaims_pending);
	line_sgr(&l, "0");
	line_text(&l, " \xc2\xb7 %llu repairs", (unsigned long long)s->ar.repairs);
	line_end(&l);
	/* the tiers */
	if (!s->ts.tier[KVA_TIER_HOST].enabled && !s->ts.tier[KVA_TIER_DISK].enabled) {
		line_text(&l, "tiers   none");
		line_end(&l);
	}
	for (unsigned k = 0; k < KVA_TIERS; k++) {
		const struct kva_tier_stats *ts = &s->ts.tier[k];

		if (!ts->enabled)
			continue;
		line_text(&l, "%s %llu/%llu records (%.1f%%) \xc2\xb7 ",
			  k == KVA_TIER_HOST ? "tiers   host" : "        disk",
			  (unsigned long long)ts->used_records,
			  (unsigned long long)ts->capacity_records,
			  ts->capacity_records ? 100.0 * (double)ts->used_records /
							 (double)ts->capacity_records
					       : 0.0);
		rate_text(&l, r, "hits", r->tier_hits[k]);
		line_text(&l, " \xc2\xb7 in %.1f MiB/s \xc2\xb7 out %.1f MiB/s", r->tier_in[k] / (1 << 20),
			  r->tier_out[k] / (1 << 20));
		if (ts->degraded) {
			line_text(&l, " \xc2\xb7 ");
			line_sgr(&l, "1;31");
			line_text(&l, "DEGRADED: %s", ctl_clean(ts->reason, fitted, sizeof(fitted)));
			line_sgr(&l, "0");
		} else if (ts->warming) {
			line_text(&l, " \xc2\xb7 warming");
		}
		line_end(&l);
	}
	line_end(&l);
	/* the workers, as many as the window has room for */
	line_sgr(&l, "7");
	line_text(&l, "%-4s %-16s %-8s %-6s %7s %7s %6s %5s %7s %8s %8s %7s %7s", "SLOT", "NAME",
		  "PID", "STATE", "OWNED", "SHARED", "CACHE", "SEQS", "PINNED", "HITS/s", "MISS/s",
		  "PUB/s", "EVICT/s");
	while (l.used < t->cols)
		line_text(&l, " ");
	line_end(&l);
	for (uint32_t k = 0; k < s->st.max_workers; k++)
		workers += s->st.slots[k].state != KVA_SLOT_FREE;
	lines_left = t->rows - t->lines;
	for (uint32_t k = 0; k < s->st.max_workers; k++) {
		static const char *const slot_state[] = { "free", "join", "live", "reclm" };
		const struct kva_slot_stats *w = &s->st.slots[k];
		char hits[16] = "-", misses[16] = "-", pub[16] = "-", ev[16] = "-";

		if (w->state == KVA_SLOT_FREE)
			continue;
		if (lines_left <= 1 && shown + 1 < workers) {
			line_text(&l, "(%u more workers: a taller window shows them)", workers - shown);
			line_end(&l);
			break;
		}
		if (r->slot[k].valid) {
			snprintf(hits, sizeof(hits), "%.1f", r->slot[k].hits);
			snprintf(misses, sizeof(misses), "%.1f", r->slot[k].misses);
			snprintf(pub, sizeof(pub), "%.1f", r->slot[k].published);
			snprintf(ev, sizeof(ev), "%.1f", r->slot[k].evictions);
		}
		line_text(&l, "%-4u %s %-8d %-6s %7u %7u %6u %5u %7llu %8s %8s %7s %7s", k,
			  fit(ctl_clean(w->name, name, sizeof(name)), 16, fitted, sizeof(fitted)),
			  w->pid, slot_state[w->state & 3], w->owned, w->shared, w->cached,
			  s->seq[k].open_seqs,
			  (unsigned long long)s->seq[k].kind_blocks[KVA_OWNER_PINNED], hits, misses,
			  pub, ev);
		line_end(&l);
		shown++;
		lines_left--;
	}
	if (!workers) {
		line_text(&l, "(no workers)");
		line_end(&l);
	}
	/* the last line ends without a newline, so the screen does not
	 * scroll when the window is exactly full; then clear below */
	if (t->len && t->frame[t->len - 1] == '\n')
		t->len--;
	frame_put(t, "\033[J", 3);
	write_all(t->frame, t->len);
}

/* ------------------------------------------------------------- loop */

/*
 * wait_next - sleep until @deadline (monotonic seconds), a key, or a
 * signal. Return: 'q' to quit, 'r' to redraw now (a resize, space, or
 * the return from ^Z), 0 when the deadline came.
 */
static int wait_next(struct top *t, double deadline, const sigset_t *unblocked)
{
	for (;;) {
		double left = deadline - mono_now();
		struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
		struct timespec ts;
		int n;

		if (got_quit)
			return 'q';
		if (got_tstp && t->screen) {
			/* ^Z: the terminal back as it was, stop; on SIGCONT, the
			 * screen again */
			got_tstp = 0;
			screen_leave(t);
			raise(SIGSTOP);
			screen_enter(t);
			return 'r';
		}
		if (got_winch || got_cont) {
			got_winch = got_cont = 0;
			if (t->screen)
				return 'r';
		}
		if (left <= 0)
			return 0;
		ts.tv_sec = (time_t)left;
		ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
		/* the handled signals are blocked except inside ppoll: one
		 * that comes between the checks above and the sleep wakes it */
		n = ppoll(&pfd, t->keys ? 1 : 0, &ts, unblocked);
		if (n > 0 && (pfd.revents & POLLIN)) {
			char keys[32];
			ssize_t got = read(STDIN_FILENO, keys, sizeof(keys));

			for (ssize_t i = 0; i < got; i++) {
				if (keys[i] == 'q' || keys[i] == 'Q')
					return 'q';
				if (keys[i] == ' ' || keys[i] == '\f')
					return 'r';
			}
		} else if (n > 0) {
			t->keys = false; /* stdin hung up: no more keys */
		}
	}
}

int ctl_top(struct ctl *c)
{
	static const int handled[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGTSTP,
				       SIGCONT };
	static const int fatal[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT };
	struct top t = { .c = c };
	struct sample *s = calloc(2, sizeof(*s)), *cur, *prev;
	struct rates r = { 0 };
	sigset_t block, unblocked;
	struct sigaction sa = { .sa_handler = on_signal };
	double next;
	uint32_t shown = 0;
	int ret = 0, key;

	if (!s) {
		fprintf(stderr, "kvarena-ctl: out of memory\n");
		return 1;
	}
	if (c->interval <= 0)
		c->interval = 1.0;
	t.screen = !c->json && isatty(STDOUT_FILENO);
	t.alternate = !c->iterations;
	t.keys = t.screen && isatty(STDIN_FILENO);
	t.color = t.screen && !getenv("NO_COLOR") &&
		  !(getenv("TERM") && !strcmp(getenv("TERM"), "dumb"));
	sigemptyset(&block);
	for (unsigned k = 0; k < sizeof(handled) / sizeof(handled[0]); k++) {
		struct sigaction old;

		/* ^Z and SIGCONT are ours only while we own the screen; a
		 * signal the shell had us ignore (a background job's ^C,
		 * nohup's SIGHUP) stays ignored */
		if (!t.screen && (handled[k] == SIGTSTP || handled[k] == SIGCONT))
			continue;
		if (sigaction(handled[k], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
			continue;
		sigaddset(&block, handled[k]);
		sigaction(handled[k], &sa, NULL);
	}
	sigprocmask(SIG_BLOCK, &block, &unblocked);
	if (t.screen) {
		struct sigaction crash = { .sa_handler = on_crash, .sa_flags = SA_RESETHAND };

		for (unsigned k = 0; k < sizeof(fatal) / sizeof(fatal[0]); k++)
			sigaction(fatal[k], &crash, NULL);
		window_size(&t);
		screen_enter(&t);
	}
	cur = &s[0];
	prev = &s[1];
	if ((ret = take_sample(&t, cur)) < 0)
		goto out;
	next = cur->t + c->interval;
	if (t.screen) {
		draw(&t, cur, &r);
		shown++;
	}
	while (!c->iterations || shown < c->iterations) {
		key = wait_next(&t, next, &unblocked);
		if (key == 'q')
			break;
		if (key == 'r') {
			window_size(&t);
			draw(&t, cur, &r);
			continue;
		}
		{
			struct sample *x = prev;

			prev = cur;
			cur = x;
		}
		if ((ret = take_sample(&t, cur)) < 0)
			break;
		compute_rates(prev, cur, &r);
		/* the next refresh one interval after this one was due: the
		 * time a refresh takes does not stretch the interval */
		next += c->interval;
		if (next < cur->t)
			next = cur->t + c->interval;
		if (t.screen)
			draw(&t, cur, &r);
		else if ((ret = c->json ? json_line(&t, cur, &r) : plain_line(&t, cur, &r)) < 0)
			break;
		shown++;
	}
out:
	screen_leave(&t);
	sigprocmask(SIG_SETMASK, &unblocked, NULL);
	free(t.frame);
	free(s);
	if (ret < 0 && ret != -EIO)
		fprintf(stderr, "kvarena-ctl: top: %s\n", strerror(-ret));
	return ret < 0 ? 1 : 0;
}
