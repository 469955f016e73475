/* SPDX-License-Identifier: MIT */
/*
 * region.c - the operating-system layer under the arena: anonymous memory
 * files, their seals, mappings, NUMA placement, and process liveness. Each
 * function states its contract; each returns 0 or a negative errno.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arena_pvt.h"

#define HUGE_2M (2ull << 20)
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21u << 26) /* log2(2 MiB) << MFD_HUGE_SHIFT, linux/memfd.h */
#endif

/*
 * kva__region_create - a new sealable memfd of at least @bytes, close-on-exec.
 * With @hugetlb, backed by 2 MiB pages: the size is rounded up to them and the
 * pages are reserved by a trial mapping, so that a system without free huge
 * pages answers -ENOMEM here rather than SIGBUS later. *mapped_bytes gets the
 * size of the file.
 */
int kva__region_create(const char *name, uint64_t bytes, bool hugetlb, int *fd_out,
		       uint64_t *mapped_bytes)
{
	unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	uint64_t size = bytes;
	int fd, ret;

	if (hugetlb) {
		flags |= MFD_HUGETLB | MFD_HUGE_2MB;
		size = (bytes + HUGE_2M - 1) & ~(HUGE_2M - 1);
	}
	/* A file size limit would kill the process with SIGXFSZ at the
	 * ftruncate: say it instead. */
	{
		struct rlimit rl;

		if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
		    size > rl.rlim_cur)
			return kva__err(-EFBIG, "a region of %llu bytes is over the file size limit "
					"of %llu bytes (ulimit -f, RLIMIT_FSIZE)",
					(unsigned long long)size, (unsigned long long)rl.rlim_cur);
	}
	fd = memfd_create(name, flags);
	if (fd < 0)
		return -errno;
	/* A memfd is made with mode 0777, and anyone holding a read-only fd
	 * could open it again read-write through /proc/self/fd: only the
	 * creator's uid may open it at all (a worker gets an fd, not a path). */
	if (fchmod(fd, 0600) < 0 || ftruncate(fd, (off_t)size) < 0) {
		ret = -errno;
		goto fail;
	}
	if (hugetlb) {
		/* hugetlbfs reserves the pages of a shared mapping at mmap time */
		void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

		if (p == MAP_FAILED) {
			ret = -errno;
			goto fail;
		}
		munmap(p, size);
	}
	*fd_out = fd;
	*mapped_bytes = size;
	return 0;
fail:
	close(fd);
	return ret;
}

/* kva__region_seal - forbid shrinking and growing @fd, and further sealing. */
int kva__region_seal(int fd)
{
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return -errno;
	return 0;
}

/*
 * kva__region_seals_ok - 0 if @fd can neither shrink nor grow, nor take more
 * seals: nobody holding it can truncate the region under another process's
 * mapping (SIGBUS there), or seal it against writable mappings (every later
 * attach would fail).
 */
int kva__region_seals_ok(int fd)
{
	const int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0)
		return -errno;
	if ((seals & need) != need)
		return -EPERM;
	return 0;
}

/* kva__region_size - the size of the file behind @fd; -EBADF if not a regular file. */
int kva__region_size(int fd, uint64_t *bytes)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EBADF;
	*bytes = (uint64_t)st.st_size;
	return 0;
}

/* kva__region_map - map @bytes of @fd shared, anywhere; read-only if asked. */
int kva__region_map(int fd, uint64_t bytes, bool readonly, void **addr)
{
	void *p = mmap(NULL, bytes, readonly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		       0);

	if (p == MAP_FAILED)
		return -errno;
	*addr = p;
	return 0;
}

/*
 * kva__region_advise_huge - ask for transparent huge pages under the shared
 * mapping [@addr, @addr + @bytes) of a memfd (shmem): MADV_HUGEPAGE. A
 * hint: whether the kernel gives 2 MiB pages is the system's choice
 * (/sys/kernel/mm/transparent_hugepage/shmem_enabled: "advise", "always"
 * and "within_size" give them, "never" and "deny" not). It marks this
 * process's mapping only, so every process that maps the data asks: in
 * "advise" a page is allocated huge where the first touch's mapping asked,
 * and a mapping maps an existing huge page whole (one TLB entry, one page
 * walk for 2 MiB) only if it asked too. A decode's tile reads one KV
 * head's 4 KiB run of each page, so on 4 KiB pages every run is a page
 * walk of its own. -errno if the kernel refused the hint (no THP).
 */
int kva__region_advise_huge(void *addr, uint64_t bytes)
{
	return madvise(addr, bytes, MADV_HUGEPAGE) < 0 ? -errno : 0;
}

/*
 * kva__region_huge_bytes - bytes of the mapping that starts at @addr that
 * 2 MiB pages map in this process (the ShmemPmdMapped, FilePmdMapped and
 * AnonHugePages of its entry in /proc/self/smaps); -errno if smaps cannot be
 * read, -ENOENT if no mapping starts at @addr.
 */
int64_t kva__region_huge_bytes(const void *addr)
{
	static const char *const keys[] = { "ShmemPmdMapped:", "FilePmdMapped:", "AnonHugePages:" };
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[512];
	bool in = false, found = false;
	int64_t kb = 0;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char c;

		/* an entry's first line is "lo-hi perms offset dev inode path" (the
		 * path of a memfd is "/memfd:NAME (deleted)"); the others are
		 * "Key: value", and no key is hex digits and a '-' */
		if (sscanf(line, "%lx-%lx %c", &lo, &hi, &c) == 3) {
			in = lo == (unsigned long)(uintptr_t)addr;
			found |= in;
			continue;
		}
		if (in)
			for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
				size_t n = strlen(keys[k]);
				unsigned long long v;

				if (!strncmp(line, keys[k], n) && sscanf(line + n, "%llu", &v) == 1)
					kb += (int64_t)v;
			}
	}
	fclose(f);
	return found ? kb * 1024 : -ENOENT;
}

