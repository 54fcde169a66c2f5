package io.gpumemd.common.unix;

import com.sun.jna.LastErrorException;
import com.sun.jna.Pointer;
import java.io.IOException;

/**
 * Runs libc calls bound through JNA direct mapping (declared {@code throws LastErrorException},
 * so that JNA reads {@code errno}) and turns a failure into an {@link ErrnoException}: what this
 * package's Unix sockets and descriptors and the host backend's memfd calls share. A call interrupted by a signal
 * ({@code EINTR}) is made again where that is safe ({@link #retryOnInterrupt}).
 *
 * <p>Stateless and thread-safe.
 */
public final class ErrnoCalls {
  public static final int EINTR = 4;
  public static final int EAGAIN = 11;
  public static final int ENFILE = 23;
  public static final int EMFILE = 24;

  private ErrnoCalls() {}

  /** A call returning an int (a descriptor, 0). */
  public interface IntCall {
    int run() throws LastErrorException;
  }

  /** A call returning a length. */
  public interface LongCall {
    long run() throws LastErrorException;
  }

  /** A call returning an address. */
  public interface PointerCall {
    Pointer run() throws LastErrorException;
  }

  public static int call(IntCall c) throws ErrnoException {
    try {
      return c.run();
    } catch (LastErrorException e) {
      throw new ErrnoException(e);
    }
  }

  public static Pointer call(PointerCall c) throws ErrnoException {
    try {
      return c.run();
    } catch (LastErrorException e) {
      throw new ErrnoException(e);
    }
  }

  /** Makes a send, receive or accept again while a signal interrupts it (100 times at most). */
  public static long retryOnInterrupt(LongCall c) throws ErrnoException {
    for (int attempt = 0; ; attempt++) {
      try {
        return c.run();
      } catch (LastErrorException e) {
        if (e.getErrorCode() != EINTR || attempt >= 100) {
          throw new ErrnoException(e);
        }
      }
    }
  }

  /** A libc call that failed, with its errno (ENOENT 2, EACCES 13, EAGAIN 11 for a timeout, ...). */
  public static final class ErrnoException extends IOException {
    private static final long serialVersionUID = 1L;
    private final int errno;

    ErrnoException(LastErrorException e) {
      super(e.getErrorCode() == EAGAIN ? "no answer within the socket's timeout" : e.getMessage());
      this.errno = e.getErrorCode();
    }

    public int errno() {
      return errno;
    }

    /** A send or receive that ran past the socket's timeout (SO_SNDTIMEO / SO_RCVTIMEO). */
    public boolean timedOut() {
      return errno == EAGAIN;
    }

    /** No descriptor could be made: the process's RLIMIT_NOFILE (EMFILE) or the system's (ENFILE). */
    public boolean outOfDescriptors() {
      return errno == EMFILE || errno == ENFILE;
    }
  }
}
