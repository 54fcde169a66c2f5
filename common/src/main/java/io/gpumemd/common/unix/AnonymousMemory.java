package io.gpumemd.common.unix;

import com.sun.jna.Pointer;
import java.io.IOException;

/**
 * Private anonymous memory of this process, mapped and unmapped with {@code mmap}/{@code munmap}
 * rather than allocated by the JVM: it is not bounded by {@code -Xmx} or {@code
 * -XX:MaxDirectMemorySize} (the daemon keeps gigabytes of parked contents in it, sized by its own
 * flag), it can be longer than 2 GiB, and it is returned to the kernel at once on {@link
 * #unmap}, not when a collector gets to it.
 *
 * <p>{@code MAP_NORESERVE}: pages are taken when first written, so a large buffer costs nothing
 * until it is filled. Stateless and thread-safe.
 */
public final class AnonymousMemory {
  private static final int MADV_POPULATE_WRITE = 23;

  private AnonymousMemory() {}

  /** {@code mmap(NULL, length, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE, -1, 0)}. */
  public static Pointer map(long length) throws IOException {
    if (length <= 0) {
      throw new IllegalArgumentException("length " + length);
    }
    Libc.bind();
    int flags = Libc.MAP_PRIVATE | Libc.MAP_ANONYMOUS | Libc.MAP_NORESERVE;
    Pointer address = ErrnoCalls.call(
        () -> Libc.mmap(null, length, Libc.PROT_READ | Libc.PROT_WRITE, flags, -1, 0));
    if (Pointer.nativeValue(address) == -1L) { // MAP_FAILED, should LastErrorException not fire
      throw new IOException("mmap of " + length + " anonymous bytes failed");
    }
    advise(address, length, MADV_POPULATE_WRITE);
    return address;
  }

  /**
   * The pages made at once ({@code MADV_POPULATE_WRITE}, Linux 5.14): a buffer is filled whole
   * right after it is made, and one call that faults every page in the kernel spares a page
   * fault per 4 KiB (a 1 GiB park took 1.1 s with the pages faulted one by one). No huge pages:
   * with transparent huge pages on {@code madvise} and their defrag on {@code madvise} (the
   * common defaults), a {@code MADV_HUGEPAGE} region compacts memory synchronously on its first
   * touch, and on a busy host whose memory is fragmented that made the same park take 10 s
   * ({@code HostStoreCostMain}, load 16: 10-12 s with the advice, 0.9-2 s without). A kernel
   * without the advice just faults pages in as they are written.
   */
  private static void advise(Pointer address, long length, int advice) {
    try {
      Libc.madvise(address, length, advice);
    } catch (com.sun.jna.LastErrorException e) {
      // EINVAL: this kernel does not know the advice; the memory works the same without it
    }
  }

  /** Gives the memory back to the kernel; the address must not be used afterwards. */
  public static void unmap(Pointer address, long length) {
    Descriptors.unmap(address, length);
  }
}
