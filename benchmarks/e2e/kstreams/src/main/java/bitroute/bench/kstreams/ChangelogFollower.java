package bitroute.bench.kstreams;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Reads bitroute's subscription changelog into {@link Subscriptions}: {@link #catchUp} to the
 * end offsets it finds (before the topology starts, as bitroute's router rebuilds before its
 * query runs), then {@link #run} follows it. A subscriber seen for the first time gets its
 * delivery topic ({@code prefix + subscriber}, {@code partitions} partitions) before any of its
 * deliveries is produced: the dynamic sink needs the topic to exist.
 */
final class ChangelogFollower implements Runnable, AutoCloseable {
    private static final int LOGGED_REFUSALS = 10;

    private final Subscriptions subscriptions;
    private final KafkaConsumer<byte[], byte[]> consumer;
    private final Admin admin;
    private final String topic;
    private final String prefix;
    private final int partitions;
    private final Set<String> provisioned = new TreeSet<>();
    private long refused;
    private volatile boolean closed;

    ChangelogFollower(Subscriptions subscriptions, String bootstrap, String topic, String prefix,
                      int partitions) {
        this.subscriptions = subscriptions;
        this.topic = topic;
        this.prefix = prefix;
        this.partitions = partitions;
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "10000");
        this.consumer = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        Properties a = new Properties();
        a.put("bootstrap.servers", bootstrap);
        this.admin = Admin.create(a);
    }

    /** Read the changelog from its start to the end offsets it has now; create new subscribers' topics. */
    void catchUp(Duration timeout) throws InterruptedException, ExecutionException {
        List<TopicPartition> parts = new ArrayList<>();
        consumer.partitionsFor(topic, timeout).forEach(p -> parts.add(new TopicPartition(topic, p.partition())));
        consumer.assign(parts);
        consumer.seekToBeginning(parts);
        Map<TopicPartition, Long> end = consumer.endOffsets(parts, timeout);
        long deadline = System.nanoTime() + timeout.toNanos();
        while (parts.stream().anyMatch(tp -> consumer.position(tp) < end.get(tp))) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("changelog " + topic + " not read to its end in " + timeout);
            }
            apply(consumer.poll(Duration.ofMillis(200)));
        }
        provision();
    }

    @Override
    public void run() {
        try {
            while (!closed) {
                var records = consumer.poll(Duration.ofMillis(500));
                if (!records.isEmpty()) {
                    apply(records);
                    provision();
                }
            }
        } catch (WakeupException e) {
            if (!closed) {
                throw e;
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (ExecutionException e) {
            System.err.println("kstreams-peer: creating delivery topics failed: " + e.getCause());
        }
    }

    private void apply(Iterable<ConsumerRecord<byte[], byte[]>> records) {
        for (ConsumerRecord<byte[], byte[]> r : records) {
            String id = r.key() == null ? "" : new String(r.key(), StandardCharsets.UTF_8);
            String why = subscriptions.apply(id, r.value());
            if (why != null && ++refused <= LOGGED_REFUSALS) {
                System.err.println("kstreams-peer: subscription " + id + " not applied: " + why);
            }
        }
    }

    private void provision() throws InterruptedException, ExecutionException {
        List<NewTopic> missing = new ArrayList<>();
        for (String s : subscriptions.subscribers()) {
            if (provisioned.add(s)) {
                missing.add(new NewTopic(prefix + s, Optional.of(partitions), Optional.empty()));
            }
        }
        if (missing.isEmpty()) {
            return;
        }
        for (var f : admin.createTopics(missing).values().values()) {
            try {
                f.get();
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof TopicExistsException)) {
                    throw e;
                }
            }
        }
    }

    long refused() {
        return refused;
    }

    @Override
    public void close() {
        closed = true;
        consumer.wakeup();
    }

    /** After {@link #run} returned (the consumer is not thread-safe). */
    void release() {
        consumer.close();
        admin.close(Duration.ofSeconds(5));
    }
}