/* the bracketed word of a sysfs choice file ("always [advise] never") into
 * @out; false if there is none */
static bool sysfs_choice(const char *path, char *out, size_t len)
{
	char buf[256], *l, *r;
	FILE *f = fopen(path, "re");
	bool ok = false;

	if (!f)
		return false;
	if (fgets(buf, sizeof(buf), f) && (l = strchr(buf, '[')) && (r = strchr(l, ']')) &&
	    (size_t)(r - l) <= len) {
		*r = '\0';
		snprintf(out, len, "%s", l + 1);
		ok = true;
	}
	fclose(f);
	return ok;
}

/*
 * kva__thp_shmem - the system's choice for transparent huge pages under
 * shmem (a memfd) into @out: "never", "advise", "always", ... ("" if the
 * kernel has none). The 2 MiB size's own choice where it has one other
 * than "inherit" (kernels with multi-size THP), else the global one.
 */
void kva__thp_shmem(char *out, size_t len)
{
	static const char dir[] = "/sys/kernel/mm/transparent_hugepage/";
	char path[128];

	if (len)
		out[0] = '\0';
	snprintf(path, sizeof(path), "%shugepages-2048kB/shmem_enabled", dir);
	if (sysfs_choice(path, out, len) && strcmp(out, "inherit"))
		return;
	snprintf(path, sizeof(path), "%sshmem_enabled", dir);
	if (!sysfs_choice(path, out, len) && len)
		out[0] = '\0';
}

/*
 * kva__region_bind_node - place the pages of a shared mapping on NUMA node
 * @node. For memfd (shmem and hugetlbfs) the policy is kept by the file, so
 * it holds for every process that maps it later. Must run before the first
 * touch. -EINVAL if the node does not exist, -ENOSYS without NUMA support.
 */
int kva__region_bind_node(void *addr, uint64_t bytes, int node)
{
	struct bitmask *mask;
	int ret = 0;

	if (numa_available() < 0)
		return -ENOSYS;
	if (node < 0 || node > numa_max_node() ||
	    !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node))
		return -EINVAL;
	mask = numa_allocate_nodemask();
	if (!mask)
		return -ENOMEM;
	numa_bitmask_setbit(mask, (unsigned)node);
	if (mbind(addr, bytes, MPOL_BIND, mask->maskp, mask->size + 1, 0) < 0)
		ret = -errno;
	numa_bitmask_free(mask);
	return ret;
}

/*
 * kva__pid_start_time - the kernel's start time of @pid (field 22 of
 * /proc/<pid>/stat, clock ticks since boot) and its state letter.
 * -ENOENT if there is no such process.
 */
int kva__pid_start_time(pid_t pid, uint64_t *start_time, char *state)
{
	char path[64], buf[1024], *p;
	unsigned long long st = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return n < 0 ? -errno : -ENOENT;
	buf[n] = '\0';
	/* the command name may hold spaces and parentheses: skip to the last ')' */
	p = strrchr(buf, ')');
	if (!p || p[1] != ' ' || !p[2])
		return -EIO;
	if (state)
		*state = p[2];
	/* after ") " come fields 3..: state is 3, starttime is 22 */
	p += 2;
	for (int field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (!p)
			return -EIO;
		p++;
	}
	if (sscanf(p, "%llu", &st) != 1)
		return -EIO;
	*start_time = st;
	return 0;
}

/* Any thread of @pid not yet exited? /proc's view, for kernels without pidfds. */
static bool proc_threads_run(pid_t pid)
{
	char path[64];
	struct dirent *de;
	bool run = false;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (!(d = opendir(path)))
		return false;
	while (!run && (de = readdir(d))) {
		uint64_t st;
		char state = 'X';
		long tid = strtol(de->d_name, NULL, 10);

		/* a thread's stat has the same fields as a process's */
		if (tid > 0 && kva__pid_start_time((pid_t)tid, &st, &state) == 0)
			run = state != 'Z' && state != 'X';
	}
	closedir(d);
	return run;
}

/*
 * kva__pid_gone - true only if the process that was @pid, started at @start
 * clock ticks after boot (its low KVA__START_BITS; 0 = unknown), has
 * certainly exited: nothing of its thread group runs any more, or the pid
 * now names a process that started at another time. Whenever it cannot
 * tell, the answer is false (alive): a process judged dead loses its blocks
 * to another while it still uses them, whereas one judged alive only waits
 * for the next look.
 *
 * A process whose main thread called pthread_exit() while other threads run
 * shows its leader as a zombie in /proc, and is alive: the pidfd says
 * readable only once the whole thread group has exited (pidfd_poll), so the
 * state letter is not used when a pidfd can be had. The pidfd is opened
 * before /proc is read: if the number is reused in between, /proc shows the
 * newer process's start time and the old one is rightly gone.
 */
bool kva__pid_gone(pid_t pid, uint64_t start)
{
	uint64_t st = 0;
	bool gone;
	int fd, ret;

	if (pid <= 0)
		return true;
	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (fd < 0 && errno == ESRCH)
		return true; /* no process has this number */
	ret = kva__pid_start_time(pid, &st, NULL);
	gone = ret == 0 && start && (st & KVA__START_MASK) != start;
	if (fd >= 0) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		gone = gone || (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP)));
		close(fd);
		return gone;
	}
	/* no pidfds here (a kernel before 5.3, a seccomp filter): /proc alone */
	if (ret == -ENOENT)
		return true;
	if (ret < 0) /* no /proc to read: the pid alone has to do */
		return kill(pid, 0) < 0 && errno == ESRCH;
	return gone || !proc_threads_run(pid);
}
