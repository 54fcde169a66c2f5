// A Java worker for tests/test_takeover.py, run as a single-file program on the gpumemctl jar's
// classpath (java -cp ctl/target/gpumemctl.jar JavaLoop.java TARGET STOP_FILE): holds a 1 MiB lease
// with a pattern, leases, writes, reads back and closes in a loop until STOP_FILE exists, then
// checks its lease and prints "leases N failures F session same|changed" (and each failure).
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

public class JavaLoop {
  public static void main(String[] args) throws Exception {
    Path stop = Path.of(args[1]);
    List<String> failures = new ArrayList<>();
    long leases = 0;
    try (GpuMemClient client = GpuMemClient.builder(args[0]).clientName("pytest-java-loop").connect()) {
      String session = client.sessionId();
      Lease held = client.lease(0, 1 << 20);
      ByteBuffer memory = held.buffer();
      for (int i = 0; i < memory.capacity(); i += 512) {
        memory.put(i, (byte) (i / 512));
      }
      System.out.println("ready " + session);
      System.out.flush();
      while (!Files.exists(stop)) {
        long size = 4096L << (leases % 8);
        try (Lease lease = client.lease((int) (leases % 2), size)) {
          ByteBuffer b = lease.buffer();
          b.put(0, (byte) 7);
          b.put((int) size - 1, (byte) 9);
          if (b.get(0) != 7 || b.get((int) size - 1) != 9) {
            failures.add("bytes changed under the writer in " + lease);
          }
          leases++;
        } catch (RuntimeException e) {
          if (failures.size() < 20) {
            failures.add(e.toString());
          }
        }
      }
      for (int i = 0; i < memory.capacity(); i += 512) {
        if (memory.get(i) != (byte) (i / 512)) {
          failures.add("the held lease lost its bytes at " + i);
          break;
        }
      }
      held.close();
      System.out.println("leases " + leases + " failures " + failures.size() + " session "
          + (session.equals(client.sessionId()) ? "same" : "changed"));
      failures.forEach(System.out::println);
    }
  }
}
