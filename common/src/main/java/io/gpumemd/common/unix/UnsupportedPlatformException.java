package io.gpumemd.common.unix;

import java.io.IOException;

/** This package's calls need 64-bit Linux (the layouts in {@link Libc} are its LP64 ones). */
public final class UnsupportedPlatformException extends IOException {
  private static final long serialVersionUID = 1L;

  UnsupportedPlatformException() {
    super("Unix sockets that pass descriptors need 64-bit Linux; this is " + System.getProperty("os.name") + " "
        + System.getProperty("os.arch"));
  }
}
