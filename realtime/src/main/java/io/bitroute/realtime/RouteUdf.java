package io.bitroute.realtime;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.bitroute.realtime.KafkaRecords.Header;
import io.bitroute.realtime.KafkaRecords.RejectedCopy;
import io.bitroute.realtime.RouteOutcome.Delivery;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF6;
import scala.collection.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code bitroute_route(partition, offset, key, value, headers, timestamp)}: one publish of the
 * Kafka source routed, as the Kafka sink's rows. Built by the driver with the router's
 * settings ({@link RealtimeSettings}, JSON) and registered as {@code bitroute_route}
 * ({@code streaming/realtime/query.py}); returns
 * {@code array<struct<topic:string, key:binary, value:binary,
 * headers:array<struct<key:string, value:binary>>>>}, in this order:
 * <ol>
 *   <li>one delivery per matched subscriber, byte for byte the micro-batch path's
 *       ({@code streaming/router/batch/routing.py} {@code delivery_columns}): topic and key as the
 *       delivery layout says, the payload, the publish's kept headers in order, then
 *       [{@code bitroute.routing_key} (shared layout)], {@code bitroute.message_id},
 *       {@code bitroute.subscription_ids}, {@code bitroute.snapshot_version}; a publish's
 *       {@code expiry} headers carry the remaining interval (none for an expired one); a
 *       delivery made through the alternate exchange has {@code bitroute.alternate_exchange}
 *       after the publish's headers;</li>
 *   <li>for a rejected publish (by the kernel, or because a delivery would exceed
 *       {@code max_delivery_bytes}: {@code _reject_oversize}) its rejected topic copy
 *       ({@code rejected_copy}) instead;</li>
 *   <li>one record to the routed topic, keyed by message id: the publish's
 *       {@code ROUTED_PUBLISH} row as JSON, for the audit query.</li>
 * </ol>
 *
 * <p>No publish fails the task: the kernel turns whatever is wrong with a publish (its
 * exchange header, its routing key) into a rejection reason; only the kernel's own errors
 * (bugs) fail it, as in the micro-batch path. The call blocks while the routing view lags
 * the subscriptions changelog ({@link RoutingView#lease}).
 *
 * <p>Not handled here (the micro-batch path's, not this slice's): MQTT retained publishes,
 * and deliveries Kafka refuses although they fit (the Kafka sink fails the query instead).
 */
public final class RouteUdf implements UDF6<Integer, Long, byte[], byte[], Seq<Row>, Timestamp, Seq<Row>> {
    private static final long serialVersionUID = 1L;
    private static final ObjectMapper JSON = new ObjectMapper();
    /** {@code _ROUTER_HEADERS_SIZE}: the router's three headers' framing and names. */
    private static final long ROUTER_HEADERS_SIZE = KafkaRecords.headerSize(KafkaRecords.MESSAGE_ID_HEADER, 0)
            + KafkaRecords.headerSize(KafkaRecords.SUBSCRIPTION_IDS_HEADER, 0)
            + KafkaRecords.headerSize(KafkaRecords.SNAPSHOT_VERSION_HEADER, 0);

    /** The settings, as JSON: this object is built on the driver and shipped in the plan. */
    private final String settingsJson;
    /** This JVM's view of those settings, made on first call. Volatile: one instance may
     *  serve several task threads. */
    private transient volatile RoutingView view;

    public RouteUdf(String settingsJson) {
        RealtimeSettings.fromJson(settingsJson); // a bad setting fails on the driver, at once
        this.settingsJson = settingsJson;
    }

    @Override
    public Seq<Row> call(Integer partition, Long offset, byte[] key, byte[] value, Seq<Row> headers,
                         Timestamp timestamp) {
        RoutingView view = this.view;
        if (view == null) {
            view = RoutingView.of(RealtimeSettings.fromJson(settingsJson));
            this.view = view;
        }
        RealtimeSettings settings = view.settings();
        String messageId = settings.messageIdTopic() + "/" + partition + "/" + offset;
        List<Header> all = headers(headers);
        Long publishedAt = timestamp == null ? null : timestamp.getTime();
        List<Row> rows = new ArrayList<>();
        try (RoutingView.Lease lease = view.lease(publishedAt == null ? Long.MAX_VALUE : publishedAt)) {
            route(settings, lease, partition, offset, key, value, all, publishedAt, messageId, rows);
        }
        return CollectionConverters.asScala(rows).toSeq();
    }

    private static void route(RealtimeSettings settings, RoutingView.Lease lease, int partition,
                              long offset, byte[] key, byte[] value, List<Header> all,
                              Long publishedAt, String messageId, List<Row> rows) {
        long now = System.currentTimeMillis(); // the routing time, for the publish's expiry
        RouteOutcome outcome = routeOne(lease.handle(), key, all, messageId,
                publishedAt == null ? now : publishedAt, now);
        String version = Long.toString(lease.version());
        List<Header> kept = KafkaRecords.keptHeaders(all);
        List<Header> sent = kept; // what a delivery carries of the publish's own, and more
        if (outcome.alternate() != null) {
            sent = new ArrayList<>(kept);
            sent.add(new Header(RouteOutcome.ALTERNATE_EXCHANGE_HEADER,
                    KafkaRecords.utf8(outcome.alternate())));
        }
        List<Delivery> deliveries = outcome.deliveries();
        String reason = outcome.reason();
        boolean expired = outcome.outcome() == RouteOutcome.EXPIRED;
        if (reason == null && !expired) { // an expired publish is delivered to no one
            reason = oversize(settings, key, value, sent, messageId, version, deliveries);
        }
        if (reason != null) {
            RejectedCopy copy = KafkaRecords.rejectedCopy(key, value, kept, reason,
                    KafkaRecords.SOURCE_PUBLISH, messageId, settings.maxDeliveryBytes());
            reason = copy.reason();
            deliveries = List.of();
            rows.add(row(settings.rejectedTopic(), key, copy.value(), copy.headers()));
        }
        List<Header> delivered = outcome.remaining() < 0 ? sent
                : KafkaRecords.withRemainingExpiry(sent, outcome.remaining());
        for (Delivery delivery : deliveries) {
            rows.add(delivery(settings, delivery, key, value, delivered, messageId, version));
        }
        String outcomeName = reason != null ? "rejected" : expired ? "expired"
                : deliveries.isEmpty() ? "unroutable" : "routed";
        String alternate = deliveries.isEmpty() ? null : outcome.alternate();
        byte[] routed = routedJson(messageId, partition, offset, outcome.exchange(), key, outcomeName,
                reason, deliveries, all, value, publishedAt, lease.version(), alternate);
        rows.add(row(settings.routedTopic(), KafkaRecords.utf8(messageId), routed, List.of()));
    }

    /** The kernel's outcome. Its exceptions (a panic, a malformed outcome: bugs, never a
     *  property of the publish, whose every fault the kernel turns into a reason) fail the
     *  task, as the kernel's errors fail the micro-batch path's (routing.py NOT_ABOUT_A_RECORD). */
    private static RouteOutcome routeOne(long handle, byte[] key, List<Header> all, String messageId,
                                         long publishedMs, long nowMs) {
        String[] names = new String[all.size()];
        byte[][] values = new byte[all.size()][];
        for (int i = 0; i < names.length; i++) {
            names[i] = all.get(i).name();
            values[i] = all.get(i).value();
        }
        return RouteOutcome.decode(NativeRouter.route(handle, key, names, values, messageId,
                publishedMs, nowMs));
    }

    /** {@code _reject_oversize}: why the publish is rejected when its largest delivery would
     *  exceed max_delivery_bytes (checked even with no delivery, as there), else null. */
    private static String oversize(RealtimeSettings settings, byte[] key, byte[] value,
                                   List<Header> kept, String messageId, String version,
                                   List<Delivery> deliveries) {
        long base = KafkaRecords.recordSize(key, value, kept) + ROUTER_HEADERS_SIZE + version.length()
                + KafkaRecords.utf8(messageId).length;
        long largest = base;
        for (Delivery d : deliveries) {
            long own = KafkaRecords.utf8(d.idsHeader()).length;
            if (settings.shared()) {
                own += KafkaRecords.headerSize(KafkaRecords.ROUTING_KEY_HEADER, 0)
                        + KafkaRecords.utf8(d.subscriber()).length;
            }
            largest = Math.max(largest, base + own);
        }
        long limit = settings.maxDeliveryBytes();
        if (largest <= limit) {
            return null;
        }
        return String.format(Locale.ROOT, "a delivery of this publish would be %,d bytes, more than "
                + "kafka.max_delivery_bytes (%,d): the broker would refuse it", largest, limit);
    }

    private static Row delivery(RealtimeSettings settings, Delivery d, byte[] key, byte[] value,
                                List<Header> kept, String messageId, String version) {
        List<Header> headers = new ArrayList<>(kept.size() + 4);
        headers.addAll(kept);
        String topic;
        byte[] recordKey;
        if (settings.shared()) {
            topic = settings.sharedTopic();
            recordKey = KafkaRecords.utf8(d.subscriber());
            headers.add(new Header(KafkaRecords.ROUTING_KEY_HEADER, key));
        } else {
            topic = settings.deliveriesTopicPrefix() + d.subscriber();
            recordKey = key;
        }
        headers.add(new Header(KafkaRecords.MESSAGE_ID_HEADER, KafkaRecords.utf8(messageId)));
        headers.add(new Header(KafkaRecords.SUBSCRIPTION_IDS_HEADER, KafkaRecords.utf8(d.idsHeader())));
        headers.add(new Header(KafkaRecords.SNAPSHOT_VERSION_HEADER, KafkaRecords.utf8(version)));
        return row(topic, recordKey, value, headers);
    }

    /** The routed record's value: {@code ROUTED_PUBLISH} as JSON (contract section 6). */
    private static byte[] routedJson(String messageId, int partition, long offset, String exchange,
                                     byte[] key, String outcome, String reason,
                                     List<Delivery> deliveries, List<Header> all, byte[] value,
                                     Long publishedAt, long version, String alternate) {
        ObjectNode routed = JSON.createObjectNode();
        routed.put("message_id", messageId);
        routed.put("partition", partition);
        routed.put("offset", offset);
        routed.put("exchange", exchange);
        routed.put("routing_key", KafkaRecords.text(key));
        routed.put("outcome", outcome);
        routed.put("reason", reason);
        ArrayNode list = routed.putArray("deliveries");
        for (Delivery d : deliveries) {
            ObjectNode entry = list.addObject();
            entry.put("subscriber", d.subscriber());
            d.subscriptionIds().forEach(entry.putArray("subscription_ids")::add);
        }
        // PublishColumns.header_map: the last header of a name wins, at its position.
        ObjectNode map = routed.putObject("headers");
        for (Header h : all) {
            map.remove(h.name());
            map.put(h.name(), KafkaRecords.text(h.value()));
        }
        routed.put("payload_bytes", value == null ? null : value.length);
        routed.put("published_at", publishedAt);
        routed.put("snapshot_version", version);
        routed.put("alternate_exchange", alternate);
        try {
            return JSON.writeValueAsBytes(routed);
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot write a routed record's JSON", e); // a tree always writes
        }
    }

    private static List<Header> headers(Seq<Row> headers) {
        if (headers == null) {
            return List.of();
        }
        List<Header> out = new ArrayList<>(headers.size());
        for (Row h : CollectionConverters.asJava(headers)) {
            out.add(new Header(h.getString(0), (byte[]) h.get(1)));
        }
        return out;
    }

    private static Row row(String topic, byte[] key, byte[] value, List<Header> headers) {
        List<Row> hs = new ArrayList<>(headers.size());
        for (Header h : headers) {
            hs.add(RowFactory.create(h.name(), h.value()));
        }
        return RowFactory.create(topic, key, value, CollectionConverters.asScala(hs).toSeq());
    }
}
