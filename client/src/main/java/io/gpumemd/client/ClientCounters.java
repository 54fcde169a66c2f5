package io.gpumemd.client;

import java.util.concurrent.atomic.AtomicLong;

/**
 * What the lease path did since the client connected, across its sessions ({@link ClientStats}
 * is the snapshot callers see). Thread-safe: the counters need no lock.
 */
final class ClientCounters {
  /** Leases the daemon served (one round trip each). */
  final AtomicLong daemonLeases = new AtomicLong();
  /** Leases released to the daemon. */
  final AtomicLong releases = new AtomicLong();
  /** Mappings opened by sessions before the current one. */
  final AtomicLong earlierMapsOpened = new AtomicLong();
}
