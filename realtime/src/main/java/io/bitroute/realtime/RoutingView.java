package io.bitroute.realtime;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
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
 * <p>One per JVM and settings ({@link #of}), started on first use, with two daemon threads:
 * <ul>
 *   <li>the view thread follows the view topic (one partition) from the beginning, applies
 *       each {@code sub:} record to a native subscription set as it reads it (parsed once,
 *       {@link NativeRouter#put}) and, at a {@code mark}, builds the table from the set
 *       ({@link NativeRouter#build}) and swaps it in with the mark's version and changelog
 *       marks. Marks it reads while more of the view is already fetched are passed over:
 *       only the latest is built (a catch-up of many marks builds once), unless that would
 *       hold a table back for longer than {@link #MAX_MARK_DEFER_MS}. A mark that changes
 *       nothing the table holds advances the version and marks on the same native table. An
 *       old table is freed when its last task lets it go ({@link RoutingTable}).</li>
 *   <li>the gate thread reads the changelog's end offsets, at once when a publish waits for
 *       a read and back to back while publishes flow (a lease in the last
 *       {@link #GATE_ACTIVE_MS} ms), and keeps the latest read with the time it began.</li>
 * </ul>
 *
 * <p>{@link #lease} is what a task calls per publish: it waits, if need be, until the view
 * covers every changelog record written before the publish (section 4): until a read of the
 * end offsets that began after the publish was written (by its timestamp, less the clock
 * skew allowed, or because it began after the publish reached the task) is covered by the
 * view's mark. Under traffic such a read is usually done by the time the
 * publish reaches the task, so the publish does not wait for a Kafka round trip of its own.
 * It never routes early: while the view lags it waits, with a warning every
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
    /** How long the gate thread keeps reading end offsets back to back after a lease. */
    static final long GATE_ACTIVE_MS = 1_000;
    /** The pause between two reads of the gate thread while publishes flow: bounds the
     *  ListOffsets requests of an executor to a few hundred a second. */
    static final long GATE_PAUSE_MS = 5;
    /** The longest a mark read is passed over for a later one while the view is read. */
    static final long MAX_MARK_DEFER_MS = 1_000;
    /** The view consumer's fetch sizes: a first load reads the whole view in few polls. */
    static final int VIEW_MAX_POLL_RECORDS = 20_000;
    static final int VIEW_MAX_FETCH_BYTES = 16 * 1024 * 1024;
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

    /** One read of the changelog's end offsets, the {@code number}-th begun, at
     *  {@code startedAt} (epoch ms). */
    private record EndsRead(long number, long startedAt, Map<Integer, Long> ends) {
    }

    private final RealtimeSettings settings;
    private final Object swapped = new Object(); // notified at each swap of `current`
    private volatile State current;

    // The gate's: guarded by `gate` (verifiedUpTo also read without it).
    private final Object gate = new Object();
    /** Every publish written at or before this (epoch ms) is covered by {@code current}. */
    private volatile long verifiedUpTo = Long.MIN_VALUE;
    private EndsRead latestRead;
    private long readsBegun;
    private boolean readWanted;
    /** When a task last asked for a lease (the gate thread reads on while it is recent). */
    private volatile long lastLeaseAt;
    private long gateFailureLoggedAt; // the gate thread's

    // The view thread's alone.
    private long subscriptionSet; // NativeRouter set handle, made on the view thread
    /** Ids whose latest view record the kernel could not read: no table is built while any
     *  is left (publishes wait, as for a table the kernel refuses), until a later record of
     *  that id. */
    private final Set<String> unreadable = new TreeSet<>();
    private boolean subscriptionsChanged = true;
    private ObjectNode lastTableFields;
    private JsonNode deferredMark;
    private long deferredSince;
    private long nextOffset;
    private long viewFailureLoggedAt;

    private RoutingView(RealtimeSettings settings) {
        this.settings = settings;
    }

    /** This JVM's view for {@code settings}, its thread started on first use. */
    public static RoutingView of(RealtimeSettings settings) {
        return VIEWS.computeIfAbsent(settings, s -> {
            RoutingView view = new RoutingView(s);
            daemon(view::follow, "bitroute-routing-view-" + s.viewTopic());
            daemon(view::refreshEnds, "bitroute-routing-gate-" + s.changelogTopic());
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
        lastLeaseAt = System.currentTimeMillis();
        if (timestampMs <= verifiedUpTo && current != null) {
            return;
        }
        long skew = settings.clockSkewMs();
        EndsRead read;
        synchronized (gate) {
            // A read begun after the publish was written saw every changelog record Kafka
            // acknowledged before it: one begun after the publish was written by the
            // clocks (less the skew), or one begun after this call, which the publish
            // reached after Kafka had it (whatever the clocks say).
            long begunBefore = readsBegun;
            while (latestRead == null || (latestRead.number() <= begunBefore
                    && latestRead.startedAt() - skew < timestampMs)) {
                if (timestampMs <= verifiedUpTo && current != null) {
                    return;
                }
                readWanted = true;
                gate.notifyAll();
                try {
                    gate.wait();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("interrupted while reading the changelog's end offsets", e);
                }
            }
            read = latestRead;
        }
        awaitCovered(read.ends());
        raiseVerified(read);
    }

    /** {@code verifiedUpTo} to what {@code read} verifies, once the current state covers it. */
    private void raiseVerified(EndsRead read) {
        State state = current;
        if (state != null && state.covers(read.ends())) {
            synchronized (gate) {
                verifiedUpTo = Math.max(verifiedUpTo, read.startedAt() - settings.clockSkewMs());
            }
        }
    }

    /** The gate thread: a read of the end offsets whenever a lease wants one, and back to
     *  back (a pause of GATE_PAUSE_MS) while leases came in the last GATE_ACTIVE_MS. */
    private void refreshEnds() {
        KafkaConsumer<byte[], byte[]> consumer = null;
        long backoff = MIN_BACKOFF_MS;
        long number;
        while (true) {
            try {
                synchronized (gate) {
                    while (!readWanted
                            && System.currentTimeMillis() - lastLeaseAt >= GATE_ACTIVE_MS) {
                        gate.wait();
                    }
                    readWanted = false;
                    number = ++readsBegun;
                }
                if (consumer == null) {
                    consumer = consumer("gate");
                }
                long startedAt = System.currentTimeMillis();
                EndsRead read = new EndsRead(number, startedAt, changelogEndOffsets(consumer));
                synchronized (gate) {
                    latestRead = read;
                    gate.notifyAll();
                }
                raiseVerified(read);
                backoff = MIN_BACKOFF_MS;
                Thread.sleep(GATE_PAUSE_MS);
            } catch (InterruptedException | InterruptException e) {
                closeQuietly(consumer);
                return;
            } catch (KafkaException e) {
                long now = System.currentTimeMillis();
                if (now - gateFailureLoggedAt >= LOG_EVERY_MS) {
                    gateFailureLoggedAt = now;
                    LOG.warn("cannot read the end offsets of {} (retrying, publishes wait): {}",
                            settings.changelogTopic(), e.toString());
                }
                closeQuietly(consumer);
                consumer = null;
                synchronized (gate) {
                    readWanted = true; // whoever waited still does
                }
                try {
                    Thread.sleep(backoff);
                } catch (InterruptedException interrupted) {
                    return;
                }
                backoff = Math.min(2 * backoff, MAX_BACKOFF_MS);
            }
        }
    }

    /** The changelog's end offsets now (partition -> end offset). */
    private Map<Integer, Long> changelogEndOffsets(KafkaConsumer<byte[], byte[]> consumer) {
        List<PartitionInfo> partitions = consumer.partitionsFor(settings.changelogTopic(),
                KAFKA_CALL_TIMEOUT);
        Map<Integer, Long> ends = new HashMap<>();
        if (partitions != null && !partitions.isEmpty()) {
            List<TopicPartition> tps = partitions.stream()
                    .map(p -> new TopicPartition(p.topic(), p.partition())).toList();
            consumer.endOffsets(tps, KAFKA_CALL_TIMEOUT)
                    .forEach((tp, end) -> ends.put(tp.partition(), end));
        }
        return Map.copyOf(ends);
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
                    consumer = consumer("view", Map.of(
                            "max.poll.records", Integer.toString(VIEW_MAX_POLL_RECORDS),
                            "max.partition.fetch.bytes", Integer.toString(VIEW_MAX_FETCH_BYTES),
                            "fetch.max.bytes", Integer.toString(VIEW_MAX_FETCH_BYTES)));
                    consumer.assign(List.of(partition));
                    consumer.seek(partition, nextOffset);
                }
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(POLL)) {
                    apply(record);
                    nextOffset = record.offset() + 1;
                }
                if (deferredMark != null) {
                    // Build at the latest mark read, unless more of the view is already
                    // fetched (its marks supersede this one) and it has not waited too long.
                    OptionalLong lag = consumer.currentLag(partition);
                    if (lag.isEmpty() || lag.getAsLong() == 0
                            || System.currentTimeMillis() - deferredSince >= MAX_MARK_DEFER_MS) {
                        JsonNode mark = deferredMark;
                        deferredMark = null;
                        mark(mark);
                    }
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

    /** One view record: a subscription (or its tombstone), or a mark (kept for the end of
     *  the poll). A record this JVM cannot read is logged and skipped (the driver wrote it;
     *  it never stops the view). */
    private void apply(ConsumerRecord<byte[], byte[]> record) {
        String key = record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
        if (key.equals(MARK_KEY)) {
            if (record.value() == null) {
                return;
            }
            try {
                if (deferredMark == null) {
                    deferredSince = System.currentTimeMillis();
                }
                deferredMark = JSON.readTree(record.value());
            } catch (IOException e) { // JsonProcessingException: reading bytes does no other I/O
                LOG.error("routing view {}: skipped the mark at offset {}, not JSON: {}",
                        settings.viewTopic(), record.offset(), e.getMessage());
            }
        } else if (key.startsWith(SUBSCRIPTION_KEY_PREFIX)) {
            String id = key.substring(SUBSCRIPTION_KEY_PREFIX.length());
            if (subscriptionSet == 0) {
                subscriptionSet = NativeRouter.newSet();
            }
            boolean wasUnreadable = unreadable.remove(id);
            try {
                boolean changed = record.value() == null
                        ? NativeRouter.remove(subscriptionSet, id)
                        : NativeRouter.put(subscriptionSet, id, record.value());
                subscriptionsChanged |= changed || wasUnreadable;
            } catch (IllegalArgumentException e) {
                // Not routed without it: no table is built until a later record of the id.
                NativeRouter.remove(subscriptionSet, id);
                unreadable.add(id);
                subscriptionsChanged = true;
                LOG.error("routing view {}: cannot read the subscription at offset {} (key '{}'): "
                        + "{}; publishes wait for a later record of it", settings.viewTopic(),
                        record.offset(), key, e.getMessage());
            }
        } else {
            LOG.warn("routing view {}: skipped the record at offset {} with an unknown key '{}'",
                    settings.viewTopic(), record.offset(), key);
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
        if (!unreadable.isEmpty()) {
            LOG.error("routing view {}: no table at version {}: subscriptions {} could not be "
                    + "read; publishes wait for a later record of them", settings.viewTopic(),
                    version, unreadable);
            return;
        }
        if (same) {
            table = before.table();
        } else {
            if (subscriptionSet == 0) {
                subscriptionSet = NativeRouter.newSet();
            }
            long started = System.nanoTime();
            try {
                table = new RoutingTable(NativeRouter.build(subscriptionSet, tableJson(version, tableFields)));
                LOG.info("routing view {}: built the table of version {} ({} subscriptions) in {} ms",
                        settings.viewTopic(), version, NativeRouter.size(subscriptionSet),
                        (System.nanoTime() - started) / 1_000_000);
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
        EndsRead read;
        synchronized (gate) {
            read = latestRead;
        }
        if (read != null) {
            raiseVerified(read);
        }
        LOG.debug("routing view {}: version {}, changelog marks {}", settings.viewTopic(),
                version, marks);
    }

    /** The table's fields (the mark's, at {@code version}), its subscriptions the set's. */
    private static byte[] tableJson(long version, ObjectNode tableFields) {
        ObjectNode table = tableFields.deepCopy();
        table.put("version", version);
        if (!table.has("exchanges")) {
            table.putArray("exchanges");
        }
        try {
            return JSON.writeValueAsBytes(table);
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot write a routing table's JSON", e); // a tree always writes
        }
    }

    // --- Kafka clients ----------------------------------------------------------------------

    /** A consumer of the configured Kafka (no group: assigned partitions, nothing committed). */
    private KafkaConsumer<byte[], byte[]> consumer(String role) {
        return consumer(role, Map.of());
    }

    private KafkaConsumer<byte[], byte[]> consumer(String role, Map<String, String> extra) {
        Properties props = new Properties();
        props.putAll(settings.kafka());
        props.putAll(extra);
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

    private static void daemon(Runnable body, String name) {
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
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
