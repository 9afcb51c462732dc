/* Shared by the benchmark's C clients: clocks, a latency histogram, the
 * workload files, pacing, and the one-line JSON report the Python harness parses.
 *
 * Every message carries its publish time (CLOCK_REALTIME, nanoseconds, 8 bytes
 * little-endian) at the start of its payload; a consumer's latency is its
 * receive time minus that. Publisher and consumers run on the same machine, so
 * the clocks agree.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline double now_s(void) { return (double)now_ns() / 1e9; }

static inline void sleep_until_ns(int64_t t) {
  int64_t d = t - now_ns();
  if (d <= 0) return;
  struct timespec ts = {d / 1000000000LL, d % 1000000000LL};
  nanosleep(&ts, NULL);
}

/* Latency histogram: buckets 1% wide in log space from 1 us to ~1000 s. */
#define HIST_BUCKETS 2100
typedef struct {
  uint64_t counts[HIST_BUCKETS];
  uint64_t n;
  double max_ms;
} hist_t;

static inline void hist_add(hist_t *h, int64_t lat_ns) {
  double us = lat_ns / 1000.0;
  int b = us <= 1.0 ? 0 : (int)(log(us) / log(1.01));
  if (b >= HIST_BUCKETS) b = HIST_BUCKETS - 1;
  if (b < 0) b = 0;
  h->counts[b]++;
  h->n++;
  if (lat_ns / 1e6 > h->max_ms) h->max_ms = lat_ns / 1e6;
}

static inline void hist_merge(hist_t *into, const hist_t *from) {
  for (int i = 0; i < HIST_BUCKETS; i++) into->counts[i] += from->counts[i];
  into->n += from->n;
  if (from->max_ms > into->max_ms) into->max_ms = from->max_ms;
}

static inline double hist_quantile_ms(const hist_t *h, double q) {
  if (h->n == 0) return -1;
  uint64_t target = (uint64_t)ceil(q * h->n), seen = 0;
  for (int i = 0; i < HIST_BUCKETS; i++) {
    seen += h->counts[i];
    if (seen >= target && h->counts[i]) return pow(1.01, i + 0.5) / 1000.0;
  }
  return h->max_ms;
}

/* Read a text file into an array of lines (newlines stripped). */
static char **read_lines(const char *path, size_t *count) {
  FILE *f = fopen(path, "r");
  if (!f) { perror(path); exit(2); }
  size_t cap = 1024, n = 0;
  char **lines = malloc(cap * sizeof *lines);
  char *line = NULL;
  size_t len = 0;
  ssize_t r;
  while ((r = getline(&line, &len, f)) > 0) {
    if (line[r - 1] == '\n') line[--r] = 0;
    if (n == cap) { cap *= 2; lines = realloc(lines, cap * sizeof *lines); }
    lines[n++] = strndup(line, r);
  }
  free(line);
  fclose(f);
  *count = n;
  return lines;
}

/* subs.tsv: "subscriber TAB filter" per line. Splits in place. */
static void split_sub(char *line, char **subscriber, char **filter) {
  char *tab = strchr(line, '\t');
  if (!tab) { fprintf(stderr, "bad subscription line: %s\n", line); exit(2); }
  *tab = 0;
  *subscriber = line;
  *filter = tab + 1;
}

/* Pacing: how many messages should have been sent by now at `rate` per second
 * (rate <= 0: no limit). */
static inline uint64_t paced_target(int64_t start_ns, double rate, uint64_t sent) {
  if (rate <= 0) return sent + 1000000;
  double elapsed = (now_ns() - start_ns) / 1e9;
  return (uint64_t)(elapsed * rate) + 1;
}

typedef struct {
  double window_start, window_end; /* epoch seconds */
} window_t;

static inline int in_window(const window_t *w, double t) {
  return t >= w->window_start && t < w->window_end;
}

/* After READY the harness writes "window_start window_end deadline" (epoch
 * seconds) on the consumer's stdin: the window is only known once subscribing is done. */
static void read_window(window_t *w, double *deadline) {
  double a, b, d;
  if (scanf("%lf %lf %lf", &a, &b, &d) != 3) {
    fprintf(stderr, "expected 'window_start window_end deadline' on stdin\n");
    exit(2);
  }
  *deadline = d;
  w->window_start = a;
  w->window_end = b;
}

static void report_consumer(const char *system, uint64_t received, uint64_t in_window_arrivals,
                            const window_t *w, const hist_t *h, double last_arrival) {
  printf("{\"system\":\"%s\",\"role\":\"consumer\",\"received\":%llu,\"window_arrivals\":%llu,"
         "\"window_s\":%.3f,\"latency_n\":%llu,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,"
         "\"last_arrival\":%.6f}\n",
         system, (unsigned long long)received, (unsigned long long)in_window_arrivals,
         w->window_end - w->window_start, (unsigned long long)h->n, hist_quantile_ms(h, 0.50),
         hist_quantile_ms(h, 0.99), h->max_ms, last_arrival);
  fflush(stdout);
}

static void report_publisher(const char *system, uint64_t published, uint64_t in_window,
                             const window_t *w, double elapsed) {
  printf("{\"system\":\"%s\",\"role\":\"publisher\",\"published\":%llu,\"window_published\":%llu,"
         "\"window_s\":%.3f,\"elapsed_s\":%.3f}\n",
         system, (unsigned long long)published, (unsigned long long)in_window,
         w->window_end - w->window_start, elapsed);
  fflush(stdout);
}

static const char *arg_str(int argc, char **argv, const char *name, const char *dflt) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}

static double arg_num(int argc, char **argv, const char *name, double dflt) {
  const char *s = arg_str(argc, argv, name, NULL);
  return s ? atof(s) : dflt;
}

#endif
