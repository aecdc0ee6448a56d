/* wr-fail: the failures scripts/bench's agent section makes (compiled at bench time with gcc).
 *
 *   wr-fail oom        allocate and touch 1 MiB at a time until the kernel kills it: run inside
 *                      a child memory cgroup with a small limit (WR_JOIN_CGROUP), it is OOM-killed
 *   wr-fail sig N      send itself signal N (a fatal one: SIGTERM, SIGKILL; no core dump)
 *
 * Neither prints anything or returns normally when it works; exit status 4 says it did not die.
 * WR_JOIN_CGROUP: see join.h.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "join.h"

int main(int argc, char **argv) {
	if (argc < 2)
		return 2;
	join_cgroup_from_env();
	if (strcmp(argv[1], "oom") == 0) {
		for (int i = 0; i < 1 << 16; i++) { /* 64 GiB: far past any limit the bench sets */
			char *p = malloc(1 << 20);
			if (!p)
				return 4;
			memset(p, i & 0xff, 1 << 20);
		}
		return 4;
	}
	if (strcmp(argv[1], "sig") == 0 && argc > 2) {
		kill(getpid(), atoi(argv[2]));
		pause();
	}
	return 4;
}
