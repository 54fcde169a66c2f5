package io.gpumemd.server.sharing;

/** Where a page of {@link SharedObjects#shares} ends: the last token's sort key. Immutable. */
public record ShareCursor(String tenant, long createdNanos, String id) {
  /** True when {@code token} comes after this cursor in {@link SharedObjects#TOKEN_ORDER}. */
  boolean isBefore(ShareToken token) {
    int c = token.tenant.compareTo(tenant);
    if (c == 0) {
      c = Long.compare(token.createdNanos, createdNanos);
    }
    return c > 0 || (c == 0 && token.id.compareTo(id) > 0);
  }
}
