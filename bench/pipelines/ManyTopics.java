// bench/pipelines/ManyTopics.java: the broker side of dev/bench-pipelines, in one JVM per step.
//
// dev/bench-pipelines needs up to 100 topics, 100 share groups that start from the earliest offset, and records
// produced to every topic. Apache's command-line tools take one topic or one group per JVM start (about 1-2 s each on
// this machine), so 100 pipelines would spend minutes in tool starts; this file does each step in one Admin call or
// one producer, with the Kafka client jars that `dev/kafka tool` already puts on the class path (Java 11+ runs a
// single source file directly: `dev/kafka tool bench/pipelines/ManyTopics.java ARGS`).
//
//   create BOOTSTRAP PREFIX N GROUP_SUFFIX
//       topics PREFIX-0 .. PREFIX-(N-1), one partition each (one CreateTopics request; existing ones are kept), and
//       share.auto.offset.reset=earliest on groups PREFIX-i-GROUP_SUFFIX (one IncrementalAlterConfigs request).
//   fill BOOTSTRAP PREFIX N PER_TOPIC SIZE
//       PER_TOPIC records of SIZE bytes to every topic, as fast as the producer goes; waits for every ack.
//   produce BOOTSTRAP PREFIX N RATE SECONDS SIZE
//       RATE records/s in total, spread round-robin over the N topics, for SECONDS; waits for every ack.
//       Prints "sent COUNT in SECONDS s" on stdout.
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ManyTopics {
    public static void main(String[] args) throws Exception {
        if (args.length < 4) usage();
        String bootstrap = args[1], prefix = args[2];
        int n = Integer.parseInt(args[3]);
        switch (args[0]) {
            case "create" -> create(bootstrap, prefix, n, arg(args, 4));
            case "fill" -> fill(bootstrap, prefix, n, Integer.parseInt(arg(args, 4)), Integer.parseInt(arg(args, 5)));
            case "produce" -> produce(bootstrap, prefix, n, Integer.parseInt(arg(args, 4)),
                    Integer.parseInt(arg(args, 5)), Integer.parseInt(arg(args, 6)));
            default -> usage();
        }
    }

    static String arg(String[] args, int i) {
        if (i >= args.length) usage();
        return args[i];
    }

    static void usage() {
        System.err.println("usage: ManyTopics create BOOTSTRAP PREFIX N GROUP_SUFFIX | fill BOOTSTRAP PREFIX N PER_TOPIC SIZE"
                + " | produce BOOTSTRAP PREFIX N RATE SECONDS SIZE");
        System.exit(2);
    }

    static void create(String bootstrap, String prefix, int n, String groupSuffix) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(p)) {
            List<NewTopic> topics = new ArrayList<>();
            for (int i = 0; i < n; i++) topics.add(new NewTopic(prefix + "-" + i, 1, (short) 1));
            var created = admin.createTopics(topics).values();
            for (var e : created.entrySet()) {
                try {
                    e.getValue().get(60, TimeUnit.SECONDS);
                } catch (java.util.concurrent.ExecutionException ex) {
                    if (!(ex.getCause() instanceof TopicExistsException)) throw ex;
                }
            }
            // The share-partition start offset is fixed when a group first reads a partition: set it before that.
            Map<ConfigResource, java.util.Collection<AlterConfigOp>> configs = new HashMap<>();
            for (int i = 0; i < n; i++) {
                configs.put(new ConfigResource(ConfigResource.Type.GROUP, prefix + "-" + i + "-" + groupSuffix),
                        List.of(new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
                                AlterConfigOp.OpType.SET)));
            }
            admin.incrementalAlterConfigs(configs).all().get(60, TimeUnit.SECONDS);
        }
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("linger.ms", "5");
        p.put("acks", "1");
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static void fill(String bootstrap, String prefix, int n, int perTopic, int size) throws Exception {
        byte[] value = new byte[size];
        AtomicReference<Exception> failed = new AtomicReference<>();
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap)) {
            for (int k = 0; k < perTopic; k++) {
                for (int i = 0; i < n; i++) {
                    producer.send(new ProducerRecord<>(prefix + "-" + i, value), (m, e) -> {
                        if (e != null) failed.compareAndSet(null, e);
                    });
                }
            }
            producer.flush();
        }
        if (failed.get() != null) throw failed.get();
    }

    static void produce(String bootstrap, String prefix, int n, int rate, int seconds, int size) throws Exception {
        byte[] value = new byte[size];
        AtomicReference<Exception> failed = new AtomicReference<>();
        long sent = 0, total = (long) rate * seconds;
        long start = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap)) {
            while (sent < total) {
                // Records due by now at RATE/s; send them, then sleep 10 ms (a smooth load, not one burst per second).
                long due = Math.min(total, (System.nanoTime() - start) * rate / 1_000_000_000L + 1);
                for (; sent < due; sent++) {
                    producer.send(new ProducerRecord<>(prefix + "-" + (sent % n), value), (m, e) -> {
                        if (e != null) failed.compareAndSet(null, e);
                    });
                }
                Thread.sleep(10);
            }
            producer.flush();
        }
        if (failed.get() != null) throw failed.get();
        System.out.printf("sent %d in %.2f s%n", sent, (System.nanoTime() - start) / 1e9);
    }
}
