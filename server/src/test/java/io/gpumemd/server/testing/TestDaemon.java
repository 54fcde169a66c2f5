package io.gpumemd.server.testing;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.GpumemdServer;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.config.ServerOptions;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;

/**
 * A real daemon started inside the test JVM on the host backend, with its own temporary
 * shared-memory directory and Unix socket, TCP on an ephemeral loopback port and metrics off
 * (unless asked). Close it to shut the daemon down and delete the directory.
 */
public final class TestDaemon implements AutoCloseable {
  private final GpumemdServer server;
  private final Path dir;

  private TestDaemon(GpumemdServer server, Path dir) {
    this.server = server;
    this.dir = dir;
  }

  /** Starts with the default test flags, then {@code extraFlags} (later flags win). */
  public static TestDaemon start(String... extraFlags) {
    return start(Ticker.system(), extraFlags);
  }

  public static TestDaemon start(Ticker ticker, String... extraFlags) {
    try {
      Path dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-test-");
      List<String> args = new ArrayList<>(List.of(defaultFlags(dir)));
      args.addAll(List.of(extraFlags));
      ServerConfig config = ServerOptions.parse(args.toArray(String[]::new), Map.of());
      return new TestDaemon(GpumemdServer.start(config, ticker), dir);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Flags for a small, isolated host-backend daemon rooted at {@code dir}. */
  public static String[] defaultFlags(Path dir) {
    return new String[] {
        "--backend", "host",
        "--socket", dir.resolve("gpumemd.sock").toString(),
        "--listen", "127.0.0.1:0",
        "--metrics-port", "0",
        "--shm-dir", dir.resolve("shm").toString(),
        "--host-devices", "2",
        "--host-device-bytes", "256MiB",
        "--device-limit-fraction", "1.0",
        "--keepalive-grace-ms", "500",
        "--drain-timeout-ms", "2000",
    };
  }

  public GpumemdServer server() {
    return server;
  }

  public String tcpTarget() {
    return "127.0.0.1:" + server.tcpPort();
  }

  public String unixTarget() {
    return "unix://" + server.socketPath();
  }

  public Path shmDir() {
    return dir.resolve("shm");
  }

  /** Segment files currently present on a device. */
  public long segmentFiles(int device) {
    Path devDir = shmDir().resolve("dev" + device);
    if (!Files.isDirectory(devDir)) {
      return 0;
    }
    try (Stream<Path> files = Files.list(devDir)) {
      return files.filter(p -> p.getFileName().toString().startsWith("seg-")).count();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Checks every pool's invariants. */
  public void verifyInvariants() {
    server.pools().all().forEach(p -> p.verifyInvariants());
  }

  @Override
  public void close() {
    server.shutdown(true);
    try (Stream<Path> walk = Files.walk(dir)) {
      walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException e) {
      // best effort
    }
  }
}
