/* Mosquitto side of the end-to-end benchmark: a minimal MQTT 3.1.1 client over
 * plain sockets (QoS 0 only), so that the client is never the bottleneck and
 * the publisher gets TCP back-pressure (libmosquitto queues QoS 0 publishes
 * without bound when the broker falls behind).
 *
 *   mqtt_bench consume --port P --subs subs.tsv --clients K [--idle S]
 *       K clean-session connections, served by one epoll thread; the filters of the
 *       i-th subscriber (sorted by name) go to client (i mod K), 200 filters per
 *       SUBSCRIBE. Mosquitto sends a client one copy of a message however many of
 *       its subscriptions match, so K >= subscribers gives one delivery per
 *       (message, subscriber), as RabbitMQ's queues and bitroute's topics do. Prints READY on
 *       stderr once every SUBACK is in, reads "window_start window_end deadline" on stdin,
 *       then the JSON report.
 *   mqtt_bench publish --port P --topics publishes.txt --rate R --duration S
 *                      --window-start S --window-end S [--payload BYTES]
 *       one connection, QoS 0 PUBLISH packets written in 64 KiB batches.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_common.h"

static const char *host = "127.0.0.1";
static int port = 1883;

static int connect_tcp(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, host, &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    fprintf(stderr, "mqtt_bench: cannot connect to %s:%d: %s\n", host, port, strerror(errno));
    exit(1);
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  return fd;
}

static void write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "mqtt_bench: write: %s\n", strerror(errno));
      exit(1);
    }
    p += w;
    len -= w;
  }
}

static size_t put_varint(unsigned char *p, size_t v) {
  size_t n = 0;
  do {
    unsigned char b = v % 128;
    v /= 128;
    if (v) b |= 128;
    p[n++] = b;
  } while (v);
  return n;
}

static size_t put_str(unsigned char *p, const char *s, size_t len) {
  p[0] = len >> 8;
  p[1] = len & 255;
  memcpy(p + 2, s, len);
  return len + 2;
}

static void read_exact(int fd, unsigned char *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r <= 0) {
      fprintf(stderr, "mqtt_bench: connection closed by the broker\n");
      exit(1);
    }
    got += r;
  }
}

static int mqtt_connect(const char *client_id) {
  int fd = connect_tcp();
  unsigned char pkt[512], body[512];
  size_t b = 0;
  b += put_str(body + b, "MQTT", 4);
  body[b++] = 4;    /* protocol level 3.1.1 */
  body[b++] = 0x02; /* clean session */
  body[b++] = 0;    /* keep alive 0: off */
  body[b++] = 0;
  b += put_str(body + b, client_id, strlen(client_id));
  size_t p = 0;
  pkt[p++] = 0x10;
  p += put_varint(pkt + p, b);
  memcpy(pkt + p, body, b);
  write_all(fd, pkt, p + b);
  unsigned char ack[4];
  read_exact(fd, ack, 4);
  if (ack[0] != 0x20 || ack[3] != 0) {
    fprintf(stderr, "mqtt_bench: CONNACK refused (%d)\n", ack[3]);
    exit(1);
  }
  return fd;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char **)a, *(char **)b); }

/* --- consumer ------------------------------------------------------------------- */

typedef struct {
  int fd;
  unsigned char *buf;
  size_t len, cap;
  int pending_subacks;
} conn_t;

static window_t win;
static hist_t hist;
static uint64_t received, window_arrivals;
static double last_arrival;

