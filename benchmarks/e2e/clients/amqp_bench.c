/* RabbitMQ side of the end-to-end benchmark (rabbitmq-c, Debian librabbitmq-dev).
 *
 *   amqp_bench setup   --port P --subs subs.tsv
 *       one topic exchange "bench", one queue per subscriber "q.<subscriber>",
 *       one binding per subscription (MQTT filter translated: / -> ., + -> *, # -> #);
 *       bindings are pipelined (nowait) and confirmed by one final round trip.
 *   amqp_bench purge   --port P --subs subs.tsv
 *       empty every queue (between runs: a full-speed run leaves a backlog).
 *   amqp_bench consume --port P --subs subs.tsv --threads T [--idle S]
 *       T connections, each consuming (no-ack) its share of the queues; prints READY
 *       on stderr once every basic.consume is confirmed, reads "window_start
 *       window_end deadline" (epoch seconds) on stdin, then the JSON report.
 *   amqp_bench publish --port P --topics publishes.txt --rate R --duration S
 *                      --window-start S --window-end S [--payload BYTES]
 *       one connection, one channel, basic.publish (no confirms, transient), paced at
 *       R msgs/s (0: as fast as the socket and RabbitMQ's flow control allow).
 */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <pthread.h>
#include <unistd.h>

#include "bench_common.h"

#define EXCHANGE "bench"

static const char *host = "127.0.0.1";
static int port = 5672;

static void die_on_reply(amqp_rpc_reply_t r, const char *what) {
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return;
  fprintf(stderr, "amqp_bench: %s failed (reply type %d", what, r.reply_type);
  if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
    fprintf(stderr, ": %s", amqp_error_string2(r.library_error));
  if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
      r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
    amqp_channel_close_t *c = r.reply.decoded;
    fprintf(stderr, ": %.*s", (int)c->reply_text.len, (char *)c->reply_text.bytes);
  }
  fprintf(stderr, ")\n");
  exit(1);
}

static amqp_connection_state_t open_conn(void) {
  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t *sock = amqp_tcp_socket_new(conn);
  if (!sock || amqp_socket_open(sock, host, port) != AMQP_STATUS_OK) {
    fprintf(stderr, "amqp_bench: cannot connect to %s:%d\n", host, port);
    exit(1);
  }
  die_on_reply(amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"),
               "login");
  amqp_channel_open(conn, 1);
  die_on_reply(amqp_get_rpc_reply(conn), "channel.open");
  return conn;
}

static void close_conn(amqp_connection_state_t conn) {
  amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
}

static void translate(const char *mqtt, char *out, size_t cap) {
  size_t j = 0;
  for (size_t i = 0; mqtt[i] && j + 1 < cap; i++) {
    char c = mqtt[i];
    out[j++] = c == '/' ? '.' : c == '+' ? '*' : c;
  }
  out[j] = 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char **)a, *(char **)b); }

/* Distinct subscribers, sorted. */
static char **subscribers_of(char **subs, size_t n, size_t *count) {
  char **out = malloc(n * sizeof *out);
  size_t k = 0;
  char **names = malloc(n * sizeof *names);
  for (size_t i = 0; i < n; i++) {
    char *tab = strchr(subs[i], '\t');
    names[i] = strndup(subs[i], tab - subs[i]);
  }
  qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n; i++)
    if (k == 0 || strcmp(out[k - 1], names[i]) != 0) out[k++] = names[i];
  *count = k;
  return out;
}

