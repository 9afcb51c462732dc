package io.bitroute.realtime;

import java.util.Properties;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import scala.Tuple2;

/**
 * The Spark settings the driver sets for the executors (realtime contract, section 5), read
 * once per JVM from {@code SparkEnv.get().conf()}: the one place that names them on the JVM side.
 *
 * <p>{@link #kafka} holds credentials ({@code sasl.jaas.config}, {@code ssl.*.password}):
 * never logged, and {@link #toString} leaves it out.
 */
public record RealtimeSettings(Properties kafka, String viewTopic, String changelogTopic,
                               String publishesTopic, int incarnation,
                               String deliveriesTopicPrefix, String sharedTopic,
                               String rejectedTopic, String routedTopic, int maxDeliveryBytes,
                               long clockSkewMs) {
    public static final String PREFIX = "spark.bitroute.realtime.";
    public static final String KAFKA_PREFIX = PREFIX + "kafka.";

    /** The settings of this JVM's Spark configuration (an executor's, or a local driver's). */
    public static RealtimeSettings fromSparkEnv() {
        SparkEnv env = SparkEnv.get();
        if (env == null) {
            throw new IllegalStateException("no SparkEnv in this JVM: RouteUdf runs in Spark tasks");
        }
        return of(env.conf());
    }

    /** The settings of {@code conf} (section 5's defaults for those it lacks). */
    public static RealtimeSettings of(SparkConf conf) {
        Properties kafka = new Properties();
        for (Tuple2<String, String> entry : conf.getAllWithPrefix(KAFKA_PREFIX)) {
            kafka.setProperty(entry._1(), entry._2());
        }
        if (kafka.getProperty("bootstrap.servers") == null) {
            throw new IllegalArgumentException(KAFKA_PREFIX + "bootstrap.servers is not set");
        }
        String shared = conf.get(PREFIX + "shared_topic", "");
        return new RealtimeSettings(kafka,
                conf.get(PREFIX + "view_topic", "bitroute.routing-view"),
                conf.get(PREFIX + "changelog_topic", "bitroute.subscriptions"),
                conf.get(PREFIX + "publishes_topic", "bitroute.publishes"),
                integer(conf, "incarnation", "0", 0),
                conf.get(PREFIX + "deliveries_topic_prefix", "bitroute.deliveries."),
                shared.isEmpty() ? null : shared,
                conf.get(PREFIX + "rejected_topic", "bitroute.rejected"),
                conf.get(PREFIX + "routed_topic", "bitroute.routed"),
                integer(conf, "max_delivery_bytes", "1048576", 1),
                integer(conf, "clock_skew_ms", "0", 0));
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

    private static int integer(SparkConf conf, String name, String fallback, int least) {
        String text = conf.get(PREFIX + name, fallback);
        try {
            int value = Integer.parseInt(text.trim());
            if (value >= least) {
                return value;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        throw new IllegalArgumentException(PREFIX + name + ": expected an integer >= " + least
                + ", got '" + text + "'");
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
