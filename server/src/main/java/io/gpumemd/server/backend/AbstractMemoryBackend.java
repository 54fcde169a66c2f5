package io.gpumemd.server.backend;

import java.util.List;

/**
 * What the daemon's backends share about their life: a name and devices fixed at start, and a
 * close that runs once, after which the backend refuses new segments ({@link #checkOpen}:
 * "&lt;name&gt; backend is closed") and frees what it still holds ({@link #release}). Each backend
 * keeps its own segments.
 *
 * <p>Thread-safety: {@link #close} is synchronized and runs {@link #release} once; the closed
 * flag is volatile, so a call on any thread sees a close that has begun. The rest is immutable.
 */
public abstract class AbstractMemoryBackend implements MemoryBackend {
  private final String name;
  private final List<DeviceInfo> devices;
  private volatile boolean closed;

  /** @param devices ordinals 0..n-1 (copied) */
  protected AbstractMemoryBackend(String name, List<DeviceInfo> devices) {
    this.name = name;
    this.devices = List.copyOf(devices);
  }

  @Override
  public final String name() {
    return name;
  }

  @Override
  public final List<DeviceInfo> devices() {
    return devices;
  }

  /** Whether {@link #close} has begun. */
  protected final boolean isClosed() {
    return closed;
  }

  /**
   * For the calls that make or take in segments.
   *
   * @throws BackendException once {@link #close} has begun
   */
  protected final void checkOpen() {
    if (closed) {
      throw new BackendException(name + " backend is closed");
    }
  }

  /** Closes the backend once; later calls do nothing. */
  @Override
  public final synchronized void close() {
    if (closed) {
      return;
    }
    closed = true;
    release();
  }

  /** Frees what the backend still holds at its close (segments, contexts, files); called once. */
  protected abstract void release();
}
