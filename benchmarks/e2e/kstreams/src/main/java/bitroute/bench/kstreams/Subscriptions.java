package bitroute.bench.kstreams;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.locks.ReadWriteLock;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.regex.Pattern;

/**
 * The subscriptions in force, read from bitroute's subscription changelog (key = subscription
 * id, value = JSON {@code {exchange, subscriber, filter}}, a null value removes it; see
 * schemas/records.py): one {@link Trie} per declared exchange.
 *
 * <p>Thread-safe: the stream threads match under the read lock while the changelog follower
 * applies changes under the write lock. {@link #version()} counts the changes applied; it
 * stands in for bitroute's snapshot version in the deliveries' headers.
 */
final class Subscriptions {
    private static final Pattern SUBSCRIBER = Pattern.compile("[A-Za-z0-9._-]{1,200}");
    private static final ObjectMapper JSON = new ObjectMapper();

    private record Entry(String exchange, String subscriber, String filter) {}

    private final Map<String, Trie> tries = new HashMap<>();
    private final Map<String, Entry> byId = new HashMap<>();
    private final ReadWriteLock lock = new ReentrantReadWriteLock();
    private final Set<String> subscribers = new TreeSet<>();
    private long version;

    /** {@code dialects}: exchange name -> "mqtt" or "amqp" (bitroute's {@code exchanges.dialects}). */
    Subscriptions(Map<String, String> dialects) {
        dialects.forEach((exchange, dialect) -> tries.put(exchange, new Trie(switch (dialect) {
            case "mqtt" -> Trie.Dialect.MQTT;
            case "amqp" -> Trie.Dialect.AMQP;
            default -> throw new IllegalArgumentException(
                    "exchange " + exchange + ": dialect must be mqtt or amqp, not " + dialect);
        })));
    }

    /**
     * Apply one changelog record. Returns null when applied, else why it was refused (the
     * subscription is then left as it was). A new subscriber's name is added to
     * {@link #subscribers()}.
     */
    String apply(String id, byte[] value) {
        if (value == null) {
            lock.writeLock().lock();
            try {
                Entry old = byId.remove(id);
                if (old != null) {
                    tries.get(old.exchange).remove(id, old.filter);
                }
                version++;
                return null;
            } finally {
                lock.writeLock().unlock();
            }
        }
        Entry entry;
        try {
            JsonNode json = JSON.readTree(value);
            if (json == null || !json.isObject()) {
                return "the value is not a JSON object";
            }
            if (json.hasNonNull("headers")) {
                return "header criteria are not supported by this peer";
            }
            entry = new Entry(text(json, "exchange"), text(json, "subscriber"), text(json, "filter"));
        } catch (IOException | IllegalArgumentException e) {
            return "bad value: " + e.getMessage();
        }
        Trie trie = tries.get(entry.exchange);
        if (trie == null) {
            return "undeclared exchange " + entry.exchange;
        }
        if (!SUBSCRIBER.matcher(entry.subscriber).matches()
                || entry.subscriber.equals(".") || entry.subscriber.equals("..")) {
            return "bad subscriber name " + entry.subscriber;
        }
        String invalid = trie.invalidFilter(entry.filter);
        if (invalid != null) {
            return "filter " + entry.filter + ": " + invalid;
        }
        lock.writeLock().lock();
        try {
            Entry old = byId.put(id, entry);
            if (old != null) {
                tries.get(old.exchange).remove(id, old.filter);
            }
            trie.add(id, entry.subscriber, entry.filter);
            subscribers.add(entry.subscriber);
            version++;
            return null;
        } finally {
            lock.writeLock().unlock();
        }
    }

    private static String text(JsonNode json, String field) {
        JsonNode v = json.get(field);
        if (v == null || !v.isTextual()) {
            throw new IllegalArgumentException("no string field " + field);
        }
        return v.asText();
    }

    /** Result of {@link #match}: subscriber -> its matched subscription ids, or why not. */
    record Match(Map<String, TreeSet<String>> bySubscriber, long version, String error) {}

    /** Match one publish (its exchange and routing key, UTF-8 decoded). */
    Match match(String exchange, String routingKey) {
        Trie trie = tries.get(exchange);
        if (trie == null) {
            return new Match(Map.of(), -1, "undeclared exchange " + exchange);
        }
        String invalid = trie.invalidTopic(routingKey);
        if (invalid != null) {
            return new Match(Map.of(), -1, invalid);
        }
        Map<String, TreeSet<String>> out = new HashMap<>();
        lock.readLock().lock();
        try {
            trie.match(routingKey, out);
            return new Match(out, version, null);
        } finally {
            lock.readLock().unlock();
        }
    }

    long version() {
        lock.readLock().lock();
        try {
            return version;
        } finally {
            lock.readLock().unlock();
        }
    }

    int size() {
        lock.readLock().lock();
        try {
            return byId.size();
        } finally {
            lock.readLock().unlock();
        }
    }

    /** Every subscriber ever seen (their delivery topics are created once). */
    Set<String> subscribers() {
        lock.readLock().lock();
        try {
            return new TreeSet<>(subscribers);
        } finally {
            lock.readLock().unlock();
        }
    }

    static String utf8(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }
}
