/* Shifts the wall clock of the process it is preloaded into (LD_PRELOAD) by a number of
 * seconds read from the file named by CLOCKSHIFT_FILE at every clock call, so a test can move
 * a running server's clock. Only the wall clock moves (gettimeofday, time, clock_gettime of the
 * REALTIME clocks); the monotonic clocks stay real. Uses raw system calls only: it runs inside
 * the allocator's and the loader's own clock calls, where calling malloc or dlsym would
 * recurse. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_seconds(void) {
    static const char *path = 0;
    static int looked = 0;
    if (!looked) {
        extern char **environ;
        looked = 1;
        for (char **e = environ; e && *e; e++) {
            const char *k = "CLOCKSHIFT_FILE=";
            const char *s = *e;
            int i = 0;
            while (k[i] && s[i] == k[i]) i++;
            if (!k[i]) { path = s + i; break; }
        }
    }
    if (!path) return 0;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
    if (fd < 0) return 0;
    char buf[32];
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    long long v = 0;
    int i = 0, neg = 0;
    if (buf[0] == '-' || buf[0] == '+') { neg = buf[0] == '-'; i = 1; }
    for (; buf[i] >= '0' && buf[i] <= '9'; i++) v = v * 10 + (buf[i] - '0');
    return neg ? -v : v;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && ts && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE))
        ts->tv_sec += offset_seconds();
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int r = (int)syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (r != 0) return r;
    if (tv) {
        tv->tv_sec = ts.tv_sec + offset_seconds();
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    time_t now = ts.tv_sec + offset_seconds();
    if (t) *t = now;
    return now;
}
