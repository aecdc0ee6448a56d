/* wr-reclaim: the memcg reclaim storm that scripts/bench runs (compiled at bench time with gcc).
 *
 *   WR_JOIN_CGROUP=/sys/fs/cgroup/memory/.../cgroup.procs wr-reclaim FILE SECONDS
 *
 * Joins the memory cgroup (join.h), drops FILE's clean pages from the page cache
 * (posix_fadvise DONTNEED: pages cached before were charged to another cgroup), then reads FILE
 * from start to end, again and again, 1 MiB per read(2), until SECONDS have passed. With FILE
 * larger than the cgroup's memory limit, every pass reads from disk and each new page-cache page
 * is charged to the cgroup at its limit: the charge path reclaims (memcg reclaim) all the time,
 * with no anonymous memory to speak of, so nothing is ever OOM-killed.
 * Prints one line of key=value pairs on stdout:
 *   pid=... bytes=... passes=... wall_s=... mib_per_s=... cpu_s=... majflt=... start_ns=...
 *   end_ns=...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "join.h"

#define BLOCK (1 << 20)

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: %s FILE SECONDS\n", argv[0]);
		return 2;
	}
	double seconds = atof(argv[2]);
	if (seconds <= 0) {
		fprintf(stderr, "wr-reclaim: bad arguments\n");
		return 2;
	}
	join_cgroup_from_env();
	int fd = open(argv[1], O_RDONLY);
	if (fd < 0) {
		perror("wr-reclaim: open");
		return 1;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	static char buf[BLOCK];
	long long bytes = 0, passes = 0;
	long long start_boot = now_ns(CLOCK_BOOTTIME);
	long long start = now_ns(CLOCK_MONOTONIC);
	long long limit = start + (long long)(seconds * 1e9);
	long long now = start;
	while (now < limit) {
		ssize_t r = read(fd, buf, BLOCK);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			perror("wr-reclaim: read");
			return 1;
		}
		if (r == 0) {
			passes++;
			if (lseek(fd, 0, SEEK_SET) != 0) {
				perror("wr-reclaim: lseek");
				return 1;
			}
			continue;
		}
		bytes += r;
		now = now_ns(CLOCK_MONOTONIC);
	}
	long long end_boot = now_ns(CLOCK_BOOTTIME);
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
		     ru.ru_stime.tv_usec / 1e6;
	double wall = (now - start) / 1e9;
	printf("pid=%d bytes=%lld passes=%lld wall_s=%.6f mib_per_s=%.1f cpu_s=%.4f majflt=%ld "
	       "start_ns=%lld end_ns=%lld\n",
	       (int)getpid(), bytes, passes, wall, bytes / wall / 1048576.0, cpu, ru.ru_majflt,
	       start_boot, end_boot);
	return 0;
}
