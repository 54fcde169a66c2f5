package io.gpumemd.server.backend;

import java.util.concurrent.atomic.AtomicBoolean;

/**
 * What every backend's {@link HostBuffer} checks the same way: that a copy stays inside it, that
 * it comes from the backend asked to copy, and that it was not freed; and that it is freed once.
 * A backend's buffer adds its memory and how to give it back ({@link #release()}).
 *
 * <p>Thread-safe: {@link #free()} releases exactly once whichever threads call it.
 */
public abstract class RangeCheckedHostBuffer implements HostBuffer {
  private final long bytes;
  private final AtomicBoolean freed = new AtomicBoolean();

  protected RangeCheckedHostBuffer(long bytes) {
    this.bytes = bytes;
  }

  /**
   * {@code host} as a buffer of {@code type}, checked for a copy of {@code [offset, offset +
   * length)}.
   *
   * @throws BackendException for another backend's buffer, a range outside it, or a freed one
   */
  public static <T extends RangeCheckedHostBuffer> T checked(HostBuffer host, Class<T> type, long offset, long length) {
    if (!type.isInstance(host)) {
      throw new BackendException("a host buffer of another backend: " + host);
    }
    T buffer = type.cast(host);
    if (offset < 0 || length < 0 || offset + length > buffer.bytes()) {
      throw new BackendException("[" + offset + ", +" + length + ") is outside a host buffer of " + buffer.bytes() + " bytes");
    }
    if (((RangeCheckedHostBuffer) buffer).freed.get()) {
      throw new BackendException("a host buffer used after it was freed");
    }
    return buffer;
  }

  @Override
  public final long bytes() {
    return bytes;
  }

  @Override
  public final void free() {
    if (freed.compareAndSet(false, true)) {
      release();
    }
  }

  /** Gives the memory back; called once. */
  protected abstract void release();

  @Override
  public String toString() {
    return getClass().getSimpleName() + " of " + bytes + " bytes";
  }
}
