package io.gpumemd.common.unix;

import com.sun.jna.LastErrorException;
import com.sun.jna.Pointer;
import java.io.IOException;

/**
 * A range of this process's address space held for a shared-memory segment, so that the memory
 * under it can go and come back at the same address: every pointer and buffer made from the
 * range stays valid through it (what sleep and wake need). The range is first reserved as an
 * inaccessible anonymous mapping ({@code PROT_NONE}, {@code MAP_NORESERVE}: no memory, no
 * commit charge), then a segment is mapped over it ({@code MAP_FIXED|MAP_SHARED}); {@link
 * #vacate} puts the inaccessible mapping back over the segment, and {@link #fill} maps a
 * segment again.
 *
 * <p>The range is never left unmapped until {@link #release}: a {@code munmap} of it would open a
 * hole that another thread's {@code mmap} (the JVM's, a library's) could take, and a later {@code
 * MAP_FIXED} would then silently replace that thread's memory. {@code MAP_FIXED} over a range this
 * object holds replaces it in one step, so the range is always ours.
 *
 * <p>Linux on a 64-bit architecture only. Not thread-safe: its owner serializes the calls (and
 * makes sure nothing touches the range while it is vacated: that faults, SIGSEGV).
 */
public final class ReservedRange {
  private static final int INACCESSIBLE = Libc.MAP_PRIVATE | Libc.MAP_ANONYMOUS | Libc.MAP_NORESERVE;

  private final Pointer address;
  private final long length;

  private ReservedRange(Pointer address, long length) {
    this.address = address;
    this.length = length;
  }

  /** Reserves {@code length} bytes of address space, inaccessible, anywhere. */
  public static ReservedRange reserve(long length) throws IOException {
    if (length <= 0) {
      throw new IllegalArgumentException("length " + length);
    }
    Libc.bind();
    Pointer address = ErrnoCalls.call(() -> Libc.mmap(null, length, Libc.PROT_NONE, INACCESSIBLE, -1, 0));
    if (Pointer.nativeValue(address) == -1L) { // MAP_FAILED, should LastErrorException not fire
      throw new IOException("mmap of a " + length + "-byte reservation failed");
    }
    return new ReservedRange(address, length);
  }

  /** The first byte of the range; the same from {@link #reserve} to {@link #release}. */
  public Pointer address() {
    return address;
  }

  /** The range's length in bytes. */
  public long length() {
    return length;
  }

  /**
   * Maps the first {@link #length} bytes of the file behind {@code fd} over the whole range,
   * {@code MAP_SHARED}, read-only or read-write; whatever was there (the reservation, or an
   * earlier segment) is replaced in the same step. The caller checks the file's size first
   * (touching a mapping past its file's end is SIGBUS) and keeps {@code fd} its own (the mapping
   * does not need it). On a failure the range is as it was.
   */
  public void fill(int fd, boolean readOnly) throws IOException {
    int protection = readOnly ? Libc.PROT_READ : Libc.PROT_READ | Libc.PROT_WRITE;
    Pointer at = ErrnoCalls.call(() -> Libc.mmap(address, length, protection, Libc.MAP_SHARED | Libc.MAP_FIXED, fd, 0));
    if (Pointer.nativeValue(at) != Pointer.nativeValue(address)) { // MAP_FIXED maps there or fails
      throw new IOException("mmap MAP_FIXED returned 0x" + Long.toHexString(Pointer.nativeValue(at)));
    }
  }

  /**
   * Replaces whatever is mapped over the range with the inaccessible reservation: the segment is
   * unmapped (this process no longer holds its pages) and touching the range faults, while the
   * address stays this range's.
   */
  public void vacate() throws IOException {
    Pointer at = ErrnoCalls.call(() -> Libc.mmap(address, length, Libc.PROT_NONE, INACCESSIBLE | Libc.MAP_FIXED, -1, 0));
    if (Pointer.nativeValue(at) != Pointer.nativeValue(address)) {
      throw new IOException("mmap MAP_FIXED returned 0x" + Long.toHexString(Pointer.nativeValue(at)));
    }
  }

  /**
   * Unmaps the whole range, segment or reservation: the address is no longer this process's to
   * use. Static and keyed by address so that a {@link java.lang.ref.Cleaner} action can call it
   * without holding the object it cleans up after.
   */
  public static void release(Pointer address, long length) {
    try {
      Libc.munmap(address, length);
    } catch (LastErrorException e) {
      // EINVAL only, for an address that is not a mapping: nothing is mapped there
    }
  }
}
