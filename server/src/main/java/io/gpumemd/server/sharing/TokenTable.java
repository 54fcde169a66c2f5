package io.gpumemd.server.sharing;

import io.gpumemd.server.books.LeaseBook;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The live share tokens of {@link SharedObjects}, by token and by public id, with their
 * retirement (a dead token's hold dropped, once) and expiry scan.
 *
 * <p>Thread-safety: concurrent maps; a token is added to {@code byId} after {@code byToken} and
 * removed from both by {@link #retire}, which runs once per token (its caller won {@link
 * ShareToken#kill}). {@link #expire} runs on the housekeeping thread.
 */
final class TokenTable {
  private static final Logger log = LoggerFactory.getLogger(TokenTable.class);
  private static final long EXPIRY_SCAN_NANOS = TimeUnit.SECONDS.toNanos(1);

  private final HolderDirectory directory;
  private final LeaseBook book;
  private final ConcurrentHashMap<String, ShareToken> byToken = new ConcurrentHashMap<>();
  private final ConcurrentHashMap<String, ShareToken> byId = new ConcurrentHashMap<>();
  /** Written by the housekeeping thread only. */
  private long lastExpiryScanNanos = Long.MIN_VALUE / 2;

  TokenTable(HolderDirectory directory, LeaseBook book) {
    this.directory = directory;
    this.book = book;
  }

  void add(ShareToken token) {
    byToken.put(token.token, token);
    byId.put(token.id, token);
  }

  /** The token with this secret, or null. */
  ShareToken get(String token) {
    return byToken.get(token);
  }

  /** The token with this public id, or null. */
  ShareToken byId(String id) {
    return byId.get(id);
  }

  Collection<ShareToken> all() {
    return byToken.values();
  }

  int size() {
    return byToken.size();
  }

  /** Drops a dead token's hold (the caller killed it); true when that was the block's last hold. */
  boolean retire(ShareToken token) {
    byToken.remove(token.token, token);
    byId.remove(token.id, token);
    directory.tenant(token.tenant).removeShare();
    if (token.shared.dropToken()) {
      book.giveBack(token.shared);
      return true;
    }
    return false;
  }

  /** Enters restored tokens into the empty table; see {@link SharedObjects#restore}. */
  void restore(List<ShareToken> tokens) {
    for (ShareToken t : tokens) {
      if (byToken.putIfAbsent(t.token, t) != null || byId.putIfAbsent(t.id, t) != null) {
        throw new IllegalStateException("share token " + t.id + " twice in the take-over state");
      }
    }
  }

  /** Ends expired tokens' holds; at most once a second (a scan is O(tokens)). */
  void expire(long nowNanos) {
    if (nowNanos - lastExpiryScanNanos < EXPIRY_SCAN_NANOS) {
      return;
    }
    lastExpiryScanNanos = nowNanos;
    for (ShareToken token : byToken.values()) {
      if (token.expired(nowNanos) && token.kill()) {
        log.debug("Share token of tenant {} expired", token.tenant);
        retire(token);
      }
    }
  }

  /** Retires every token (shutdown). */
  void dropAll() {
    for (ShareToken token : byToken.values()) {
      if (token.kill()) {
        retire(token);
      }
    }
  }
}
