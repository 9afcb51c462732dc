package bitroute.bench.kstreams;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The Kafka Streams peer of bitroute's router (issue 22): reads the publishes topic, matches
 * each publish against an in-memory trie of the subscription changelog and writes one record
 * per matched subscriber to {@code <prefix><subscriber>} through a dynamic
 * {@link org.apache.kafka.streams.processor.TopicNameExtractor}, with bitroute's delivery
 * headers ({@link RouteProcessor}).
 *
 * <pre>
 * java -cp 'target/kstreams-peer.jar:target/lib/*' bitroute.bench.kstreams.Main
 *     --bootstrap HOST:PORT --state-dir DIR
 *     [--publishes-topic T] [--subscriptions-topic T] [--deliveries-prefix P]
 *     [--delivery-partitions N] [--default-exchange E] [--exchange NAME=DIALECT]...
 *     [--set streams.or.client.key=value]...
 * </pre>
 *
 * <p>stdout, for benchmarks/e2e (one JSON object a line after its tag): {@code STARTED} once
 * the topology runs with the changelog read to its end ({@code open_s}, {@code subscriptions},
 * {@code version}); then every second {@code PROBE} with the publishes processed
 * ({@code rows}), deliveries acknowledged by Kafka ({@code deliveries}), forwarded, rejected,
 * and the wall-clock {@code end}. Kafka's logs (warnings and up) and errors go to stderr.
 * SIGTERM closes the topology (its producers flush, its offsets are committed) and exits 0.
 */
public final class Main {
    private static final Duration CATCH_UP_TIMEOUT = Duration.ofMinutes(10);
    private static final long PROBE_MS = 1000;

    private Main() {}

    public static void main(String[] argv) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        long t0 = System.nanoTime();
        Args args = Args.parse(argv);

        Subscriptions subscriptions = new Subscriptions(args.dialects);
        ChangelogFollower follower = new ChangelogFollower(subscriptions, args.bootstrap,
                args.subscriptionsTopic, args.deliveriesPrefix, args.deliveryPartitions);
        follower.catchUp(CATCH_UP_TIMEOUT);
        System.err.printf(Locale.ROOT, "kstreams-peer: changelog read (%d subscriptions, %d refused) and "
                        + "%d delivery topics ensured in %.1fs%n", subscriptions.size(), follower.refused(),
                subscriptions.subscribers().size(), (System.nanoTime() - t0) / 1e9);
        Thread followerThread = new Thread(follower, "changelog-follower");
        followerThread.setDaemon(true);
        followerThread.start();

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args.publishesTopic, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .process(() -> new RouteProcessor(subscriptions, args.defaultExchange))
                .to(DeliveryKey.topics(args.deliveriesPrefix),
                        Produced.with(DeliveryKey.SERDE, Serdes.ByteArray()));
        KafkaStreams streams = new KafkaStreams(builder.build(), settings(args));

