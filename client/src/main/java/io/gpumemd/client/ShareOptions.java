package io.gpumemd.client;

import java.time.Duration;
import java.util.Objects;

/**
 * How {@link Lease#share(ShareOptions)} shares a block. Immutable, so thread-safe.
 *
 * @param expiresAfter how long the token stays valid, in whole seconds (zero: the daemon's
 *     default, 300 s; the daemon lowers longer lives to its {@code --share-max-seconds})
 * @param readOnly holds taken with the token are read-only (mapped read-only on host devices;
 *     advisory on CUDA)
 * @param maxAttaches how many attaches the token serves: 0 any number until it expires, 1 a
 *     one-shot hand-off (the token's hold passes to the one consumer)
 */
public record ShareOptions(Duration expiresAfter, boolean readOnly, int maxAttaches) {
  /** The daemon's default life (300 s), writable, any number of attaches. */
  public static final ShareOptions DEFAULT = new ShareOptions(Duration.ZERO, false, 0);

  public ShareOptions {
    Objects.requireNonNull(expiresAfter, "expiresAfter");
    if (expiresAfter.isNegative() || expiresAfter.getSeconds() > 0xFFFF_FFFFL) {
      throw new IllegalArgumentException("expiresAfter: " + expiresAfter + " (expected: 0 to 2^32 - 1 seconds)");
    }
    if (maxAttaches < 0) {
      throw new IllegalArgumentException("maxAttaches: " + maxAttaches + " (expected: >= 0)");
    }
  }

  /** A one-shot hand-off: one attach, within the daemon's default life. */
  public static ShareOptions oneShot() {
    return new ShareOptions(Duration.ZERO, false, 1);
  }

  public ShareOptions withExpiresAfter(Duration expiresAfter) {
    return new ShareOptions(expiresAfter, readOnly, maxAttaches);
  }

  public ShareOptions withReadOnly(boolean readOnly) {
    return new ShareOptions(expiresAfter, readOnly, maxAttaches);
  }

  public ShareOptions withMaxAttaches(int maxAttaches) {
    return new ShareOptions(expiresAfter, readOnly, maxAttaches);
  }
}
