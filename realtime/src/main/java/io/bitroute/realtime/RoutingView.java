package io.bitroute.realtime;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InterruptException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The routing view of one executor JVM (realtime contract, sections 3 and 4): the table the
 * driver publishes to the view topic, loaded into the kernel, and the happens-before gate.
 *
 * <p>One per JVM and settings ({@link #of}), started on first use: a daemon thread follows
 * the view topic (one partition) from the beginning, keeps subscription id -> subscription,
 * and at each {@code mark} record builds the table JSON (section 2), loads it and swaps it
 * in with the mark's version and changelog marks. A mark that changes nothing the table holds
 * (no subscription, exchange or default exchange changed since the last) advances the version
 * and marks on the same native table. An old table is freed when its last task lets it go
 * ({@link RoutingTable}).
 *
 * <p>{@link #lease} is what a task calls per publish: it waits, if need be, until the view
 * covers every changelog record written before the publish (section 4), then hands out the
 * current table. It never routes early: while the view lags it waits, with a warning every
 * {@link #LOG_EVERY_MS} ms. Kafka being unreachable (view or gate) is retried with backoff
 * up to {@link #MAX_BACKOFF_MS} and logged at most every {@link #LOG_EVERY_MS} ms; nothing
 * here fails a task for it.
 */
public final class RoutingView {
    /** The least interval between two log lines about one lasting condition (Kafka down, a
     *  view behind), so that an outage of hours logs a line per half minute, not per poll. */
    static final long LOG_EVERY_MS = 30_000;
    /** Backoff of a failed Kafka call: doubled from {@link #MIN_BACKOFF_MS} up to this. */
    static final long MAX_BACKOFF_MS = 5_000;
    static final long MIN_BACKOFF_MS = 100;
    /** How long one poll of the view topic or one end-offsets request may block. */
    static final Duration POLL = Duration.ofMillis(200);
    static final Duration KAFKA_CALL_TIMEOUT = Duration.ofSeconds(10);
    static final String MARK_KEY = "mark";
    static final String SUBSCRIPTION_KEY_PREFIX = "sub:";

    private static final Logger LOG = LoggerFactory.getLogger(RoutingView.class);
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Map<RealtimeSettings, RoutingView> VIEWS = new ConcurrentHashMap<>();

    /**
     * What tasks route with: a table, the version of the view state it is current in, and the
     * changelog marks it covers (partition -> every changelog record below is applied).
     */
    record State(RoutingTable table, long version, Map<Integer, Long> marks) {
        /** Whether the marks cover {@code endOffsets} (a partition absent counts as 0). */
        boolean covers(Map<Integer, Long> endOffsets) {
            for (Map.Entry<Integer, Long> end : endOffsets.entrySet()) {
                if (marks.getOrDefault(end.getKey(), 0L) < end.getValue()) {
                    return false;
                }
            }
            return true;
        }
    }

    /** A task's hold on a state's table, released by {@link #close} (try-with-resources). */
    public static final class Lease implements AutoCloseable {
        private final State state;

        private Lease(State state) {
            this.state = state;
        }

        long handle() {
            return state.table().handle();
        }

        long version() {
            return state.version();
        }

        @Override
        public void close() {
            state.table().close();
        }
    }

    private final RealtimeSettings settings;
    private final Object swapped = new Object(); // notified at each swap of `current`
    private volatile State current;

    // The gate's: guarded by `gate`.
    private final Object gate = new Object();
    private volatile long verifiedUpTo = Long.MIN_VALUE;
    private KafkaConsumer<byte[], byte[]> endOffsetsConsumer;
    private long gateFailureLoggedAt;

    // The view thread's alone.
    private final Map<String, JsonNode> subscriptions = new TreeMap<>();
    private boolean subscriptionsChanged = true;
    private ObjectNode lastTableFields;
    private long nextOffset;
    private long viewFailureLoggedAt;

    private RoutingView(RealtimeSettings settings) {
        this.settings = settings;
    }

    /** This JVM's view for {@code settings}, its thread started on first use. */
    public static RoutingView of(RealtimeSettings settings) {
        return VIEWS.computeIfAbsent(settings, s -> {
            RoutingView view = new RoutingView(s);
            Thread thread = new Thread(view::follow, "bitroute-routing-view-" + s.viewTopic());
            thread.setDaemon(true);
            thread.start();
            return view;
        });
    }

    /** The settings this view follows Kafka with. */
    public RealtimeSettings settings() {
        return settings;
    }

    /**
     * The table to route a publish written at {@code timestampMs} (Kafka's timestamp, epoch
     * ms) with: once the view covers every changelog record written before the publish
     * (section 4; waits as long as it takes). The caller closes the lease when done.
     */
    public Lease lease(long timestampMs) {
        awaitHappensBefore(timestampMs);
        while (true) {
            State state = current;
            if (state.table().tryAcquire()) {
                return new Lease(state);
            }
            // Swapped out and freed between the read and the acquire: the next is current.
        }
    }

    private void awaitHappensBefore(long timestampMs) {
        if (timestampMs <= verifiedUpTo && current != null) {
            return;
        }
        synchronized (gate) {
            if (timestampMs <= verifiedUpTo && current != null) {
                return; // another task verified it meanwhile
            }
            long t0 = System.currentTimeMillis();
            Map<Integer, Long> ends = changelogEndOffsets();
            awaitCovered(ends);
            verifiedUpTo = Math.max(verifiedUpTo, t0 - settings.clockSkewMs());
        }
    }

    /** The changelog's end offsets now, retried (with backoff) until Kafka answers. */
    private Map<Integer, Long> changelogEndOffsets() {
        long backoff = MIN_BACKOFF_MS;
        while (true) {
            try {
                if (endOffsetsConsumer == null) {
                    endOffsetsConsumer = consumer("gate");
                }
                List<PartitionInfo> partitions = endOffsetsConsumer.partitionsFor(
                        settings.changelogTopic(), KAFKA_CALL_TIMEOUT);
                Map<Integer, Long> ends = new HashMap<>();
                if (partitions != null && !partitions.isEmpty()) {
                    List<TopicPartition> tps = partitions.stream()
                            .map(p -> new TopicPartition(p.topic(), p.partition())).toList();
                    endOffsetsConsumer.endOffsets(tps, KAFKA_CALL_TIMEOUT)
                            .forEach((tp, end) -> ends.put(tp.partition(), end));
                }
                return ends;
            } catch (InterruptException e) {
                throw new IllegalStateException("interrupted while reading the changelog's end offsets", e);
            } catch (KafkaException e) {
                long now = System.currentTimeMillis();
                if (now - gateFailureLoggedAt >= LOG_EVERY_MS) {
                    gateFailureLoggedAt = now;
                    LOG.warn("cannot read the end offsets of {} (retrying, publishes wait): {}",
                            settings.changelogTopic(), e.toString());
                }
                closeQuietly(endOffsetsConsumer);
                endOffsetsConsumer = null;
                sleep(backoff);
                backoff = Math.min(2 * backoff, MAX_BACKOFF_MS);
            }
        }
    }

    /** Wait until a state exists and covers {@code ends}; a warning every LOG_EVERY_MS. */
    private void awaitCovered(Map<Integer, Long> ends) {
        long start = System.currentTimeMillis();
        long nextWarning = start + LOG_EVERY_MS;
        synchronized (swapped) {
            while (current == null || !current.covers(ends)) {
                long now = System.currentTimeMillis();
                if (now >= nextWarning) {
                    State state = current;
                    LOG.warn("publishes have waited {} s for the routing view ({}) to cover the "
                            + "subscriptions changelog ({} ends at {}; view: {}): the driver's view "
                            + "publisher is behind or down", (now - start) / 1000, settings.viewTopic(),
                            settings.changelogTopic(), ends,
                            state == null ? "no mark read yet" : "version " + state.version()
                                    + ", marks " + state.marks());
                    nextWarning = now + LOG_EVERY_MS;
                }
                try {
                    swapped.wait(Math.max(1, nextWarning - now));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("interrupted while waiting for the routing view", e);
                }
            }
        }
    }

    // --- The view thread -----------------------------------------------------------------

    /** The view thread: follow the view topic for the JVM's life. */
    private void follow() {
        TopicPartition partition = new TopicPartition(settings.viewTopic(), 0);
        KafkaConsumer<byte[], byte[]> consumer = null;
        long backoff = MIN_BACKOFF_MS;
        while (true) {
            try {
                if (consumer == null) {
                    consumer = consumer("view");
                    consumer.assign(List.of(partition));
                    consumer.seek(partition, nextOffset);
                }
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(POLL)) {
                    apply(record);
                    nextOffset = record.offset() + 1;
                }
                backoff = MIN_BACKOFF_MS;
            } catch (InterruptException e) {
                closeQuietly(consumer);
                return;
            } catch (KafkaException e) {
                long now = System.currentTimeMillis();
                if (now - viewFailureLoggedAt >= LOG_EVERY_MS) {
                    viewFailureLoggedAt = now;
                    LOG.warn("cannot read the routing view {} at offset {} (retrying): {}",
                            settings.viewTopic(), nextOffset, e.toString());
                }
                closeQuietly(consumer);
                consumer = null;
                sleep(backoff);
                backoff = Math.min(2 * backoff, MAX_BACKOFF_MS);
            }
        }
    }

    /** One view record: a subscription (or its tombstone), or a mark. A record this JVM
     *  cannot read is logged and skipped (the driver wrote it; it never stops the view). */
    private void apply(ConsumerRecord<byte[], byte[]> record) {
        String key = record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
        try {
            if (key.equals(MARK_KEY)) {
                if (record.value() != null) {
                    mark(JSON.readTree(record.value()));
                }
            } else if (key.startsWith(SUBSCRIPTION_KEY_PREFIX)) {
                String id = key.substring(SUBSCRIPTION_KEY_PREFIX.length());
                JsonNode value = record.value() == null ? null : JSON.readTree(record.value());
                JsonNode before = value == null ? subscriptions.remove(id) : subscriptions.put(id, value);
                subscriptionsChanged |= value == null ? before != null : !value.equals(before);
            } else {
                LOG.warn("routing view {}: skipped the record at offset {} with an unknown key '{}'",
                        settings.viewTopic(), record.offset(), key);
            }
        } catch (IOException e) { // JsonProcessingException: reading bytes does no other I/O
            LOG.error("routing view {}: skipped the record at offset {} (key '{}'), not JSON: {}",
                    settings.viewTopic(), record.offset(), key, e.getMessage());
        }
    }

    /** A mark: the state after one applied step; swapped in (loaded if the table changed). */
    private void mark(JsonNode mark) {
        long version = mark.path("version").asLong();
        Map<Integer, Long> marks = new HashMap<>();
        mark.path("changelog").properties().forEach(
                e -> marks.put(Integer.valueOf(e.getKey()), e.getValue().asLong()));
        // The table's own fields (exchanges, default exchange, retained_refused, ...): the
        // mark's, less its position.
        ObjectNode tableFields = ((ObjectNode) mark).deepCopy();
        tableFields.remove(List.of("version", "changelog"));
        State before = current;
        boolean same = before != null && !subscriptionsChanged && tableFields.equals(lastTableFields);
        RoutingTable table;
        if (same) {
            table = before.table();
        } else {
            byte[] json = tableJson(version, tableFields);
            try {
                table = new RoutingTable(NativeRouter.load(json));
            } catch (IllegalArgumentException e) {
                // Never routes with a table older than the changelog says: the gate keeps
                // publishes waiting (and warns) until a later mark loads.
                LOG.error("routing view {}: the kernel refused the table of version {} ({}); "
                        + "publishes wait for a later mark", settings.viewTopic(), version, e.getMessage());
                return;
            }
            subscriptionsChanged = false;
            lastTableFields = tableFields;
        }
        synchronized (swapped) {
            current = new State(table, version, Map.copyOf(marks));
            swapped.notifyAll();
        }
        if (before != null && before.table() != table) {
            before.table().close(); // the view's reference; freed when no task holds it
        }
        LOG.info("routing view {}: version {} ({} subscriptions), changelog marks {}",
                settings.viewTopic(), version, subscriptions.size(), marks);
    }

    private byte[] tableJson(long version, ObjectNode tableFields) {
        ObjectNode table = tableFields.deepCopy();
        table.put("version", version);
        if (!table.has("exchanges")) {
            table.putArray("exchanges");
        }
        ArrayNode subs = table.putArray("subscriptions");
        subscriptions.values().forEach(subs::add);
        try {
            return JSON.writeValueAsBytes(table);
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot write a routing table's JSON", e); // a tree always writes
        }
    }

    // --- Kafka clients ----------------------------------------------------------------------

    /** A consumer of the configured Kafka (no group: assigned partitions, nothing committed). */
    private KafkaConsumer<byte[], byte[]> consumer(String role) {
        Properties props = new Properties();
        props.putAll(settings.kafka());
        props.put("client.id", "bitroute-realtime-" + role);
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        props.put("allow.auto.create.topics", "false");
        props.remove("group.id");
        return new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    private static void closeQuietly(KafkaConsumer<?, ?> consumer) {
        if (consumer == null) {
            return;
        }
        try {
            consumer.close(Duration.ZERO);
        } catch (KafkaException e) {
            LOG.debug("closing a Kafka consumer: {}", e.toString());
        }
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptException(e);
        }
    }
}
