/* SPDX-License-Identifier: MIT */
/*
 * sock.c - one message per SOCK_SEQPACKET packet, with fds by SCM_RIGHTS.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "arena_pvt.h"
#include "proto_pvt.h"

int kva__sock_send(int fd, const union kva__msg *m, const int *fds, int nfds)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * KVA__SCM_MAX_FD)];
	} ctl;
	struct iovec iov = { .iov_base = (void *)m, .iov_len = m->h.length };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (nfds < 0 || nfds > KVA__SCM_MAX_FD)
		return -EINVAL;
	if (nfds) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(fd, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == (ssize_t)m->h.length ? 0 : -EIO;
}

int kva__sock_recv(int fd, void *buf, size_t cap, int *fds, int *nfds, int timeout_ms)
{
	return kva__sock_recv_fds(fd, buf, cap, fds, KVA__MAX_FDS, nfds, timeout_ms);
}

int kva__sock_recv_fds(int fd, void *buf, size_t cap, int *fds, int max_fds, int *nfds,
		       int timeout_ms)
{
	/* room for every fd a message can carry, so that one with more than
	 * we take is seen (and its fds closed), not cut by the kernel */
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * KVA__SCM_MAX_FD)];
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf),
	};
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	ssize_t n;
	int ret = 0;

	*nfds = 0;
	for (;;) {
		int r = poll(&pfd, 1, timeout_ms);

		if (r > 0)
			break;
		if (r == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
	do
		n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		int got;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int k = 0; k < got; k++) {
			int f;

			memcpy(&f, CMSG_DATA(c) + sizeof(int) * (size_t)k, sizeof(f));
			if (*nfds < max_fds) {
				fds[(*nfds)++] = f;
			} else {
				close(f);
				ret = -EPROTO;
			}
		}
	}
	if (msg.msg_flags & MSG_TRUNC)
		ret = kva__err(-EPROTO, "protocol: a message longer than %zu bytes", cap);
	else if (msg.msg_flags & MSG_CTRUNC)
		/* the kernel drops the fds it cannot install: more than a
		 * message may carry, or this process is out of descriptors */
		ret = kva__err(-EPROTO, "protocol: file descriptors lost on the way in: more than "
			       "a message carries, or this process is at its descriptor limit "
			       "(ulimit -n)");
	if (ret < 0) {
		while (*nfds)
			close(fds[--*nfds]);
		return ret;
	}
	if (n == 0 && !*nfds)
		return -ECONNRESET; /* end of stream: SEQPACKET has no empty messages to us */
	return (int)n;
}

int kva__sock_connect(const char *path, int *fd_out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path))
		return kva__err(-ENAMETOOLONG, "socket path too long: %s", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kva__err(-errno, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		ret = -errno;
		close(fd);
		if (ret == -ENOENT || ret == -ECONNREFUSED)
			return kva__err(ret, "no kvarena agent at %s (%s)", path, strerror(-ret));
		if (ret == -EACCES)
			return kva__err(ret, "no permission to connect to %s (the agent's socket "
					"mode and group decide)", path);
		return kva__err(ret, "connecting to %s: %s", path, strerror(-ret));
	}
	*fd_out = fd;
	return 0;
}