static int do_setup(const char *subs_path) {
  size_t n, nq;
  char **lines = read_lines(subs_path, &n);
  char **queues = subscribers_of(lines, n, &nq);
  amqp_connection_state_t conn = open_conn();
  amqp_exchange_declare(conn, 1, amqp_cstring_bytes(EXCHANGE), amqp_cstring_bytes("topic"), 0, 0,
                        0, 0, amqp_empty_table);
  die_on_reply(amqp_get_rpc_reply(conn), "exchange.declare");
  char name[512], key[512];
  for (size_t i = 0; i < nq; i++) {
    snprintf(name, sizeof name, "q.%s", queues[i]);
    amqp_queue_declare(conn, 1, amqp_cstring_bytes(name), 0, 0, 0, 0, amqp_empty_table);
    die_on_reply(amqp_get_rpc_reply(conn), "queue.declare");
  }
  double t0 = now_s();
  for (size_t i = 0; i < n; i++) {
    char *sub, *filt;
    split_sub(lines[i], &sub, &filt);
    snprintf(name, sizeof name, "q.%s", sub);
    translate(filt, key, sizeof key);
    amqp_queue_bind_t bind = {0, amqp_cstring_bytes(name), amqp_cstring_bytes(EXCHANGE),
                              amqp_cstring_bytes(key), 1, amqp_empty_table};
    if (amqp_send_method(conn, 1, AMQP_QUEUE_BIND_METHOD, &bind) != AMQP_STATUS_OK) {
      fprintf(stderr, "amqp_bench: queue.bind send failed\n");
      return 1;
    }
  }
  /* The channel handles methods in order: this reply comes after every binding. */
  amqp_queue_declare(conn, 1, amqp_cstring_bytes(name), 1, 0, 0, 0, amqp_empty_table);
  die_on_reply(amqp_get_rpc_reply(conn), "bindings");
  printf("{\"system\":\"rabbitmq\",\"role\":\"setup\",\"queues\":%zu,\"bindings\":%zu,"
         "\"bind_s\":%.3f}\n", nq, n, now_s() - t0);
  close_conn(conn);
  return 0;
}

/* Set by the main thread once every consumer is READY (read_window). */
static volatile window_t shared_win = {1e18, 1e18};
static volatile double shared_deadline = 1e18;

/* Empty every queue: what a full-speed run left behind must not reach the next run. */
static int do_purge(const char *subs_path) {
  size_t n, nq;
  char **lines = read_lines(subs_path, &n);
  char **queues = subscribers_of(lines, n, &nq);
  amqp_connection_state_t conn = open_conn();
  char name[512];
  uint64_t purged = 0;
  for (size_t i = 0; i < nq; i++) {
    snprintf(name, sizeof name, "q.%s", queues[i]);
    amqp_queue_purge_ok_t *ok = amqp_queue_purge(conn, 1, amqp_cstring_bytes(name));
    die_on_reply(amqp_get_rpc_reply(conn), "queue.purge");
    purged += ok->message_count;
  }
  printf("{\"system\":\"rabbitmq\",\"role\":\"purge\",\"purged\":%llu}\n",
         (unsigned long long)purged);
  close_conn(conn);
  return 0;
}

typedef struct {
  char **queues;
  size_t nq;
  double idle;
  hist_t hist;
  uint64_t received, window_arrivals;
  double last_arrival;
  int ready;
} consumer_t;

static pthread_mutex_t ready_mu = PTHREAD_MUTEX_INITIALIZER;
static int ready_count = 0;

static void *consume_thread(void *arg) {
  consumer_t *c = arg;
  amqp_connection_state_t conn = open_conn();
  char name[512];
  for (size_t i = 0; i < c->nq; i++) {
    snprintf(name, sizeof name, "q.%s", c->queues[i]);
    amqp_basic_consume(conn, 1, amqp_cstring_bytes(name), amqp_empty_bytes, 0, 1, 0,
                       amqp_empty_table);
    die_on_reply(amqp_get_rpc_reply(conn), "basic.consume");
  }
  pthread_mutex_lock(&ready_mu);
  ready_count++;
  pthread_mutex_unlock(&ready_mu);
  double last = now_s();
  struct timeval tv = {0, 200000};
  for (;;) {
    amqp_envelope_t env;
    amqp_maybe_release_buffers(conn);
    amqp_rpc_reply_t r = amqp_consume_message(conn, &env, &tv, 0);
    double t = now_s();
    window_t w = shared_win;
    if (r.reply_type == AMQP_RESPONSE_NORMAL) {
      int64_t recv = now_ns();
      c->received++;
      if (in_window(&w, t)) c->window_arrivals++;
      if (env.message.body.len >= 8) {
        int64_t sent;
        memcpy(&sent, env.message.body.bytes, 8);
        if (in_window(&w, sent / 1e9)) hist_add(&c->hist, recv - sent);
      }
      amqp_destroy_envelope(&env);
      last = t;
      c->last_arrival = t;
    } else if (!(r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                 r.library_error == AMQP_STATUS_TIMEOUT)) {
      die_on_reply(r, "consume");
    }
    if (t > shared_deadline) break;
    if (t > w.window_end && t - last > c->idle) break;
  }
  close_conn(conn);
  return NULL;
}

