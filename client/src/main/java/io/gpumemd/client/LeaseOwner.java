package io.gpumemd.client;

import java.util.concurrent.CompletableFuture;

/**
 * The owner of one session's leases: what a {@link Lease} of that session asks (give me back,
 * share me, publish me) goes to the client's lease and sharing paths with the session attached.
 * One per session, made when the session opens. Thread-safe: it holds only final references.
 *
 * @param session the session whose leases these are
 * @param leases the client's lease paths (give back)
 * @param sharing the client's sharing paths (share, publish)
 */
record LeaseOwner(Session session, LeasePaths leases, SharingCalls sharing) implements Lease.Owner {
  @Override
  public boolean isLost() {
    return session.isLost();
  }

  @Override
  public void giveBack(Lease lease) {
    leases.giveBack(session, lease);
  }

  @Override
  public void giveBackWhen(Lease lease, PendingReleases.Completion done) {
    leases.giveBackWhen(session, lease, done);
  }

  @Override
  public CompletableFuture<Void> giveBackAsync(Lease lease) {
    return leases.giveBackAsync(session, lease);
  }

  @Override
  public Share share(Lease lease, ShareOptions options) {
    return sharing.share(session, lease, options);
  }

  @Override
  public Published publish(Lease lease, String name, boolean readOnly) {
    return sharing.publish(session, lease, name, readOnly);
  }
}
