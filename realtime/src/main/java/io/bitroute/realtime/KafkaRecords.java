package io.bitroute.realtime;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;

/**
 * The record rules of {@code schemas/records.py} and {@code streaming/kafka/records.py}, on the
 * JVM: header names, which headers a delivery keeps, a record's size as the broker counts it,
 * the rejected topic's copy, and the audit's text of bytes. Each method names the Python it
 * mirrors; a change there is a change here (tests/streaming/realtime checks them side by side).
 */
final class KafkaRecords {
    static final String EXCHANGE_HEADER = "exchange";
    static final String MESSAGE_ID_HEADER = "bitroute.message_id";
    static final String SUBSCRIPTION_IDS_HEADER = "bitroute.subscription_ids";
    static final String SNAPSHOT_VERSION_HEADER = "bitroute.snapshot_version";
    static final String REASON_HEADER = "bitroute.reason";
    static final String SOURCE_HEADER = "bitroute.source";
    static final String ROUTING_KEY_HEADER = "bitroute.routing_key";
    /** A publish's Message Expiry Interval (seconds); a delivery's is the remaining one. */
    static final String EXPIRY_HEADER = "expiry";
    /** {@code schemas.records.ROUTER_HEADERS}: a publish carrying one has it replaced. */
    static final Set<String> ROUTER_HEADERS = Set.of(MESSAGE_ID_HEADER, SUBSCRIPTION_IDS_HEADER,
            SNAPSHOT_VERSION_HEADER, REASON_HEADER, SOURCE_HEADER, ROUTING_KEY_HEADER,
            "bitroute.retained", "bitroute.published_at", "bitroute.replayed",
            RouteOutcome.ALTERNATE_EXCHANGE_HEADER);
    static final String SOURCE_PUBLISH = "publish";

    static final int RECORD_BATCH_OVERHEAD = 61;
    static final int RECORD_OVERHEAD = 21;
    static final int HEADER_OVERHEAD = 10;

    /** A Kafka header as the Spark Kafka source and sink carry it (value may be null). */
    record Header(String name, byte[] value) {
    }

    private KafkaRecords() {
    }

    /** {@code header_size}: the bytes header {@code name} adds with a value of {@code valueBytes}. */
    static long headerSize(String name, long valueBytes) {
        return HEADER_OVERHEAD + utf8(name).length + valueBytes;
    }

    /** {@code record_size}: an upper bound of the bytes a broker counts for this record alone. */
    static long recordSize(byte[] key, byte[] value, List<Header> headers) {
        long size = RECORD_BATCH_OVERHEAD + RECORD_OVERHEAD + length(key) + length(value);
        for (Header h : headers) {
            size += headerSize(h.name(), length(h.value()));
        }
        return size;
    }

    /** {@code kept} with every {@code expiry} header's value set to {@code remaining}
     *  seconds, in place (routing.py {@code expiry_header_values}). */
    static List<Header> withRemainingExpiry(List<Header> kept, long remaining) {
        byte[] value = utf8(Long.toString(remaining));
        List<Header> out = new ArrayList<>(kept.size());
        for (Header h : kept) {
            out.add(h.name().equals(EXPIRY_HEADER) ? new Header(h.name(), value) : h);
        }
        return out;
    }

    /** {@code kept_headers}: a publish's headers as its deliveries carry them, in order. */
    static List<Header> keptHeaders(List<Header> headers) {
        List<Header> kept = new ArrayList<>(headers.size());
        for (Header h : headers) {
            if (!ROUTER_HEADERS.contains(h.name())) {
                kept.add(h);
            }
        }
        return kept;
    }

    /** {@code rejected_headers}: {@code kept} plus reason, source and message id. */
    static List<Header> rejectedHeaders(List<Header> kept, String reason, String source,
                                        String messageId) {
        List<Header> headers = new ArrayList<>(kept.size() + 3);
        headers.addAll(kept);
        headers.add(new Header(REASON_HEADER, utf8(reason)));
        headers.add(new Header(SOURCE_HEADER, utf8(source)));
        headers.add(new Header(MESSAGE_ID_HEADER, utf8(messageId)));
        return headers;
    }

    /** The rejected topic's copy of a bad record ({@code rejected_copy}). */
    record RejectedCopy(byte[] value, List<Header> headers, String reason) {
    }

    /** {@code rejected_copy}: whole when it fits {@code limit} bytes, else without payload or
     *  the record's own headers, the reason saying so. */
    static RejectedCopy rejectedCopy(byte[] key, byte[] value, List<Header> kept, String reason,
                                     String source, String messageId, long limit) {
        List<Header> headers = rejectedHeaders(kept, reason, source, messageId);
        if (recordSize(key, value, headers) <= limit) {
            return new RejectedCopy(value, headers, reason);
        }
        String shorter = reason + " (the copy in the rejected topic has no payload or headers: too large)";
        return new RejectedCopy(null, rejectedHeaders(List.of(), shorter, source, messageId), shorter);
    }

    /**
     * {@code text}: bytes as text for the audit, as Python's
     * {@code bytes.decode("utf-8", "backslashreplace")}: well-formed UTF-8 decoded, every other
     * byte shown as {@code \xNN} (lower-case hex). Null stays null.
     */
    static String text(byte[] bytes) {
        if (bytes == null) {
            return null;
        }
        StringBuilder out = null;
        int i = 0;
        int copiedUpTo = 0;
        while (i < bytes.length) {
            int n = wellFormedLength(bytes, i);
            if (n > 0) {
                i += n;
                continue;
            }
            if (out == null) {
                out = new StringBuilder(bytes.length + 16);
            }
            out.append(new String(bytes, copiedUpTo, i - copiedUpTo, StandardCharsets.UTF_8));
            out.append(String.format("\\x%02x", bytes[i] & 0xff));
            i += 1;
            copiedUpTo = i;
        }
        if (out == null) {
            return new String(bytes, StandardCharsets.UTF_8);
        }
        out.append(new String(bytes, copiedUpTo, bytes.length - copiedUpTo, StandardCharsets.UTF_8));
        return out.toString();
    }

    /** The length of the well-formed UTF-8 sequence at {@code i} (Unicode table 3-7: no
     *  overlong forms, no surrogates, nothing above U+10FFFF), 0 when there is none. Python's
     *  decoder escapes each byte outside such sequences alike. */
    private static int wellFormedLength(byte[] b, int i) {
        int b0 = b[i] & 0xff;
        if (b0 < 0x80) {
            return 1;
        }
        int n;
        int lo = 0x80;
        int hi = 0xbf;
        if (b0 >= 0xc2 && b0 <= 0xdf) {
            n = 2;
        } else if (b0 >= 0xe0 && b0 <= 0xef) {
            n = 3;
            if (b0 == 0xe0) {
                lo = 0xa0;
            } else if (b0 == 0xed) {
                hi = 0x9f;
            }
        } else if (b0 >= 0xf0 && b0 <= 0xf4) {
            n = 4;
            if (b0 == 0xf0) {
                lo = 0x90;
            } else if (b0 == 0xf4) {
                hi = 0x8f;
            }
        } else {
            return 0;
        }
        if (i + n > b.length) {
            return 0;
        }
        int b1 = b[i + 1] & 0xff;
        if (b1 < lo || b1 > hi) {
            return 0;
        }
        for (int k = 2; k < n; k++) {
            int c = b[i + k] & 0xff;
            if (c < 0x80 || c > 0xbf) {
                return 0;
            }
        }
        return n;
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static long length(byte[] bytes) {
        return bytes == null ? 0 : bytes.length;
    }
}
