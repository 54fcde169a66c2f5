package io.gpumemd.common.unix;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Pidfds of real peer processes (two Python processes, each connecting twice): one process is
 * one inode over its connections, another process another, and a killed one reads as exited.
 */
class PidfdTest {
  @TempDir Path dir;
  private int listening = -1;

  @BeforeEach
  void listen() throws Exception {
    listening = UnixSockets.listen(dir.resolve("s.sock").toString());
  }

  @AfterEach
  void close() {
    UnixSockets.closeQuietly(listening);
  }

  /** A process that connects twice to the socket and then waits to be killed. */
  private Process peer() throws Exception {
    String script = "import socket,time\n"
        + "a=socket.socket(socket.AF_UNIX); a.connect('" + dir.resolve("s.sock") + "')\n"
        + "b=socket.socket(socket.AF_UNIX); b.connect('" + dir.resolve("s.sock") + "')\n"
        + "time.sleep(60)\n";
    return new ProcessBuilder("python3", "-c", script).redirectErrorStream(true).start();
  }

  private Pidfd accepted() throws Exception {
    int connection = UnixSockets.accept(listening);
    try {
      Pidfd pidfd = Pidfd.ofPeer(connection);
      Assumptions.assumeTrue(pidfd != null, "this kernel names no peer by pidfd on pidfs (Linux 6.9 and later do)");
      return pidfd;
    } finally {
      UnixSockets.closeQuietly(connection); // the pidfd outlives the connection it came from
    }
  }

  @Test
  void oneProcess_isOneInode_anotherIsAnother_andAKilledOneHasExited() throws Exception {
    Process first = peer();
    Process second = null;
    try (Pidfd a1 = accepted(); Pidfd a2 = accepted()) {
      assertEquals(a1.inode(), a2.inode(), "two connections of one process");
      second = peer();
      try (Pidfd b = accepted()) {
        assertNotEquals(a1.inode(), b.inode(), "two processes");
        assertFalse(a1.exited());
        assertFalse(b.exited());

        first.destroyForcibly();
        assertTrue(first.waitFor(10, TimeUnit.SECONDS));
        assertTrue(a1.exited(), "the killed process");
        assertTrue(a2.exited());
        assertFalse(b.exited(), "the other lives on");
        assertNotNull(b.toString());
      }
      try (Pidfd unread = accepted()) { // the second process's other connection
        assertFalse(unread.exited());
      }
    } finally {
      first.destroyForcibly();
      if (second != null) {
        second.destroyForcibly();
      }
    }
  }

  @Test
  void aZombie_hasExited() throws Exception {
    // A grandchild that exits while its parent, sleeping, never reaps it: a zombie, whose memory
    // and descriptors are gone. It connects, waits for the end of its connection, and exits.
    String script = "import os,socket,sys,time\n"
        + "child=os.fork()\n"
        + "if child==0:\n"
        + "  s=socket.socket(socket.AF_UNIX); s.connect('" + dir.resolve("s.sock") + "'); s.recv(1); os._exit(0)\n"
        + "print(child, flush=True); time.sleep(60)\n";
    Process parent = new ProcessBuilder("python3", "-c", script).start();
    try {
      long child = Long.parseLong(new BufferedReader(new InputStreamReader(parent.getInputStream()))
          .readLine().trim());
      int connection = UnixSockets.accept(listening);
      try (Pidfd pidfd = Pidfd.ofPeer(connection)) {
        Assumptions.assumeTrue(pidfd != null, "this kernel names no peer by pidfd on pidfs (Linux 6.9 and later do)");
        assertFalse(pidfd.exited());
        UnixSockets.closeQuietly(connection);
        connection = -1;
        for (int i = 0; i < 200 && ProcessStat.read(child).state() != 'Z'; i++) {
          Thread.sleep(25);
        }
        assertEquals('Z', ProcessStat.read(child).state(), "the child is a zombie");
        assertTrue(pidfd.exited());
      } finally {
        UnixSockets.closeQuietly(connection);
      }
    } finally {
      parent.destroyForcibly();
    }
  }
}
