// A Flink job for tests/engines: which TaskManager JVMs (by process id) ran its parallel subtasks,
// and the sum of 2x over x = 1..N, printed as "pids=<p1,p2,...> sum=<s>".
import java.util.TreeSet;

import org.apache.flink.api.common.RuntimeExecutionMode;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.util.CloseableIterator;

public class SmokeJob {
    public static void main(String[] args) throws Exception {
        long n = Long.parseLong(args[0]);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setRuntimeMode(RuntimeExecutionMode.STREAMING);  // one pipelined region: every subtask at once
        TreeSet<Long> pids = new TreeSet<>();
        long sum = 0;
        // Keyed by the number: every parallel subtask of the map gets some of the N keys.
        try (CloseableIterator<Tuple2<Long, Long>> out = env.fromSequence(1, n)
                .keyBy(x -> x)
                .map(x -> Tuple2.of(ProcessHandle.current().pid(), 2 * x))
                .returns(Types.TUPLE(Types.LONG, Types.LONG))
                .executeAndCollect("smoke")) {
            while (out.hasNext()) {
                Tuple2<Long, Long> t = out.next();
                pids.add(t.f0);
                sum += t.f1;
            }
        }
        System.out.println("pids=" + String.join(",", pids.stream().map(String::valueOf).toList()) + " sum=" + sum);
    }
}
