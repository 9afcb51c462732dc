package bitroute.bench.kstreams;

import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.processor.TopicNameExtractor;

/**
 * A delivery's key inside the topology: the subscriber (it picks the topic, through
 * {@link #topics}) and the routing key (the only part written: {@link #SERDE}), so that the
 * delivery record carries no extra header or key bytes beyond bitroute's contract.
 */
record DeliveryKey(String subscriber, byte[] routingKey) {

    /** Writes the routing key alone; deliveries are never read back by this application. */
    static final Serde<DeliveryKey> SERDE = new Serde<>() {
        @Override
        public Serializer<DeliveryKey> serializer() {
            return (topic, key) -> key == null ? null : key.routingKey();
        }

        @Override
        public Deserializer<DeliveryKey> deserializer() {
            return (topic, data) -> {
                throw new UnsupportedOperationException("deliveries are write-only here");
            };
        }
    };

    /** The dynamic sink: {@code prefix + subscriber}, as bitroute's default layout. */
    static TopicNameExtractor<DeliveryKey, byte[]> topics(String prefix) {
        return (key, value, recordContext) -> prefix + key.subscriber();
    }
}
