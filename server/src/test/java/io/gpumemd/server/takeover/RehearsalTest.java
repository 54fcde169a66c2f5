package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.books.Quota;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.PoolSettings;
import io.gpumemd.server.session.LiveSessions;
import io.gpumemd.server.session.SessionLimits;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSettings;
import io.gpumemd.server.sharing.SharingSettings;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** A successor's rehearsal of the state's way: scratch books to scratch books, over a real channel, leaving nothing. */
class RehearsalTest {
  @TempDir
  Path dir;
  private HostShmBackend backend;
  private final List<Rehearsal.Books> made = new ArrayList<>();

  private Rehearsal.Books books() {
    if (backend == null) {
      // Descriptor segments: the only host segments a take-over (and so a rehearsal) can carry.
      backend = new HostShmBackend(dir.resolve("shm"), 2, 64L << 20, null, dir.resolve("gpumemd.sock.fd").toString());
    }
    LiveSessions sessions = new LiveSessions();
    List<DevicePool> list = new ArrayList<>();
    for (var device : backend.devices()) {
      list.add(new DevicePool(device, backend, new PoolSettings(64L << 20, 64L << 20, 20L << 20), sessions,
          DevicePools.segmentIdBase(device.ordinal()), Ticker.system()));
    }
    DevicePools pools = new DevicePools(list);
    Rehearsal.Books books = new Rehearsal.Books(pools, new SessionRegistry(pools, backend, new SessionSettings(30,
        3600, 2000, 0, Quota.UNLIMITED, Map.of(), 0, Quota.UNLIMITED, false, SessionLimits.UNLIMITED,
        SharingSettings.DEFAULTS), Ticker.system(), sessions));
    made.add(books);
    return books;
  }

  @AfterEach
  void close() {
    if (backend != null) {
      backend.close();
    }
  }

  @Test
  void codec_restoresAScratchStateIntoOtherScratchBooks_andRemovesItsSocket() throws Exception {
    Path at = dir.resolve("gpumemd.sock.takeover.rehearsal-1");

    Rehearsal.codec(this::books, at);

    assertEquals(2, made.size(), "one set of books exported, another restored");
    assertFalse(Files.exists(at), "the channel's socket file is removed once connected");
    Rehearsal.Books restored = made.get(1);
    assertEquals(0, restored.registry().sessionCount());
    assertEquals(0, restored.registry().liveLeases());
    for (DevicePool pool : restored.pools().all()) {
      pool.verifyInvariants();
    }
  }
}