/* Parse every complete packet in c->buf; returns bytes consumed. */
static size_t parse_packets(conn_t *c) {
  size_t off = 0;
  for (;;) {
    if (c->len - off < 2) break;
    size_t rem = 0, mul = 1, i = off + 1;
    int complete = 0;
    while (i < c->len) {
      unsigned char b = c->buf[i++];
      rem += (b & 127) * mul;
      mul *= 128;
      if (!(b & 128)) { complete = 1; break; }
    }
    if (!complete || c->len - i < rem) break;
    unsigned char type = c->buf[off] >> 4;
    unsigned char *body = c->buf + i;
    if (type == 3) { /* PUBLISH, QoS 0: topic, then payload */
      size_t tlen = (body[0] << 8) | body[1];
      unsigned char *payload = body + 2 + tlen;
      size_t plen = rem - 2 - tlen;
      int64_t recv = now_ns();
      double t = recv / 1e9;
      received++;
      if (in_window(&win, t)) window_arrivals++;
      last_arrival = t;
      if (plen >= 8) {
        int64_t sent;
        memcpy(&sent, payload, 8);
        if (in_window(&win, sent / 1e9)) hist_add(&hist, recv - sent);
      }
    } else if (type == 9) { /* SUBACK */
      for (size_t k = 2; k < rem; k++)
        if (body[k] == 0x80) { fprintf(stderr, "mqtt_bench: subscription refused\n"); exit(1); }
      c->pending_subacks--;
    }
    off = i + rem;
  }
  return off;
}

static int do_consume(int argc, char **argv) {
  size_t n;
  char **lines = read_lines(arg_str(argc, argv, "--subs", "subs.tsv"), &n);
  int k = (int)arg_num(argc, argv, "--clients", 4);
  win.window_start = win.window_end = 1e18;
  double deadline = 1e18;
  double idle = arg_num(argc, argv, "--idle", 3);
  conn_t *cs = calloc(k, sizeof *cs);
  char id[64];
  for (int j = 0; j < k; j++) {
    snprintf(id, sizeof id, "bench-sub-%d-%d", getpid(), j);
    cs[j].fd = mqtt_connect(id);
    cs[j].cap = 1 << 20;
    cs[j].buf = malloc(cs[j].cap);
  }
  /* Subscriber -> client: the subscriber's rank in sorted order, mod K; with K at
   * least the number of subscribers every subscriber is a client of its own. */
  char **names = malloc(n * sizeof *names);
  for (size_t i = 0; i < n; i++) {
    char *tab = strchr(lines[i], '\t');
    names[i] = strndup(lines[i], tab - lines[i]);
  }
  qsort(names, n, sizeof *names, cmp_str);
  size_t distinct = 0;
  for (size_t i = 0; i < n; i++)
    if (distinct == 0 || strcmp(names[distinct - 1], names[i]) != 0) names[distinct++] = names[i];
  enum { PER_PACKET = 200 };
  unsigned char **pkts = calloc(k, sizeof *pkts);
  size_t *plen = calloc(k, sizeof *plen), *pcount = calloc(k, sizeof *pcount);
  uint16_t packet_id = 1;
  for (int j = 0; j < k; j++) pkts[j] = malloc(PER_PACKET * 300 + 16);
  (void)distinct;
  for (size_t i = 0; i <= n; i++) {
    int j = -1;
    char *sub = NULL, *filt = NULL;
    if (i < n) {
      split_sub(lines[i], &sub, &filt);
      char **hit = bsearch(&sub, names, distinct, sizeof *names, cmp_str);
      j = (int)((hit - names) % k);
      plen[j] += put_str(pkts[j] + 16 + plen[j], filt, strlen(filt));
      pkts[j][16 + plen[j]++] = 0; /* QoS 0 */
      pcount[j]++;
    }
    for (int m = 0; m < k; m++) {
      if (pcount[m] == 0 || (pcount[m] < PER_PACKET && i < n)) continue;
      unsigned char head[8];
      size_t h = 0;
      head[h++] = 0x82;
      h += put_varint(head + h, plen[m] + 2);
      head[h++] = packet_id >> 8;
      head[h++] = packet_id & 255;
      if (++packet_id == 0) packet_id = 1;
      unsigned char *start = pkts[m] + 16 - h;
      memcpy(start, head, h);
      write_all(cs[m].fd, start, h + plen[m]);
      cs[m].pending_subacks++;
      plen[m] = pcount[m] = 0;
    }
  }
  int ep = epoll_create1(0);
  for (int j = 0; j < k; j++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = j};
    epoll_ctl(ep, EPOLL_CTL_ADD, cs[j].fd, &ev);
  }
  int ready = 0;
  double last = now_s();
  struct epoll_event evs[64];
  for (;;) {
    int ne = epoll_wait(ep, evs, 64, 100);
    for (int e = 0; e < ne; e++) {
      conn_t *c = &cs[evs[e].data.u32];
      ssize_t r = read(c->fd, c->buf + c->len, c->cap - c->len);
      if (r <= 0) {
        fprintf(stderr, "mqtt_bench: connection closed by the broker\n");
        return 1;
      }
      c->len += r;
      size_t used = parse_packets(c);
      memmove(c->buf, c->buf + used, c->len - used);
      c->len -= used;
      last = now_s();
    }
    if (!ready) {
      int pending = 0;
      for (int j = 0; j < k; j++) pending += cs[j].pending_subacks;
      if (pending == 0) {
        ready = 1;
        fprintf(stderr, "READY\n");
        fflush(stderr);
        read_window(&win, &deadline);
      }
      last = now_s();
      continue;
    }
    double t = now_s();
    if (t > deadline) break;
    if (t > win.window_end && t - last > idle) break;
  }
  report_consumer("mosquitto", received, window_arrivals, &win, &hist, last_arrival);
  for (int j = 0; j < k; j++) close(cs[j].fd);
  return 0;
}

