package io.gpumemd.server;

import io.gpumemd.server.auth.Caller;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.config.ServerOptions;
import io.gpumemd.server.testing.LogCapture;
import io.gpumemd.server.testing.TestDaemon;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A daemon that cannot start says which listener and address stopped it, logs nothing about a
 * shutdown or freed memory (it never served), and leaves nothing behind: the shared-memory
 * directory it created and the socket file are gone.
 */
class FailedStartTest {
  @TempDir
  Path dir;

  private IOException startExpectingFailure(String... extraFlags) {
    List<String> args = new ArrayList<>(List.of(TestDaemon.defaultFlags(dir)));
    args.addAll(List.of(extraFlags));
    var config = ServerOptions.parse(args.toArray(String[]::new), Map.of());
    try (LogCapture log = new LogCapture(GpumemdServer.class)) {
      IOException e = assertThrows(IOException.class, () -> GpumemdServer.start(config));
      List<String> info = log.messages("INFO");
      assertFalse(info.stream().anyMatch(m -> m.contains("Shutting down") || m.contains("memory freed")),
          "a failed start logs no shutdown: " + info);
      assertFalse(info.stream().anyMatch(m -> m.startsWith("gpumemd ready")), "never ready: " + info);
      return e;
    }
  }

  @Test
  void tcpPortInUse_namesTheListenerAndAddress_andLeavesNothingBehind() throws IOException {
    try (ServerSocket taken = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      int port = taken.getLocalPort();
      IOException e = startExpectingFailure("--listen", "127.0.0.1:" + port);
      assertEquals("tcp listener: 127.0.0.1:" + port + " already in use", e.getMessage());
    }
    assertFalse(Files.exists(dir.resolve("shm")), "the shm directory the daemon created is removed");
    assertFalse(Files.exists(dir.resolve("gpumemd.sock")), "the socket file is removed");
  }

  @Test
  void metricsPortInUse_namesTheMetricsListener() throws IOException {
    try (ServerSocket taken = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      int port = taken.getLocalPort();
      IOException e = startExpectingFailure("--metrics-host", "127.0.0.1", "--metrics-port", Integer.toString(port));
      assertEquals("metrics listener: 127.0.0.1:" + port + " already in use", e.getMessage());
    }
    assertFalse(Files.exists(dir.resolve("shm")));
  }

  @Test
  void socketOfALiveDaemon_isRefused_andTheLiveDaemonKeepsIt() throws IOException {
    try (TestDaemon live = TestDaemon.start()) {
      Path socket = live.server().socketPath();
      IOException e = startExpectingFailure("--socket", socket.toString(), "--listen", "none");
      assertEquals("unix listener: " + socket + " is in use by a running process (expected: a free path)", e.getMessage());
      assertTrue(Files.exists(socket), "the live daemon's socket stays");
    }
  }

  @Test
  void existingShmDirectory_ofTheOperator_isKept() throws IOException {
    Files.createDirectories(dir.resolve("shm"));
    try (ServerSocket taken = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      startExpectingFailure("--listen", "127.0.0.1:" + taken.getLocalPort());
    }
    assertTrue(Files.isDirectory(dir.resolve("shm")), "a directory the daemon did not create stays");
  }

  @Test
  void socketPathThatIsARegularFile_isRefused_andTheFileKept() throws IOException {
    Path file = dir.resolve("notes.txt");
    Files.writeString(file, "an operator's file");
    IOException e = startExpectingFailure("--socket", file.toString());
    assertEquals("unix listener: " + file + " exists and is a regular file; gpumemd replaces only a stale socket "
        + "(expected: a free path for --socket)", e.getMessage());
    assertEquals("an operator's file", Files.readString(file), "the file is untouched");
  }

  @Test
  void sharedShmDirectory_keepsItsMode_andTheDaemonUsesItsOwnSubdirectory() throws IOException {
    Path shared = dir.resolve("shared");
    Files.createDirectories(shared);
    Files.setAttribute(shared, "unix:mode", 01777);
    // path segments: a descriptor segment has no file in the directory to look for
    try (TestDaemon daemon = TestDaemon.start("--host-segments", "path", "--shm-dir", shared.toString())) {
      var session = daemon.server().registry().open(Caller.DAEMON, "shm-check", 0, -1);
      daemon.server().registry().lease(Caller.DAEMON, session.id(), 0, 4096, false, "", false);
      try (var files = Files.list(shared.resolve("gpumemd").resolve("dev0"))) {
        assertEquals(1, files.filter(f -> f.getFileName().toString().startsWith("seg-")).count(),
            "the segment lives in the daemon's own subdirectory");
      }
      assertEquals(01777, (Integer) Files.getAttribute(shared, "unix:mode") & 07777, "the shared directory's mode");
    }
    assertEquals(01777, (Integer) Files.getAttribute(shared, "unix:mode") & 07777, "still, after the daemon stopped");
    assertFalse(Files.exists(shared.resolve("gpumemd")), "its own subdirectory is removed at close");
  }

  @Test
  void sharedShmDirectory_whoseSubdirectoryIsSomeoneElses_isRefused() throws IOException {
    Path shared = dir.resolve("shared");
    Path planted = shared.resolve("gpumemd");
    Files.createDirectories(planted);
    Files.setAttribute(shared, "unix:mode", 01777);
    Files.setAttribute(planted, "unix:mode", 0777); // anyone could swap the files in it
    List<String> args = new ArrayList<>(List.of(TestDaemon.defaultFlags(dir)));
    args.addAll(List.of("--shm-dir", shared.toString()));
    var config = ServerOptions.parse(args.toArray(String[]::new), Map.of());
    var e = assertThrows(io.gpumemd.server.backend.BackendException.class, () -> GpumemdServer.start(config));
    assertTrue(e.getMessage().contains(planted + " is not this user's own"), e.getMessage());
    assertEquals(0777, (Integer) Files.getAttribute(planted, "unix:mode") & 07777, "left as it was");
  }
}
