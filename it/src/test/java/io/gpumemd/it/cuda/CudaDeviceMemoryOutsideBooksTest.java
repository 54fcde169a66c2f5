package io.gpumemd.it.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.server.testing.DaemonProcess;
import io.grpc.Status;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * Issue 33 item 3: device memory that another process holds is not the daemon's to hand out. A
 * second process takes all of device 0 but 256 MiB behind the daemon's back; a 512 MiB lease,
 * well inside the daemon's own budget, is then refused RESOURCE_EXHAUSTED naming the driver's
 * free count and the memory outside the daemon's books (the daemon checks {@code cuMemGetInfo}
 * before it creates a segment) instead of creating a segment the device cannot hold, and
 * {@code gpumemd_device_unaccounted_bytes} reports that memory. Once the other process exits the
 * same lease is served. On the stand-in driver the device is 2 GiB; on a real GPU that variable
 * is ignored and the test sizes itself by the device's free memory.
 */
class CudaDeviceMemoryOutsideBooksTest {
  private static final long MIB = 1L << 20;

  @Test
  void memoryAnotherProcessHolds_isNotHandedOut_andIsReported() throws Exception {
    CudaAvailability.assumeUsable();
    // The stand-in's device is 2 GiB for the daemon and the other process (the test's client,
    // which allocates nothing, opens the daemon's handles in the node's shared directory).
    Map<String, String> env = Map.of("CUDA_STANDIN_TOTAL_BYTES", Long.toString(2048 * MIB));
    int port;
    try (java.net.ServerSocket socket = new java.net.ServerSocket(0)) {
      port = socket.getLocalPort();
    }
    DaemonProcess daemon = DaemonProcess.startWith(env, "--backend", "cuda", "--cuda-handles", "legacy",
        "--metrics-host", "127.0.0.1", "--metrics-port", Integer.toString(port));
    Process hog = null;
    try (GpuMemClient client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      ProcessBuilder builder = new ProcessBuilder(DaemonProcess.javaCommand(DeviceMemoryHogMain.class.getName()));
      builder.command().add(Long.toString(256 * MIB));
      hog = DaemonProcess.withEnvironment(builder, env).redirectErrorStream(true).start();
      BufferedReader out = new BufferedReader(new InputStreamReader(hog.getInputStream(), StandardCharsets.UTF_8));
      String line = out.readLine();
      assertTrue(line != null && line.startsWith("held "), "the other process did not take its memory: " + line);
      long held = Long.parseLong(line.substring(5));

      GpuMemException refused = assertThrows(GpuMemException.class, () -> client.lease(0, 512 * MIB).close());
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, refused.code(), refused.getMessage());
      assertTrue(refused.getMessage().contains("outside gpumemd's books"), refused.getMessage());
      assertTrue(unaccounted(daemon) >= held, "gauge below the " + held + " bytes the other process holds");

      hog.getOutputStream().close();
      assertTrue(hog.waitFor(30, TimeUnit.SECONDS), "the other process did not exit");
      try (Lease lease = client.lease(0, 512 * MIB)) {
        assertEquals(512 * MIB, lease.sizeBytes());
      }
      assertTrue(unaccounted(daemon) < held, "the other process's memory still counted after it exited");
    } finally {
      if (hog != null) {
        hog.destroyForcibly();
      }
      daemon.close();
    }
  }

  /** {@code gpumemd_device_unaccounted_bytes{device="0"}} from the daemon's /metrics. */
  private static long unaccounted(DaemonProcess daemon) throws Exception {
    String text = HttpClient.newHttpClient().send(HttpRequest.newBuilder(
        URI.create("http://127.0.0.1:" + daemon.metricsPort() + "/metrics")).build(),
        HttpResponse.BodyHandlers.ofString()).body();
    Matcher m = Pattern.compile("(?m)^gpumemd_device_unaccounted_bytes\\{device=\"0\"[^}]*} ([0-9.E+]+)$").matcher(text);
    assertTrue(m.find(), "no gpumemd_device_unaccounted_bytes for device 0 in:\n" + text);
    return (long) Double.parseDouble(m.group(1));
  }
}
