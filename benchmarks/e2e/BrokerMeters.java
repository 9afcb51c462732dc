// The Kafka broker's own counters over JMX, for benchmarks/e2e/produce_requests.py.
//
//     java benchmarks/e2e/BrokerMeters.java PORT
//
// Connects to the broker's JMX port on 127.0.0.1 and, for each line read on stdin,
// prints one JSON line of cumulative counters:
//   produce_requests  kafka.network RequestMetrics RequestsPerSec, request=Produce (all versions)
//   requests          the same over every request type
//   messages_in       kafka.server BrokerTopicMetrics MessagesInPerSec (every topic)
//   bytes_in          kafka.server BrokerTopicMetrics BytesInPerSec
//   cpu_s             CPU seconds of the broker's Java threads, summed by role: network
//                     (the socket server's processors), handler (the request handler
//                     pool), other (log cleaner, controller, timers, ...). GC threads are
//                     not Java threads: /proc counts them, this does not.
// Run with the JDK's source launcher: no build step, no dependency beyond the JDK.

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadInfo;
import java.lang.management.ThreadMXBean;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Map;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerMeters {
    public static void main(String[] args) throws Exception {
        var url = new JMXServiceURL("service:jmx:rmi:///jndi/rmi://127.0.0.1:" + args[0] + "/jmxrmi");
        try (var connector = JMXConnectorFactory.connect(url)) {
            MBeanServerConnection server = connector.getMBeanServerConnection();
            ThreadMXBean threads = ManagementFactory.newPlatformMXBeanProxy(
                server, ManagementFactory.THREAD_MXBEAN_NAME, ThreadMXBean.class);
            var in = new BufferedReader(new InputStreamReader(System.in));
            while (in.readLine() != null) {
                Map<String, Object> out = new TreeMap<>();
                out.put("produce_requests", count(server,
                    "kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce,*"));
                out.put("requests", count(server, "kafka.network:type=RequestMetrics,name=RequestsPerSec,*"));
                out.put("messages_in", count(server, "kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec"));
                out.put("bytes_in", count(server, "kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec"));
                Map<String, Double> cpu = new TreeMap<>();
                long[] ids = threads.getAllThreadIds();
                ThreadInfo[] infos = threads.getThreadInfo(ids);
                for (int i = 0; i < ids.length; i++) {
                    if (infos[i] == null) continue;
                    long ns = threads.getThreadCpuTime(ids[i]);
                    if (ns < 0) continue;
                    String name = infos[i].getThreadName();
                    String role = name.contains("network-thread") ? "network"
                        : name.contains("request-handler") ? "handler" : "other";
                    cpu.merge(role, ns / 1e9, Double::sum);
                }
                out.put("cpu_s", cpu);
                System.out.println(json(out));
                System.out.flush();
            }
        }
    }

    private static long count(MBeanServerConnection server, String pattern) throws Exception {
        long total = 0;
        for (ObjectName name : server.queryNames(new ObjectName(pattern), null)) {
            total += ((Number) server.getAttribute(name, "Count")).longValue();
        }
        return total;
    }

    private static String json(Object value) {
        if (value instanceof Map<?, ?> map) {
            var sb = new StringBuilder("{");
            for (var e : map.entrySet()) {
                if (sb.length() > 1) sb.append(", ");
                sb.append('"').append(e.getKey()).append("\": ").append(json(e.getValue()));
            }
            return sb.append('}').toString();
        }
        return String.valueOf(value);
    }
}
