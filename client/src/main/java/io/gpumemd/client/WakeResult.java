package io.gpumemd.client;

import java.util.List;

/**
 * What {@link GpuMemClient#wake} brought back. An immutable snapshot.
 *
 * @param leaseIds the leases mapped again, each at its old address (leases closed while asleep
 *     are not among them)
 * @param segments the segments the daemon woke
 */
public record WakeResult(List<String> leaseIds, int segments) {
  public WakeResult {
    leaseIds = List.copyOf(leaseIds);
  }
}
