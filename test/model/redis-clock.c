/*
 * A controlled wall clock for a private redis-server, loaded with LD_PRELOAD by test/model/redis.ts.
 * While the 8 bytes of the file named by REDIS_CLOCK_FILE hold a positive number (epoch ms, little
 * endian), the server's wall clock (gettimeofday, time, clock_gettime(CLOCK_REALTIME)) stands at
 * that instant: TIME in scripts, key expiry and TTLs all read it, and it moves only when the test
 * writes a new value. The monotonic clock is left alone, so the event loop and its timers run.
 * Only system calls are used here: no malloc, no dlsym, nothing that could read the clock itself.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *clock_ms = 0;
static int opened = 0;

static int64_t controlled_ms(void) {
  if (!opened) {
    opened = 1;
    const char *path = getenv("REDIS_CLOCK_FILE");
    if (path) {
      int fd = (int)syscall(SYS_open, path, O_RDONLY);
      if (fd >= 0) {
        void *map = (void *)syscall(SYS_mmap, 0, 8, PROT_READ, MAP_SHARED, fd, 0);
        if (map != MAP_FAILED) clock_ms = (volatile int64_t *)map;
        syscall(SYS_close, fd);
      }
    }
  }
  return clock_ms ? *clock_ms : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  int64_t ms;
  if ((id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) && (ms = controlled_ms()) > 0) {
    ts->tv_sec = ms / 1000;
    ts->tv_nsec = (ms % 1000) * 1000000;
    return 0;
  }
  return (int)syscall(SYS_clock_gettime, id, ts);
}

int gettimeofday(struct timeval *tv, void *tz) {
  int64_t ms = controlled_ms();
  if (ms > 0) {
    tv->tv_sec = ms / 1000;
    tv->tv_usec = (ms % 1000) * 1000;
    return 0;
  }
  return (int)syscall(SYS_gettimeofday, tv, tz);
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}