        CountDownLatch running = new CountDownLatch(1);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                running.countDown();
            } else if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        // A thread that dies is a bug or a broker failure: stop, and let the harness see it.
        streams.setUncaughtExceptionHandler(e -> {
            System.err.println("kstreams-peer: stream thread failed: " + e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            follower.close();
            streams.close(Duration.ofSeconds(60));
        }, "shutdown"));
        streams.start();
        while (!running.await(100, TimeUnit.MILLISECONDS)) {
            if (stopped.getCount() == 0) {
                System.err.println("kstreams-peer: the topology stopped before running");
                System.exit(1);
            }
        }
        System.err.printf(Locale.ROOT, "kstreams-peer: topology running after %.1fs%n",
                (System.nanoTime() - t0) / 1e9);
        System.out.printf(Locale.ROOT, "STARTED {\"open_s\": %.3f, \"subscriptions\": %d, \"version\": %d}%n",
                (System.nanoTime() - t0) / 1e9, subscriptions.size(), subscriptions.version());
        System.out.flush();

        Thread probes = new Thread(() -> probe(subscriptions), "probes");
        probes.setDaemon(true);
        probes.start();
        stopped.await();
        follower.close();
        followerThread.join();
        follower.release();
        if (streams.state() == KafkaStreams.State.ERROR) {
            System.exit(1);
        }
    }

    /**
     * The Streams and client settings a Kafka shop would run this topology with on this machine
     * (2 cores shared with the broker, the load driver and the delivery consumer), each with why.
     * {@code --set} overrides any of them (e.g. {@code --set num.stream.threads=1}).
     */
    static Properties settings(Args args) {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, "bitroute-kstreams-peer");
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap);
        p.put(StreamsConfig.STATE_DIR_CONFIG, args.stateDir);
        // At-least-once, bitroute's delivery guarantee (a re-run may repeat a delivery, with the
        // same message id). exactly_once_v2 would add transactions bitroute does not pay for.
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        // One thread per publishes partition (kafka.partitions = 2): a task is one input
        // partition and more threads would idle; two threads can use both cores when the broker
        // leaves them room. Each thread has its own producer (at-least-once).
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        // Commit (flush the producer, then commit input offsets) every second instead of the
        // at-least-once default of 30 s: a restart re-runs at most about a second of publishes,
        // as bitroute re-runs at most its batch in progress. The flush costs little at 1/s.
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        // Stateless topology: no store, no record cache.
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        // Deliveries fan out over one topic per subscriber (1,000 single-partition topics): a
        // partition gets ~8 x publishes/s / 1,000 records a second, so only a long linger puts
        // more than one record in a partition's batch, and the broker's cost is per partition
        // batch. 100 ms is Streams' own default, stated here because it is the choice that
        // matters: ~4 records per batch at 50k deliveries/s, and at most 0.1 s added to the
        // latency (the issue's p99 budget is 0.5 s).
        p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 100);
        // batch.size stays at 16 KB (a partition's batch here is ~1 KB, far below), because the
        // producer reserves batch.size per open partition batch: 1,000 open batches x 16 KB is
        // 16 MB of the buffer, x 64 KB would exceed the default 32 MB and block sends.
        p.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), 16_384);
        // Room for 1,000 open batches plus the batches in flight: 64 MB per producer.
        p.put(StreamsConfig.producerPrefix(ProducerConfig.BUFFER_MEMORY_CONFIG), 64L << 20);
        // Loopback: compression costs CPU and saves no wire time (bitroute's producer: none).
        p.put(StreamsConfig.producerPrefix(ProducerConfig.COMPRESSION_TYPE_CONFIG), "none");
        // acks=all with the idempotent producer (the clients' defaults, as bitroute's producer).
        p.put(StreamsConfig.producerPrefix(ProducerConfig.ACKS_CONFIG), "all");
        p.put(StreamsConfig.producerPrefix(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG), true);
        // Counts Kafka's acks for the progress lines.
        p.put(StreamsConfig.producerPrefix(ProducerConfig.INTERCEPTOR_CLASSES_CONFIG),
                AckCounter.class.getName());
        p.putAll(args.overrides);
        return p;
    }

    private static void probe(Subscriptions subscriptions) {
        long batch = 0;
        long lastT = System.nanoTime();
        long lastP = 0;
        long lastA = 0;
        long lastF = 0;
        long lastR = 0;
        while (true) {
            try {
                Thread.sleep(PROBE_MS);
            } catch (InterruptedException e) {
                return;
            }
            long t = System.nanoTime();
            long p = RouteProcessor.PUBLISHES.sum();
            long a = AckCounter.ACKED.sum();
            long f = RouteProcessor.FORWARDED.sum();
            long r = RouteProcessor.REJECTED.sum();
            System.out.printf(Locale.ROOT, "PROBE {\"batch\": %d, \"rows\": %d, \"deliveries\": %d, "
                            + "\"forwarded\": %d, \"rejected\": %d, \"failed\": %d, \"version\": %d, "
                            + "\"seconds\": %.3f, \"end\": %.3f}%n",
                    batch++, p - lastP, a - lastA, f - lastF, r - lastR, AckCounter.FAILED.sum(),
                    subscriptions.version(), (t - lastT) / 1e9, System.currentTimeMillis() / 1e3);
            System.out.flush();
            lastT = t;
            lastP = p;
            lastA = a;
            lastF = f;
            lastR = r;
        }
    }

    /** The command line (see the class comment); defaults are bitroute's configuration defaults. */
    static final class Args {
        String bootstrap;
        String stateDir;
        String publishesTopic = "bitroute.publishes";
        String subscriptionsTopic = "bitroute.subscriptions";
        String deliveriesPrefix = "bitroute.deliveries.";
        int deliveryPartitions = 1;
        String defaultExchange = "amq.topic";
        Map<String, String> dialects = new LinkedHashMap<>();
        Map<String, String> overrides = new LinkedHashMap<>();

        static Args parse(String[] argv) {
            Args a = new Args();
            for (int i = 0; i < argv.length; i++) {
                String flag = argv[i];
                if (i + 1 >= argv.length) {
                    throw usage(flag + " needs a value");
                }
                String v = argv[++i];
                switch (flag) {
                    case "--bootstrap" -> a.bootstrap = v;
                    case "--state-dir" -> a.stateDir = v;
                    case "--publishes-topic" -> a.publishesTopic = v;
                    case "--subscriptions-topic" -> a.subscriptionsTopic = v;
                    case "--deliveries-prefix" -> a.deliveriesPrefix = v;
                    case "--delivery-partitions" -> a.deliveryPartitions = Integer.parseInt(v);
                    case "--default-exchange" -> a.defaultExchange = v;
                    case "--exchange" -> put(a.dialects, v, flag);
                    case "--set" -> put(a.overrides, v, flag);
                    default -> throw usage("unknown option " + flag);
                }
            }
            if (a.bootstrap == null || a.stateDir == null) {
                throw usage("--bootstrap and --state-dir are required");
            }
            if (a.dialects.isEmpty()) {
                a.dialects.put("amq.topic", "amqp");
                a.dialects.put("mqtt", "mqtt");
            }
            return a;
        }

        private static void put(Map<String, String> m, String pair, String flag) {
            int eq = pair.indexOf('=');
            if (eq <= 0) {
                throw usage(flag + " expects NAME=VALUE, not " + pair);
            }
            m.put(pair.substring(0, eq), pair.substring(eq + 1));
        }

        private static IllegalArgumentException usage(String why) {
            return new IllegalArgumentException("kstreams-peer: " + why);
        }
    }
}
