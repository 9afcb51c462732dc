package bitroute.bench.kstreams;

import java.util.Map;
import java.util.concurrent.atomic.LongAdder;
import org.apache.kafka.clients.producer.ProducerInterceptor;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;

/**
 * Counts the records Kafka acknowledged (every stream thread's producer loads one), so that the
 * progress lines report deliveries written, not merely handed to the producer.
 */
public final class AckCounter implements ProducerInterceptor<Object, Object> {
    static final LongAdder ACKED = new LongAdder();
    static final LongAdder FAILED = new LongAdder();

    @Override
    public ProducerRecord<Object, Object> onSend(ProducerRecord<Object, Object> record) {
        return record;
    }

    @Override
    public void onAcknowledgement(RecordMetadata metadata, Exception exception) {
        (exception == null ? ACKED : FAILED).increment();
    }

    @Override
    public void close() {}

    @Override
    public void configure(Map<String, ?> configs) {}
}
