package io.gpumemd.client;

import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A share token for one leased block, made by {@link Lease#share()}. Pass {@link #token()} to
 * another process of the same tenant (it is a credential: anyone of the tenant who has it can
 * attach), which calls {@link GpuMemClient#attach(String)}.
 *
 * <p>The token holds the block while it is valid (until it expires, is revoked, or has served
 * its attaches), even after the lease is closed or this process exits. {@link #close()} revokes
 * it: no further attach, and its own hold ends; holds already taken stay. A token that is
 * already gone (expired, used up, revoked elsewhere) makes close do nothing; {@link #revoke()}
 * says so with NOT_FOUND. Once the client is closed, close does nothing either: the token
 * outlives the client by design (close the share first to revoke it).
 *
 * <p>Thread-safe: close may race with itself; exactly one call revokes.
 */
public final class Share implements AutoCloseable {
  /** What a share asks of the client that made it. */
  interface Revoker {
    /** Revokes a token; true when its hold was the block's last. */
    boolean revoke(String token);

    /** Revokes a token, unless it or the client is gone already. */
    void revokeQuietly(String token);
  }

  private final Revoker revoker;
  private final String token;
  private final int expiresAfterSeconds;
  private final ShareOptions options;
  private final AtomicBoolean closed = new AtomicBoolean();

  Share(Revoker revoker, String token, int expiresAfterSeconds, ShareOptions options) {
    this.revoker = revoker;
    this.token = token;
    this.expiresAfterSeconds = expiresAfterSeconds;
    this.options = options;
  }

  /** The token: 32 lowercase hex characters (128 random bits). */
  public String token() {
    return token;
  }

  /** Seconds the token is valid from when it was made, as the daemon granted. */
  public int expiresAfterSeconds() {
    return expiresAfterSeconds;
  }

  /** Whether holds taken with the token are read-only. */
  public boolean readOnly() {
    return options.readOnly();
  }

  /** Attaches the token serves (0: any number until it expires). */
  public int maxAttaches() {
    return options.maxAttaches();
  }

  /**
   * Revokes the token now.
   *
   * @return true when the token's hold was the block's last and it went back to the pool
   * @throws GpuMemException NOT_FOUND when the token is already gone (expired, used up, revoked)
   */
  public boolean revoke() {
    closed.set(true);
    return revoker.revoke(token);
  }

  /** Revokes the token, unless it is gone already; later calls do nothing. */
  @Override
  public void close() {
    if (closed.compareAndSet(false, true)) {
      revoker.revokeQuietly(token);
    }
  }

  @Override
  public String toString() {
    return "Share[" + token.substring(0, 8) + "…, " + expiresAfterSeconds + " s"
        + (options.readOnly() ? ", read-only" : "")
        + (options.maxAttaches() == 0 ? "" : ", " + options.maxAttaches() + " attaches")
        + (closed.get() ? ", closed" : "") + "]";
  }
}
