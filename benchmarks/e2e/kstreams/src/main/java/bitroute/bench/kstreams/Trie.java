package bitroute.bench.kstreams;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

/**
 * A plain in-memory topic trie of one exchange, in its dialect (docs/design.md, "Semantics"):
 *
 * <ul>
 *   <li>MQTT: levels split on {@code /} (empty levels count); {@code +} one level, {@code #}
 *       last and matching the parent level and every descendant; a filter starting with a
 *       wildcard does not match a topic starting with {@code $}. {@code $share/} filters and
 *       header criteria are not supported (the benchmark uses neither): {@link #add} refuses
 *       them.
 *   <li>AMQP: words split on {@code .} (empty words count; the empty key has none); {@code *}
 *       one word, {@code #} zero or more, anywhere, any number of times.
 * </ul>
 *
 * <p>Not thread-safe: {@link Subscriptions} guards it with a read/write lock.
 */
final class Trie {
    enum Dialect { MQTT, AMQP }

    private static final int MAX_AMQP_KEY_BYTES = 255;

    private static final class Node {
        final Map<String, Node> children = new HashMap<>();
        /** subscription id -> subscriber of the filters ending here. */
        final Map<String, String> subscriptions = new HashMap<>();

        boolean empty() {
            return children.isEmpty() && subscriptions.isEmpty();
        }
    }

    private final Dialect dialect;
    private final Node root = new Node();
    private int size;

    Trie(Dialect dialect) {
        this.dialect = dialect;
    }

    int size() {
        return size;
    }

    /** Why {@code filter} is not a valid filter of this dialect, or null when it is. */
    String invalidFilter(String filter) {
        if (dialect == Dialect.AMQP) {
            return filter.getBytes(StandardCharsets.UTF_8).length > MAX_AMQP_KEY_BYTES
                    ? "an AMQP binding key is at most 255 bytes" : null;
        }
        if (filter.isEmpty()) {
            return "an MQTT filter is not empty";
        }
        if (filter.startsWith("$share/")) {
            return "shared subscriptions are not supported by this peer";
        }
        String[] levels = split(filter);
        for (int i = 0; i < levels.length; i++) {
            String level = levels[i];
            if (level.equals("#") && i != levels.length - 1) {
                return "'#' must be the last level";
            }
            if (!level.equals("#") && !level.equals("+") && (level.contains("#") || level.contains("+"))) {
                return "a wildcard fills a whole level";
            }
        }
        return null;
    }

    /** Why {@code topic} is not a valid topic (routing key) of this dialect, or null. */
    String invalidTopic(String topic) {
        if (dialect == Dialect.AMQP) {
            return topic.getBytes(StandardCharsets.UTF_8).length > MAX_AMQP_KEY_BYTES
                    ? "an AMQP routing key is at most 255 bytes" : null;
        }
        if (topic.isEmpty()) {
            return "an MQTT topic is not empty";
        }
        if (topic.indexOf('+') >= 0 || topic.indexOf('#') >= 0 || topic.indexOf('\0') >= 0) {
            return "an MQTT topic has no '+', '#' or U+0000";
        }
        return null;
    }

    /** Add subscription {@code id} of {@code subscriber}; {@code filter} is valid. */
    void add(String id, String subscriber, String filter) {
        Node node = root;
        for (String level : split(filter)) {
            node = node.children.computeIfAbsent(level, k -> new Node());
        }
        if (node.subscriptions.put(id, subscriber) == null) {
            size++;
        }
    }

    /** Remove subscription {@code id}, added with {@code filter}; prunes emptied nodes. */
    void remove(String id, String filter) {
        String[] levels = split(filter);
        Node[] path = new Node[levels.length + 1];
        path[0] = root;
        for (int i = 0; i < levels.length; i++) {
            path[i + 1] = path[i].children.get(levels[i]);
            if (path[i + 1] == null) {
                return;
            }
        }
        if (path[levels.length].subscriptions.remove(id) != null) {
            size--;
        }
        for (int i = levels.length; i > 0 && path[i].empty(); i--) {
            path[i - 1].children.remove(levels[i - 1]);
        }
    }

    /** Adds to {@code out} (subscriber -> matched subscription ids) every match of {@code topic}. */
    void match(String topic, Map<String, TreeSet<String>> out) {
        String[] levels = split(topic);
        if (dialect == Dialect.MQTT) {
            mqtt(root, levels, 0, !levels[0].startsWith("$"), out);
        } else {
            amqp(root, levels, 0, out);
        }
    }

    private static void mqtt(Node node, String[] levels, int i, boolean wildcards,
                             Map<String, TreeSet<String>> out) {
        if (wildcards) {
            Node hash = node.children.get("#");
            if (hash != null) {
                collect(hash, out);
            }
        }
        if (i == levels.length) {
            collect(node, out);
            return;
        }
        Node exact = node.children.get(levels[i]);
        if (exact != null) {
            mqtt(exact, levels, i + 1, true, out);
        }
        if (wildcards) {
            Node plus = node.children.get("+");
            if (plus != null) {
                mqtt(plus, levels, i + 1, true, out);
            }
        }
    }

    private static void amqp(Node node, String[] words, int i, Map<String, TreeSet<String>> out) {
        Node hash = node.children.get("#");
        if (hash != null) {
            for (int j = i; j <= words.length; j++) {  // '#' takes zero or more words
                amqp(hash, words, j, out);
            }
        }
        if (i == words.length) {
            collect(node, out);
            return;
        }
        Node exact = node.children.get(words[i]);
        if (exact != null) {
            amqp(exact, words, i + 1, out);
        }
        Node star = node.children.get("*");
        if (star != null) {
            amqp(star, words, i + 1, out);
        }
    }

    private static void collect(Node node, Map<String, TreeSet<String>> out) {
        for (Map.Entry<String, String> e : node.subscriptions.entrySet()) {
            out.computeIfAbsent(e.getValue(), k -> new TreeSet<>()).add(e.getKey());
        }
    }

    private String[] split(String s) {
        if (dialect == Dialect.AMQP) {
            return s.isEmpty() ? new String[0] : splitOn(s, '.');
        }
        return splitOn(s, '/');
    }

    /** {@code s} split on {@code sep}, empty parts kept (String.split would drop trailing ones). */
    private static String[] splitOn(String s, char sep) {
        List<String> parts = new ArrayList<>();
        int start = 0;
        for (int i = 0; i < s.length(); i++) {
            if (s.charAt(i) == sep) {
                parts.add(s.substring(start, i));
                start = i + 1;
            }
        }
        parts.add(s.substring(start));
        return parts.toArray(new String[0]);
    }
}
