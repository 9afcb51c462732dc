package bitroute.bench.kstreams;

import com.fasterxml.jackson.core.io.JsonStringEncoder;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.atomic.LongAdder;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;

/**
 * Matches each publish and forwards one record per matched subscriber: bitroute's delivery
 * contract (schemas/records.py), key = the routing key (carried in a {@link DeliveryKey} with
 * the subscriber, which names the topic), value = the payload, headers = the publish's own
 * minus the router's, plus the message id ({@code <topic>/<partition>/<offset>}), the matched
 * subscription ids (JSON array) and the subscriptions' version.
 *
 * <p>A publish that cannot be routed (undeclared exchange, routing key not valid UTF-8 or not
 * valid in its dialect) is counted in {@link #REJECTED} and logged (the first ones); bitroute
 * would copy it to its rejected topic. The benchmark sends none.
 */
final class RouteProcessor implements Processor<byte[], byte[], DeliveryKey, byte[]> {
    static final String EXCHANGE_HEADER = "exchange";
    static final String MESSAGE_ID_HEADER = "bitroute.message_id";
    static final String SUBSCRIPTION_IDS_HEADER = "bitroute.subscription_ids";
    static final String SNAPSHOT_VERSION_HEADER = "bitroute.snapshot_version";
    /** schemas.records.ROUTER_HEADERS: a publisher cannot forge them. */
    static final Set<String> ROUTER_HEADERS = Set.of(MESSAGE_ID_HEADER, SUBSCRIPTION_IDS_HEADER,
            SNAPSHOT_VERSION_HEADER, "bitroute.reason", "bitroute.source", "bitroute.routing_key");

    static final LongAdder PUBLISHES = new LongAdder();
    static final LongAdder FORWARDED = new LongAdder();
    static final LongAdder REJECTED = new LongAdder();
    private static final int LOGGED_REJECTIONS = 10;

    private final Subscriptions subscriptions;
    private final String defaultExchange;
    private final CharsetDecoder utf8 = StandardCharsets.UTF_8.newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT).onUnmappableCharacter(CodingErrorAction.REPORT);
    private ProcessorContext<DeliveryKey, byte[]> context;

    RouteProcessor(Subscriptions subscriptions, String defaultExchange) {
        this.subscriptions = subscriptions;
        this.defaultExchange = defaultExchange;
    }

    @Override
    public void init(ProcessorContext<DeliveryKey, byte[]> context) {
        this.context = context;
    }

    @Override
    public void process(Record<byte[], byte[]> publish) {
        PUBLISHES.increment();
        String messageId = context.recordMetadata()
                .map(m -> m.topic() + "/" + m.partition() + "/" + m.offset()).orElse("?");
        Header exchangeHeader = publish.headers().lastHeader(EXCHANGE_HEADER);
        String exchange;
        String routingKey;
        try {
            exchange = exchangeHeader == null ? defaultExchange : decode(exchangeHeader.value());
            routingKey = decode(publish.key());
        } catch (CharacterCodingException e) {
            reject(messageId, "the exchange header or the routing key is not valid UTF-8");
            return;
        }
        Subscriptions.Match match = subscriptions.match(exchange, routingKey);
        if (match.error() != null) {
            reject(messageId, match.error());
            return;
        }
        if (match.bySubscriber().isEmpty()) {
            return;
        }
        Header[] kept = keptHeaders(publish.headers());
        byte[] id = messageId.getBytes(StandardCharsets.UTF_8);
        byte[] version = Long.toString(match.version()).getBytes(StandardCharsets.US_ASCII);
        for (Map.Entry<String, TreeSet<String>> e : match.bySubscriber().entrySet()) {
            Headers headers = new RecordHeaders(kept);
            headers.add(MESSAGE_ID_HEADER, id);
            headers.add(SUBSCRIPTION_IDS_HEADER, jsonArray(e.getValue()));
            headers.add(SNAPSHOT_VERSION_HEADER, version);
            context.forward(new Record<>(new DeliveryKey(e.getKey(), publish.key()), publish.value(),
                    publish.timestamp(), headers));
            FORWARDED.increment();
        }
    }

    private String decode(byte[] bytes) throws CharacterCodingException {
        return bytes == null ? "" : utf8.decode(ByteBuffer.wrap(bytes)).toString();
    }

    private static Header[] keptHeaders(Headers headers) {
        int n = 0;
        for (Header h : headers) {
            n++;
        }
        Header[] out = new Header[n];
        int i = 0;
        for (Header h : headers) {
            if (!ROUTER_HEADERS.contains(h.key())) {
                out[i++] = h;
            }
        }
        return i == n ? out : Arrays.copyOf(out, i);
    }

    private static byte[] jsonArray(TreeSet<String> ids) {
        StringBuilder sb = new StringBuilder("[");
        JsonStringEncoder enc = JsonStringEncoder.getInstance();
        for (String id : ids) {
            if (sb.length() > 1) {
                sb.append(',');
            }
            sb.append('"').append(enc.quoteAsString(id)).append('"');
        }
        return sb.append(']').toString().getBytes(StandardCharsets.UTF_8);
    }

    private static void reject(String messageId, String reason) {
        REJECTED.increment();
        if (REJECTED.sum() <= LOGGED_REJECTIONS) {
            System.err.println("kstreams-peer: publish " + messageId + " not routed: " + reason);
        }
    }
}