static int do_consume(int argc, char **argv) {
  size_t n, nq;
  char **lines = read_lines(arg_str(argc, argv, "--subs", "subs.tsv"), &n);
  char **queues = subscribers_of(lines, n, &nq);
  int threads = (int)arg_num(argc, argv, "--threads", 4);
  double idle = arg_num(argc, argv, "--idle", 3);
  consumer_t *cs = calloc(threads, sizeof *cs);
  pthread_t *tids = calloc(threads, sizeof *tids);
  for (int t = 0; t < threads; t++) {
    cs[t].queues = malloc(nq * sizeof(char *));
    for (size_t i = t; i < nq; i += threads) cs[t].queues[cs[t].nq++] = queues[i];
    cs[t].idle = idle;
    pthread_create(&tids[t], NULL, consume_thread, &cs[t]);
  }
  for (int spins = 0; spins < 6000; spins++) {
    pthread_mutex_lock(&ready_mu);
    int r = ready_count;
    pthread_mutex_unlock(&ready_mu);
    if (r == threads) break;
    usleep(10000);
  }
  fprintf(stderr, "READY\n");
  fflush(stderr);
  window_t w;
  double deadline;
  read_window(&w, &deadline);
  shared_win = w;
  shared_deadline = deadline;
  hist_t total = {0};
  uint64_t received = 0, arrivals = 0;
  double last = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(tids[t], NULL);
    hist_merge(&total, &cs[t].hist);
    received += cs[t].received;
    arrivals += cs[t].window_arrivals;
    if (cs[t].last_arrival > last) last = cs[t].last_arrival;
  }
  report_consumer("rabbitmq", received, arrivals, &w, &total, last);
  return 0;
}

static int do_publish(int argc, char **argv) {
  size_t n;
  char **topics = read_lines(arg_str(argc, argv, "--topics", "publishes.txt"), &n);
  for (size_t i = 0; i < n; i++) translate(topics[i], topics[i], strlen(topics[i]) + 1);
  double rate = arg_num(argc, argv, "--rate", 0);
  double duration = arg_num(argc, argv, "--duration", 10);
  window_t w = {arg_num(argc, argv, "--window-start", 0), arg_num(argc, argv, "--window-end", 0)};
  size_t payload_len = (size_t)arg_num(argc, argv, "--payload", 64);
  if (payload_len < 8) payload_len = 8;
  char *payload = calloc(1, payload_len);
  amqp_connection_state_t conn = open_conn();
  amqp_basic_properties_t props = {0};
  amqp_bytes_t exchange = amqp_cstring_bytes(EXCHANGE);
  int64_t start = now_ns(), end = start + (int64_t)(duration * 1e9);
  uint64_t sent = 0, in_win = 0;
  size_t i = 0;
  for (;;) {
    int64_t t = now_ns();
    if (t >= end) break;
    uint64_t target = paced_target(start, rate, sent);
    if (sent >= target) {
      sleep_until_ns(t + 200000);
      continue;
    }
    /* A burst of at most 256, then look at the clock again. */
    for (int k = 0; k < 256 && sent < target; k++) {
      int64_t ts = now_ns();
      memcpy(payload, &ts, 8);
      amqp_bytes_t body = {payload_len, payload};
      if (amqp_basic_publish(conn, 1, exchange, amqp_cstring_bytes(topics[i]), 0, 0, &props,
                             body) != AMQP_STATUS_OK) {
        fprintf(stderr, "amqp_bench: publish failed\n");
        return 1;
      }
      if (in_window(&w, ts / 1e9)) in_win++;
      sent++;
      if (++i == n) i = 0;
    }
  }
  report_publisher("rabbitmq", sent, in_win, &w, (now_ns() - start) / 1e9);
  close_conn(conn);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: amqp_bench setup|purge|consume|publish [options]\n");
    return 2;
  }
  host = arg_str(argc, argv, "--host", host);
  port = (int)arg_num(argc, argv, "--port", port);
  if (strcmp(argv[1], "setup") == 0) return do_setup(arg_str(argc, argv, "--subs", "subs.tsv"));
  if (strcmp(argv[1], "purge") == 0) return do_purge(arg_str(argc, argv, "--subs", "subs.tsv"));
  if (strcmp(argv[1], "consume") == 0) return do_consume(argc, argv);
  if (strcmp(argv[1], "publish") == 0) return do_publish(argc, argv);
  fprintf(stderr, "amqp_bench: unknown mode %s\n", argv[1]);
  return 2;
}
