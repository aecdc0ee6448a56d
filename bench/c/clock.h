/* clock.h: shared by scripts/bench's helpers. now_ns(CLOCK_BOOTTIME) is the clock the tracer's
 * event timestamps use (so helper and trace times compare); CLOCK_MONOTONIC paces the loops.
 */
#ifndef WR_CLOCK_H
#define WR_CLOCK_H
#include <time.h>

static inline long long now_ns(clockid_t c) {
	struct timespec ts;
	clock_gettime(c, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
#endif
