package io.gpumemd.client;

import java.util.List;

/**
 * What {@link GpuMemClient#sleep} put to sleep. An immutable snapshot.
 *
 * @param leaseIds the leases that went to sleep with the call (with tags, also the untagged ones
 *     in the same segments, which a client maps whole)
 * @param segmentIds the segments they were in, whose address ranges this process keeps reserved
 * @param hostBytes bytes of contents the daemon keeps in its host memory for the session, every
 *     sleep together
 * @param freedBytes device bytes the call freed for other leases
 */
public record SleepResult(List<String> leaseIds, List<Long> segmentIds, long hostBytes, long freedBytes) {
  public SleepResult {
    leaseIds = List.copyOf(leaseIds);
    segmentIds = List.copyOf(segmentIds);
  }
}
