package io.gpumemd.client;

import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A block published under a name by {@link GpuMemClient#publish}. Any session of the same
 * tenant gets a hold on it with {@link GpuMemClient#lookup(String)}.
 *
 * <p>The name holds the block until it is unpublished, even after the lease is closed or this
 * process exits: {@link #close()} unpublishes it (as {@link GpuMemClient#unpublish(String)} or
 * {@code gpumemctl objects rm} do from anywhere of the tenant). Holds taken by lookup stay. A
 * name already unpublished elsewhere, or a closed client, makes close do nothing.
 *
 * <p>Thread-safe: close may race with itself; exactly one call unpublishes.
 */
public final class Published implements AutoCloseable {
  /** What a published name asks of the client that published it: its one call. */
  interface Unpublisher {
    /** Unpublishes a name, unless it or the client is gone already. */
    void unpublishQuietly(String name);
  }

  private final Unpublisher unpublisher;
  private final String name;
  private final boolean readOnly;
  private final AtomicBoolean closed = new AtomicBoolean();

  Published(Unpublisher unpublisher, String name, boolean readOnly) {
    this.unpublisher = unpublisher;
    this.name = name;
    this.readOnly = readOnly;
  }

  /** The published name. */
  public String name() {
    return name;
  }

  /** Whether lookups get read-only holds. */
  public boolean readOnly() {
    return readOnly;
  }

  /** Unpublishes the name, unless it is gone already; later calls do nothing. */
  @Override
  public void close() {
    if (closed.compareAndSet(false, true)) {
      unpublisher.unpublishQuietly(name);
    }
  }

  @Override
  public String toString() {
    return "Published['" + name + "'" + (readOnly ? ", read-only" : "") + (closed.get() ? ", closed" : "") + "]";
  }
}