/* --- publisher ------------------------------------------------------------------ */

static int do_publish(int argc, char **argv) {
  size_t n;
  char **topics = read_lines(arg_str(argc, argv, "--topics", "publishes.txt"), &n);
  size_t *tlen = malloc(n * sizeof *tlen);
  for (size_t i = 0; i < n; i++) tlen[i] = strlen(topics[i]);
  double rate = arg_num(argc, argv, "--rate", 0);
  double duration = arg_num(argc, argv, "--duration", 10);
  window_t w = {arg_num(argc, argv, "--window-start", 0), arg_num(argc, argv, "--window-end", 0)};
  size_t payload_len = (size_t)arg_num(argc, argv, "--payload", 64);
  if (payload_len < 8) payload_len = 8;
  char id[64];
  snprintf(id, sizeof id, "bench-pub-%d", getpid());
  int fd = mqtt_connect(id);
  enum { BUF = 64 << 10 };
  unsigned char *buf = malloc(BUF + 1024);
  size_t len = 0;
  int64_t start = now_ns(), end = start + (int64_t)(duration * 1e9);
  uint64_t sent = 0, in_win = 0;
  size_t i = 0;
  for (;;) {
    int64_t t = now_ns();
    if (t >= end) break;
    uint64_t target = paced_target(start, rate, sent);
    if (sent >= target) {
      if (len) { write_all(fd, buf, len); len = 0; }
      sleep_until_ns(t + 200000);
      continue;
    }
    for (int b = 0; b < 256 && sent < target; b++) {
      int64_t ts = now_ns();
      size_t rem = 2 + tlen[i] + payload_len;
      buf[len++] = 0x30;
      len += put_varint(buf + len, rem);
      len += put_str(buf + len, topics[i], tlen[i]);
      memcpy(buf + len, &ts, 8);
      memset(buf + len + 8, 'x', payload_len - 8);
      len += payload_len;
      if (in_window(&w, ts / 1e9)) in_win++;
      sent++;
      if (++i == n) i = 0;
      if (len >= BUF) { write_all(fd, buf, len); len = 0; }
    }
    if (rate > 0 && len) { write_all(fd, buf, len); len = 0; }
  }
  if (len) write_all(fd, buf, len);
  unsigned char disc[2] = {0xE0, 0};
  write_all(fd, disc, 2);
  report_publisher("mosquitto", sent, in_win, &w, (now_ns() - start) / 1e9);
  close(fd);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: mqtt_bench consume|publish [options]\n");
    return 2;
  }
  host = arg_str(argc, argv, "--host", host);
  port = (int)arg_num(argc, argv, "--port", port);
  if (strcmp(argv[1], "consume") == 0) return do_consume(argc, argv);
  if (strcmp(argv[1], "publish") == 0) return do_publish(argc, argv);
  fprintf(stderr, "mqtt_bench: unknown mode %s\n", argv[1]);
  return 2;
}
