package io.gpumemd.common.unix;

import static io.gpumemd.common.unix.ErrnoCalls.retryOnInterrupt;
import static io.gpumemd.common.unix.Libc.CMSG_HEADER;
import static io.gpumemd.common.unix.Libc.IOVEC;
import static io.gpumemd.common.unix.Libc.MSGHDR;
import static io.gpumemd.common.unix.Libc.MSG_CONTROL;
import static io.gpumemd.common.unix.Libc.MSG_CONTROLLEN;
import static io.gpumemd.common.unix.Libc.MSG_FLAGS;
import static io.gpumemd.common.unix.Libc.MSG_IOV;
import static io.gpumemd.common.unix.Libc.MSG_IOVLEN;
import static io.gpumemd.common.unix.Libc.SCM_RIGHTS;
import static io.gpumemd.common.unix.Libc.SOL_SOCKET;

import com.sun.jna.Memory;
import com.sun.jna.Pointer;
import java.io.IOException;
import java.util.List;
import java.util.function.IntConsumer;

/**
 * The native block of one {@code sendmsg} or {@code recvmsg} with {@code SCM_RIGHTS}: a {@code
 * msghdr}, its one {@code iovec}, room for the control message of up to {@code maxFds}
 * descriptors, and {@code capacity} bytes of data, in one allocation (a separate block that only
 * the native side still refers to could be freed by the GC during the call). Made once and used
 * for every message of a connection, so that a round trip allocates no native memory. {@link
 * #sendWithDescriptorAfter} (a frame, then a descriptor on a byte of its own, in one {@code
 * sendmmsg}) adds a second small block at its first use, freed with the first.
 *
 * <p>Where descriptors travel on a Unix stream socket: the kernel attaches them to the bytes of
 * the {@code sendmsg} that carried them and hands them over with the first {@code recvmsg} that
 * reads any of those bytes with room for them; a read without that room (a plain {@code read} or
 * {@code recv}) closes them. A receive here always offers the room, and never reads past the
 * bytes that came with descriptors (the kernel stops there).
 *
 * <p>Not thread-safe: one message at a time, by the connection's owner. {@link #close()} frees
 * the blocks; idempotent.
 */
public final class MessageBuffer implements AutoCloseable {
  private final int capacity;
  private final int maxFds;
  private final int controlBytes;
  private final Memory block;
  /** The block's address: the pointers inside it are written as numbers, with no Pointer per call. */
  private final long address;
  private final long control;
  private final long data;
  private boolean closed;
  /**
   * Two mmsghdrs, their iovecs, the second's control message (one descriptor) and its one byte
   * (0): the second block of {@link #sendWithDescriptorAfter}, whose first message's bytes are
   * in {@link #block}. Made at first use.
   */
  private Memory pair;
  private static final long PAIR_IOVECS = 2L * Libc.MMSGHDR;
  private static final long PAIR_CONTROL = PAIR_IOVECS + 2L * IOVEC;
  private static final long PAIR_BYTE = PAIR_CONTROL + ((CMSG_HEADER + 4 + 7) & ~7);
  private static final long PAIR_BYTES = PAIR_BYTE + 8;

  /**
   * @param capacity the most bytes one message sends or receives
   * @param maxFds the most descriptors one message carries (the kernel's SCM_MAX_FD is 253)
   */
  public MessageBuffer(int capacity, int maxFds) throws UnsupportedPlatformException {
    if (capacity < 1 || maxFds < 1 || maxFds > 253) {
      throw new IllegalArgumentException("message buffer: " + capacity + " bytes, " + maxFds
          + " descriptors (expected: >= 1, and 1 to 253)");
    }
    Libc.bind();
    this.capacity = capacity;
    this.maxFds = maxFds;
    this.controlBytes = (CMSG_HEADER + 4 * maxFds + 7) & ~7; // CMSG_SPACE(4 * maxFds)
    this.block = new Memory(MSGHDR + IOVEC + controlBytes + capacity);
    this.address = Pointer.nativeValue(block);
    this.control = MSGHDR + IOVEC;
    this.data = MSGHDR + IOVEC + controlBytes;
  }

