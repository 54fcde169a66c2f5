// The Java side of the Python tests, run as a single-file program on the gpumemctl jar's
// classpath (java -cp ctl/target/gpumemctl.jar JavaPeer.java MODE TARGET DEVICE SIZE SEED):
// write: lease, write the pattern, print "segment offset", release; read: lease, print
// "segment offset", check the pattern (byte i = (7 i + seed) mod 251, as tests/worker.py).
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.nio.ByteBuffer;

public class JavaPeer {
  public static void main(String[] args) {
    String mode = args[0];
    int device = Integer.parseInt(args[2]);
    long size = Long.parseLong(args[3]);
    long seed = Long.parseLong(args[4]);
    try (GpuMemClient client = GpuMemClient.builder(args[1]).clientName("pytest-java-" + mode)
            .clientCacheBytes(0).connect();
         Lease lease = client.lease(device, size)) {
      System.out.println(lease.segmentId() + " " + lease.offset());
      ByteBuffer memory = lease.buffer();
      for (int i = 0; i < size; i++) {
        byte expected = (byte) ((7L * i + seed) % 251);
        if (mode.equals("write")) {
          memory.put(i, expected);
        } else if (memory.get(i) != expected) {
          System.err.println("pattern mismatch at " + i + " of " + lease);
          System.exit(1);
        }
      }
    }
  }
}
