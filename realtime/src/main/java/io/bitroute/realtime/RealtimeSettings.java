package io.bitroute.realtime;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.Properties;

/**
 * The route function's settings, as the driver hands them to {@link RouteUdf}'s constructor
 * ({@code streaming/realtime/query.py} {@code udf_settings}): a JSON object with the Java Kafka
 * client's properties under {@code "kafka"} and the topics and limits by name. The one place
 * that names them on the JVM side. The UDF object carries the JSON into the plan, so the
 * settings reach the executors without a Spark setting (a session outlives one router's
 * settings), a plan string or a log line.
 *
 * <p>{@link #kafka} holds credentials ({@code sasl.jaas.config}, {@code ssl.*.password}):
 * never logged, and {@link #toString} leaves it out.
 */
public record RealtimeSettings(Properties kafka, String viewTopic, String changelogTopic,
                               String publishesTopic, int incarnation,
                               String deliveriesTopicPrefix, String sharedTopic,
                               String rejectedTopic, String routedTopic, int maxDeliveryBytes,
                               long clockSkewMs) {
    private static final ObjectMapper JSON = new ObjectMapper();

    /** The settings of {@code json} (an {@link IllegalArgumentException} names a bad one). */
    public static RealtimeSettings fromJson(String json) {
        JsonNode root;
        try {
            root = JSON.readTree(json);
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException("the route function's settings are not JSON: "
                    + e.getOriginalMessage());
        }
        Properties kafka = new Properties();
        JsonNode clients = root.path("kafka");
        clients.fields().forEachRemaining(e -> kafka.setProperty(e.getKey(), e.getValue().asText()));
        if (kafka.getProperty("bootstrap.servers") == null) {
            throw new IllegalArgumentException("settings: kafka.bootstrap.servers is not set");
        }
        String shared = text(root, "shared_topic", "");
        return new RealtimeSettings(kafka,
                text(root, "view_topic", "bitroute.routing-view"),
                text(root, "changelog_topic", "bitroute.subscriptions"),
                text(root, "publishes_topic", "bitroute.publishes"),
                integer(root, "incarnation", 0, 0),
                text(root, "deliveries_topic_prefix", "bitroute.deliveries."),
                shared.isEmpty() ? null : shared,
                text(root, "rejected_topic", "bitroute.rejected"),
                text(root, "routed_topic", "bitroute.routed"),
                integer(root, "max_delivery_bytes", 1048576, 1),
                integer(root, "clock_skew_ms", 0, 0));
    }

    /** Whether every subscriber's deliveries share one topic, keyed by subscriber. */
    public boolean shared() {
        return sharedTopic != null;
    }

    /** Message ids' topic part: the publishes topic, with {@code ~<n>} for incarnation n >= 1
     *  (schemas/records.py {@code message_id_topic}). */
    public String messageIdTopic() {
        return incarnation == 0 ? publishesTopic : publishesTopic + "~" + incarnation;
    }

    private static String text(JsonNode root, String name, String fallback) {
        JsonNode node = root.get(name);
        return node == null || node.isNull() ? fallback : node.asText();
    }

    private static int integer(JsonNode root, String name, int fallback, int least) {
        JsonNode node = root.get(name);
        String text = node == null || node.isNull() ? Integer.toString(fallback) : node.asText();
        try {
            int value = Integer.parseInt(text.trim());
            if (value >= least) {
                return value;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        throw new IllegalArgumentException("settings: " + name + ": expected an integer >= "
                + least + ", got '" + text + "'");
    }

    @Override
    public String toString() {
        return "RealtimeSettings[bootstrap.servers=" + kafka.getProperty("bootstrap.servers")
                + ", viewTopic=" + viewTopic + ", changelogTopic=" + changelogTopic
                + ", publishesTopic=" + publishesTopic + ", incarnation=" + incarnation
                + ", deliveriesTopicPrefix=" + deliveriesTopicPrefix + ", sharedTopic=" + sharedTopic
                + ", rejectedTopic=" + rejectedTopic + ", routedTopic=" + routedTopic
                + ", maxDeliveryBytes=" + maxDeliveryBytes + ", clockSkewMs=" + clockSkewMs + "]";
    }
}
