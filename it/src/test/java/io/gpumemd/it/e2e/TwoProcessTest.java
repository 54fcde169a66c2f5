package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.server.testing.DaemonProcess;
import io.gpumemd.server.testing.ResultProcess;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The daemon as its own process and client JVMs as theirs: a block written and released by one
 * process is the pool hit of the next, on the same segment, with the bytes intact, and the
 * counters read back through Admin.GetStats say exactly that.
 */
class TwoProcessTest {

  private static Map<String, String> run(String... args) throws Exception {
    return ResultProcess.run(PatternClientMain.class, args);
  }


  @Test
  void releasedBlock_isTheNextProcessesPoolHit_withTheBytesIntact() throws Exception {
    DaemonProcess daemon = DaemonProcess.start();
    try {
      long size = 1 << 20;
      Map<String, String> writer = run("write", daemon.unixTarget(), Long.toString(size), "171");
      Map<String, String> reader = run("read", daemon.tcpTarget(), Long.toString(size));
      assertEquals("false", writer.get("hit"));
      assertEquals("true", reader.get("hit"));
      assertEquals(writer.get("segment"), reader.get("segment"));
      assertEquals(writer.get("offset"), reader.get("offset"));
      assertEquals("171", reader.get("first"));
      assertEquals("true", reader.get("uniform"));

      try (Channels.Connection admin = Channels.open(daemon.tcpTarget())) {
        DeviceStats stats = AdminGrpc.newBlockingStub(admin.channel())
            .getStats(GetStatsRequest.newBuilder().setDevice(0).build()).getDevices(0);
        assertEquals(1, stats.getHits());
        assertEquals(1, stats.getMisses());
        assertEquals(2, stats.getReturns());
        assertEquals(0, stats.getLeasedBytes());
        assertEquals(0, stats.getActiveLeases());
        assertEquals(1, stats.getSegments());
        assertEquals(1, stats.getBackendAllocs());
      }
      assertEquals(0, daemon.terminate(20_000), daemon.output());
    } finally {
      daemon.close();
    }
  }

  @Test
  void bytesWrittenThroughALease_areReadByAnotherProcessGivenTheHandle() throws Exception {
    DaemonProcess daemon = DaemonProcess.start("--host-segments", "path"); // the other process maps the path
    try (io.gpumemd.client.GpuMemClient holder = io.gpumemd.client.GpuMemClient.connect(daemon.unixTarget())) {
      io.gpumemd.client.Lease lease = holder.lease(0, 64 * 1024);
      for (int i = 0; i < 64 * 1024; i++) {
        lease.buffer().put(i, (byte) 0x3c);
      }
      Map<String, String> seen = run("map", lease.hostShmPath(), Long.toString(lease.offset()), Integer.toString(64 * 1024));
      assertEquals(Integer.toString(0x3c), seen.get("first"));
      assertEquals("true", seen.get("uniform"));
      lease.close();
    } finally {
      daemon.close();
    }
  }
}
