package io.gpumemd.server.pool;

import java.util.Locale;

/**
 * Every figure a pool reports, once: its kind and what it means. {@link PoolStats} holds one
 * value per constant; the gRPC layer maps each to the {@code DeviceStats} field of the same
 * name ({@link #protoField()}) and the metrics layer to a meter, so adding a figure here is
 * adding it everywhere. Each constant's description is its definition; /metrics shows it as
 * the meter's HELP line.
 */
public enum PoolMetric {
  HITS(Kind.COUNTER, "leases served from cached memory"),
  MISSES(Kind.COUNTER, "leases that needed a new backend allocation"),
  RETURNS(Kind.COUNTER, "released blocks that went back into the cache"),
  EVICTIONS(Kind.COUNTER, "cached segments given back to the backend"),
  ALLOC_RETRIES(Kind.COUNTER, "misses that evicted cached memory and retried"),
  OOMS(Kind.COUNTER, "leases refused for lack of memory or budget"),
  BACKEND_ALLOCS(Kind.COUNTER, "backend segment allocations"),
  BACKEND_FREES(Kind.COUNTER, "backend segment frees"),
  SCRUBBED_BYTES(Kind.COUNTER, "bytes of new segments zeroed because they may hold another owner's data "
      + "(stays 0 on backends whose fresh memory reads as zeros, such as host)"),
  CLIENT_CACHE_HITS(Kind.COUNTER, "leases clients served from their own cache, as they reported"),
  CLIENT_CACHE_RETURNS(Kind.COUNTER, "closed leases clients kept in their own cache, as they reported"),
  SHARES(Kind.COUNTER, "share tokens made"),
  ATTACHES(Kind.COUNTER, "holds taken on shared blocks by Attach or Lookup (one undone at once by a race, "
      + "its token used up or its session ended meanwhile, counts too)"),
  LEASED_BYTES(Kind.GAUGE, "bytes in leased blocks"),
  CLIENT_CACHED_BYTES(Kind.GAUGE, "bytes of leased blocks their clients keep closed in their cache tier"),
  CACHED_BYTES(Kind.GAUGE, "bytes in wholly free cached segments"),
  REMAINDER_BYTES(Kind.GAUGE, "free bytes in segments that also hold leases"),
  AWAITING_EVENT_BYTES(Kind.GAUGE, "bytes of released blocks waiting for their CUDA event"),
  AWAITING_UNMAP_BYTES(Kind.GAUGE, "bytes of evicted segments waiting for clients to unmap them"),
  RESERVED_BYTES(Kind.GAUGE, "bytes the backend holds for the pool"),
  PEAK_LEASED_BYTES(Kind.GAUGE, "highest leased bytes since start"),
  ACTIVE_LEASES(Kind.GAUGE, "live leases"),
  CACHED_BLOCKS(Kind.GAUGE, "free blocks in the cache"),
  SEGMENTS(Kind.GAUGE, "live backend segments"),
  SEGMENTS_AWAITING_UNMAP(Kind.GAUGE, "evicted segments waiting for clients to unmap"),
  BLOCKS_AWAITING_EVENT(Kind.GAUGE, "released blocks waiting for their CUDA event"),
  RETENTION_CAP_BYTES(Kind.GAUGE, "cap on cached bytes"),
  CAPACITY_BYTES(Kind.GAUGE, "total memory of the device"),
  LIMIT_BYTES(Kind.GAUGE, "the pool budget"),
  LIVE_HOLDS(Kind.GAUGE, "live holds taken on shared blocks by Attach or Lookup"),
  SHARED_BLOCKS(Kind.GAUGE, "leased blocks held by more than their lease (tokens, names, attaches)"),
  PUBLISHED_OBJECTS(Kind.GAUGE, "published objects"),
  PUBLISHED_BYTES(Kind.GAUGE, "bytes of published blocks, each counted once"),
  PUBLISHED_LIMIT_BYTES(Kind.GAUGE, "the most published bytes allowed");

  /** A counter only grows; a gauge is a level. */
  public enum Kind { COUNTER, GAUGE }

  private final Kind kind;
  private final String description;

  PoolMetric(Kind kind, String description) {
    this.kind = kind;
    this.description = description;
  }

  public Kind kind() {
    return kind;
  }

  public String description() {
    return description;
  }

  /** True for figures in bytes. */
  public boolean isBytes() {
    return name().endsWith("_BYTES");
  }

  /** The {@code DeviceStats} field carrying this figure: {@code alloc_retries}. */
  public String protoField() {
    return name().toLowerCase(Locale.ROOT);
  }
}
