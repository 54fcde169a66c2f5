package io.gpumemd.it.e2e;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.DeviceStats;

/** The books of a daemon in another process, as GetStats reports them. Stateless. */
public final class DeviceBooks {
  private DeviceBooks() {}

  /**
   * The pool's books as GetStats reports them: reserved bytes are exactly the leased,
   * client-cached, cached, remainder, awaiting-event and awaiting-unmap bytes, within the limit.
   * (The daemon reports the remainder as what is left of reserved after the others, so the sum
   * holds by construction; what this catches is a negative part, i.e. more bytes accounted for
   * than reserved, or reserved over the limit.)
   */
  public static void assertBalanced(DeviceStats d) {
    long parts = d.getLeasedBytes() + d.getClientCachedBytes() + d.getCachedBytes() + d.getRemainderBytes()
        + d.getAwaitingEventBytes() + d.getAwaitingUnmapBytes();
    assertEquals(d.getReservedBytes(), parts, "device " + d.getDevice() + ": reserved != its parts: " + d);
    assertTrue(d.getReservedBytes() <= d.getLimitBytes(), "device " + d.getDevice() + ": over its limit: " + d);
    assertTrue(d.getLeasedBytes() >= 0 && d.getClientCachedBytes() >= 0 && d.getCachedBytes() >= 0
        && d.getRemainderBytes() >= 0 && d.getAwaitingEventBytes() >= 0 && d.getAwaitingUnmapBytes() >= 0,
        "device " + d.getDevice() + ": a negative part: " + d);
  }
}
