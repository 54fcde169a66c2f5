package io.gpumemd.server.session;

import java.util.concurrent.atomic.AtomicLong;

/**
 * A shared block published under a name of its tenant. The name is a hold on the block until
 * it is unpublished. Immutable but for the lookup counter.
 *
 * @param publishedBy the publishing session, as listings show it
 */
public record PublishedObject(String tenant, String name, SharedBlock shared, boolean readOnly, long publishedNanos,
    String publishedBy, AtomicLong lookups) {

  /** The key of the name table: names are unique per tenant (and never hold a line feed). */
  static String key(String tenant, String name) {
    return tenant + "\n" + name;
  }
}