  /** The most bytes one message sends or receives. */
  public int capacity() {
    return capacity;
  }

  private void header(long dataOffset, long length, int controlLength) {
    block.clear(MSGHDR + IOVEC + (controlLength > 0 ? controlBytes : 0));
    block.setLong(MSGHDR, address + data + dataOffset); // iov_base
    block.setLong(MSGHDR + 8, length); // iov_len
    block.setLong(MSG_IOV, address + MSGHDR);
    block.setLong(MSG_IOVLEN, 1);
    if (controlLength > 0) {
      block.setLong(MSG_CONTROL, address + control);
      block.setLong(MSG_CONTROLLEN, controlLength);
    }
  }

  /**
   * Sends all of {@code bytes[offset, offset + length)} (at most {@link #capacity()}), with
   * {@code fds} (at most {@code maxFds}, none when empty) attached to the first byte sent; no
   * bytes, nothing sent (descriptors travel only with a byte).
   *
   * @param beforeEach run before each {@code sendmsg} (a deadline's check), or null
   */
  public void sendAll(int fd, byte[] bytes, int offset, int length, List<Integer> fds, DeadlineCheck beforeEach)
      throws IOException {
    if (length > capacity || fds.size() > maxFds) {
      throw new IllegalArgumentException("message of " + length + " bytes, " + fds.size() + " descriptors (expected: "
          + "at most " + capacity + " and " + maxFds + ")");
    }
    block.write(data, bytes, offset, length);
    int sent = 0;
    boolean withFds = !fds.isEmpty();
    try {
      while (sent < length) {
        int controlLength = withFds ? CMSG_HEADER + 4 * fds.size() : 0;
        header(sent, length - sent, controlLength == 0 ? 0 : controlBytes);
        if (withFds) {
          block.setLong(control, controlLength); // cmsg_len
          block.setInt(control + 8, SOL_SOCKET);
          block.setInt(control + 12, SCM_RIGHTS);
          for (int i = 0; i < fds.size(); i++) {
            block.setInt(control + CMSG_HEADER + 4L * i, fds.get(i));
          }
          block.setLong(MSG_CONTROLLEN, (controlLength + 7) & ~7); // CMSG_SPACE
        }
        if (beforeEach != null) {
          beforeEach.check();
        }
        sent += (int) retryOnInterrupt(() -> Libc.sendmsg(fd, block, Libc.MSG_NOSIGNAL));
        withFds = false; // the descriptors went with the first byte sent
      }
    } finally {
      java.lang.ref.Reference.reachabilityFence(block);
    }
  }

  /**
   * Sends all of {@code bytes[offset, offset + length)} (at most {@link #capacity()}) as one
   * message, then one byte carrying {@code descriptor} as a second: on a stream socket the same
   * bytes, and the descriptor on the same byte, as two {@link #sendAll} calls, in one {@code
   * sendmmsg}. Meant for a socket with room for both (the kernel goes on to the second message
   * after a short first one).
   *
   * @throws IOException when the kernel did not take all of both messages: what it did take has
   *     left, so the caller closes the stream
   */
  public void sendWithDescriptorAfter(int fd, byte[] bytes, int offset, int length, int descriptor)
      throws IOException {
    if (length < 1 || length > capacity) {
      throw new IllegalArgumentException("message of " + length + " bytes (expected: 1 to " + capacity + ")");
    }
    Memory two = pair();
    long base = Pointer.nativeValue(two);
    block.write(data, bytes, offset, length);
    two.clear(PAIR_BYTES);
    message(two, 0, base + PAIR_IOVECS, address + data, length, 0, 0);
    int controlLength = CMSG_HEADER + 4;
    two.setLong(PAIR_CONTROL, controlLength); // cmsg_len
    two.setInt(PAIR_CONTROL + 8, SOL_SOCKET);
    two.setInt(PAIR_CONTROL + 12, SCM_RIGHTS);
    two.setInt(PAIR_CONTROL + CMSG_HEADER, descriptor);
    message(two, Libc.MMSGHDR, base + PAIR_IOVECS + IOVEC, base + PAIR_BYTE, 1, base + PAIR_CONTROL,
        (controlLength + 7) & ~7);
    long sent;
    try {
      sent = retryOnInterrupt(() -> Libc.sendmmsg(fd, two, 2, Libc.MSG_NOSIGNAL));
    } finally {
      java.lang.ref.Reference.reachabilityFence(two);
      java.lang.ref.Reference.reachabilityFence(block);
    }
    long first = two.getInt(MSGHDR) & 0xffffffffL;
    long second = two.getInt(Libc.MMSGHDR + MSGHDR) & 0xffffffffL;
    if (sent != 2 || first != length || second != 1) {
      throw new IOException("the socket took " + sent + " of 2 messages (" + first + " of " + length + " bytes, then "
          + second + " of 1)");
    }
  }

