package io.bitroute.realtime;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * What {@link NativeRouter#route} decided for one publish, decoded from its bytes (realtime
 * contract, section 1: big-endian; a string is an int32 byte length, -1 for null, then UTF-8).
 *
 * @param outcome    {@link #ROUTED}, {@link #UNROUTABLE}, {@link #REJECTED} or {@link #EXPIRED}
 * @param exchange   the exchange the publish went to (null: its exchange header was unreadable)
 * @param routingKey the routing key as text (null: absent or not UTF-8)
 * @param reason     why it is rejected (null unless {@link #REJECTED})
 * @param deliveries one per subscriber, in the micro-batch path's order (empty unless routed)
 * @param remaining  the remaining expiry interval in seconds its deliveries carry in the
 *                   {@code expiry} header (-1: the publish has no expiry)
 * @param alternate  the alternate exchange whose subscriptions took the deliveries, its own
 *                   exchange having none (null: routed by its own exchange, or not routed)
 */
public record RouteOutcome(int outcome, String exchange, String routingKey, String reason,
                           List<Delivery> deliveries, long remaining, String alternate) {
    public static final int ROUTED = 0;
    public static final int UNROUTABLE = 1;
    public static final int REJECTED = 2;
    /** Its lifetime (the {@code expiry} header) ended before it was routed: no deliveries. */
    public static final int EXPIRED = 3;
    /** {@code schemas.records.ALTERNATE_EXCHANGE_HEADER}: on a delivery made through the
     *  alternate exchange, its name. */
    public static final String ALTERNATE_EXCHANGE_HEADER = "bitroute.alternate_exchange";

    /**
     * One subscriber's delivery.
     *
     * @param subscriber      its name
     * @param idsHeader       header bitroute.subscription_ids exactly as the micro-batch writes it
     * @param subscriptionIds the matched subscription ids, in output order
     */
    public record Delivery(String subscriber, String idsHeader, List<String> subscriptionIds) {
    }

    /** Decode {@code encoded}; an IllegalArgumentException names what was malformed. */
    public static RouteOutcome decode(byte[] encoded) {
        try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(encoded))) {
            int outcome = in.readUnsignedByte();
            String exchange = string(in);
            String routingKey = string(in);
            if (outcome == REJECTED) {
                return new RouteOutcome(outcome, exchange, routingKey, string(in), List.of(), -1,
                        null);
            }
            if (outcome != ROUTED && outcome != UNROUTABLE && outcome != EXPIRED) {
                throw new IllegalArgumentException("unknown outcome byte " + outcome);
            }
            int n = count(in, "deliveries");
            List<Delivery> deliveries = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                String subscriber = string(in);
                String idsHeader = string(in);
                int m = count(in, "subscription ids");
                List<String> ids = new ArrayList<>(m);
                for (int j = 0; j < m; j++) {
                    ids.add(string(in));
                }
                deliveries.add(new Delivery(subscriber, idsHeader, List.copyOf(ids)));
            }
            long remaining = in.readLong();
            String alternate = string(in);
            return new RouteOutcome(outcome, exchange, routingKey, null, List.copyOf(deliveries),
                    remaining, alternate);
        } catch (IOException e) { // EOFException: a truncated outcome
            throw new IllegalArgumentException("a truncated route outcome (" + encoded.length
                    + " bytes): " + e, e);
        }
    }

    private static int count(DataInputStream in, String what) throws IOException {
        int n = in.readInt();
        if (n < 0 || n > in.available()) {
            throw new IllegalArgumentException("a route outcome with " + n + " " + what);
        }
        return n;
    }

    private static String string(DataInputStream in) throws IOException {
        int length = in.readInt();
        if (length == -1) {
            return null;
        }
        if (length < 0 || length > in.available()) {
            throw new IllegalArgumentException("a route outcome string of " + length + " bytes");
        }
        byte[] bytes = in.readNBytes(length);
        return new String(bytes, StandardCharsets.UTF_8);
    }
}