  /** Writes one mmsghdr at {@code at} of {@code two}: one iovec (written at {@code iovec}), an optional control. */
  private static void message(Memory two, long at, long iovec, long bytes, long length, long control, long controlLength) {
    long iovecOffset = iovec - Pointer.nativeValue(two);
    two.setLong(iovecOffset, bytes); // iov_base
    two.setLong(iovecOffset + 8, length); // iov_len
    two.setLong(at + MSG_IOV, iovec);
    two.setLong(at + MSG_IOVLEN, 1);
    if (control != 0) {
      two.setLong(at + MSG_CONTROL, control);
      two.setLong(at + MSG_CONTROLLEN, controlLength);
    }
  }

  /** The block of {@link #sendWithDescriptorAfter}, made at its first use. */
  private Memory pair() {
    if (pair == null) {
      pair = new Memory(PAIR_BYTES);
    }
    return pair;
  }

  /**
   * One {@code recvmsg} of at most {@code max} bytes (at most {@link #capacity()}) into {@code
   * out} from {@code offset}; descriptors that came with them go to {@code fds} (received
   * close-on-exec), in order.
   *
   * @return the bytes read; 0 when the peer closed the connection
   * @throws IOException also when descriptors were cut off ({@code MSG_CTRUNC}: more than
   *     {@code maxFds} came); those that did arrive went to {@code fds} first
   */
  public int receive(int fd, byte[] out, int offset, int max, IntConsumer fds) throws IOException {
    int length = Math.min(max, capacity);
    header(0, length, controlBytes);
    long got;
    try {
      got = retryOnInterrupt(() -> Libc.recvmsg(fd, block, Libc.MSG_CMSG_CLOEXEC));
    } finally {
      java.lang.ref.Reference.reachabilityFence(block);
    }
    // CMSG_FIRSTHDR/CMSG_NXTHDR: every SCM_RIGHTS message (Linux sends one per receive)
    long controlLength = block.getLong(MSG_CONTROLLEN);
    long at = 0;
    while (controlLength - at >= CMSG_HEADER) {
      long cmsgLength = block.getLong(control + at);
      if (cmsgLength < CMSG_HEADER || at + cmsgLength > controlLength) {
        break;
      }
      if (block.getInt(control + at + 8) == SOL_SOCKET && block.getInt(control + at + 12) == SCM_RIGHTS) {
        for (long i = 0; i < (cmsgLength - CMSG_HEADER) / 4; i++) {
          fds.accept(block.getInt(control + at + CMSG_HEADER + 4 * i));
        }
      }
      at += (cmsgLength + 7) & ~7;
    }
    if ((block.getInt(MSG_FLAGS) & Libc.MSG_CTRUNC) != 0) {
      throw new IOException("descriptors were cut off (more than " + maxFds + " in one message)");
    }
    if (got > 0) {
      block.read(data, out, offset, (int) got);
    }
    return (int) got;
  }

  /** Frees the native block. Idempotent; a closed buffer must not be used. */
  @Override
  public void close() {
    if (!closed) {
      closed = true;
      block.close();
      if (pair != null) {
        pair.close();
      }
    }
  }

  /** A check before each call of a send or receive: a deadline's, which throws once it passed. */
  @FunctionalInterface
  public interface DeadlineCheck {
    void check() throws IOException;
  }
}
