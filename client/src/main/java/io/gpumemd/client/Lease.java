package io.gpumemd.client;

import io.gpumemd.proto.v1.LeaseResponse;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A block of device memory leased from gpumemd, mapped into this process. Close it (ideally
 * with try-with-resources) to give the block back; {@link #close()} is idempotent.
 *
 * <p>Host devices expose the memory as a {@link ByteBuffer} ({@link #buffer()}); CUDA devices
 * as a device pointer ({@link #devicePointer()}, or {@link CudaLeases#pointer} for JCuda). After
 * close, buffers and pointers obtained from the lease must not be used: the block may already
 * belong to another process.
 *
 * <p>A lease belongs to the session that granted it. When that session is lost (the daemon
 * restarted, or ended it), the lease is dead: {@link #buffer()} and {@link #devicePointer()}
 * throw {@link IllegalStateException} ("session lost"), {@link #close()} does nothing, and
 * buffers obtained earlier point at memory the daemon no longer owns.
 *
 * <p>Sharing: {@link #share()} makes a token another process of the same tenant passes to
 * {@link GpuMemClient#attach(String)}, and {@link GpuMemClient#publish} a name for
 * {@link GpuMemClient#lookup(String)}; both give that process a lease of its own on the same
 * block (a <em>hold</em>: {@link #attached()} is true). The block returns to the pool when its
 * last hold is gone. A lease that was shared or published, and every hold, is released to the
 * daemon on close, never kept in the client cache: others still use the block.
 *
 * <p>Sleep ({@link GpuMemClient#sleep}): a sleeping lease ({@link #isAsleep()}) keeps its id, tag
 * and address, but has no memory until {@link GpuMemClient#wake}: its buffer or pointer faults
 * when touched. A wake may put it in another segment ({@link #segmentId()}), at the same offset
 * and, in this process, at the same address.
 *
 * <p>A lease knows the session that granted it only through {@link Owner}: it never reaches into
 * the client.
 *
 * <p>Thread-safe: close may race with itself; exactly one call releases.
 */
public final class Lease implements AutoCloseable {
  /**
   * What a lease asks of the session that granted it (one object per session), as HikariCP's
   * pool and bag talk only through a narrow listener.
   */
  interface Owner {
    /** True once the session is lost (the daemon restarted or ended it): its leases are dead. */
    boolean isLost();

    /** The lease was closed: cache or release it. */
    void giveBack(Lease lease);

    /** The lease was closed, its last GPU use still queued: give it back once {@code done} completes. */
    void giveBackWhen(Lease lease, PendingReleases.Completion done);

    /** As {@link #giveBack}, without waiting for the daemon's answer. */
    CompletableFuture<Void> giveBackAsync(Lease lease);

    /** Lease#share: a token for the lease. */
    Share share(Lease lease, ShareOptions options);

    /** GpuMemClient#publish: the lease under a name. */
    Published publish(Lease lease, String name, boolean readOnly);
  }

  private final Owner owner;
  private final String id;
  private final int device;
  private final long sizeBytes;
  private final long blockBytes;
  private final boolean poolHit;
  /** The segment as granted; {@link #segment} says which it is now (a wake may have moved it). */
  private final long grantedSegmentId;
  private final long segmentBytes;
  private final long offset;
  private final String grantedHostShmPath;
  /** This process's mapping of the lease's segment; null for a test's lease. */
  private final MappedSegment segment;
  private final SegmentMapping mapping;
  private final boolean localHit;
  private final String tag;
  /** The daemon's tag of the lease: the first request's, also when served again from the client cache. */
  private final String recordTag;
  private final boolean attached;
  private final boolean readOnly;
  /** Set once the lease is shared or published (or is a hold): it never goes into the client cache. */
  private volatile boolean shared;
  private final AtomicBoolean closed = new AtomicBoolean();

  /** A lease, or with {@code attached} a hold on a shared block (Attach, Lookup), mapped nowhere (tests). */
  Lease(Owner owner, LeaseResponse response, SegmentMapping mapping, String tag, boolean attached, boolean readOnly) {
    this(owner, response, null, mapping, tag, attached, readOnly);
  }

  /** A lease, or with {@code attached} a hold on a shared block (Attach, Lookup), on {@code segment}. */
  Lease(Owner owner, LeaseResponse response, MappedSegment segment, SegmentMapping mapping, String tag,
      boolean attached, boolean readOnly) {
    this.owner = owner;
    this.id = response.getLeaseId();
    this.device = response.getDevice();
    this.sizeBytes = response.getSizeBytes();
    this.blockBytes = response.getBlockBytes();
    this.poolHit = response.getPoolHit();
    this.grantedSegmentId = response.getHandle().getSegmentId();
    this.segmentBytes = response.getHandle().getSegmentBytes();
    this.offset = response.getHandle().getOffset();
    this.grantedHostShmPath = response.getHandle().hasHostShmPath() ? response.getHandle().getHostShmPath() : null;
    this.segment = segment;
    this.mapping = mapping;
    this.localHit = false;
    this.tag = tag;
    this.recordTag = tag;
    this.attached = attached;
    this.readOnly = readOnly;
    this.shared = attached;
  }

  /** The same block, handed out again from the client's own cache for a new request. */
  Lease(Lease cached, long sizeBytes, String tag) {
    this.owner = cached.owner;
    this.id = cached.id;
    this.device = cached.device;
    this.sizeBytes = sizeBytes;
    this.blockBytes = cached.blockBytes;
    this.poolHit = true;
    this.grantedSegmentId = cached.grantedSegmentId;
    this.segmentBytes = cached.segmentBytes;
    this.offset = cached.offset;
    this.grantedHostShmPath = cached.grantedHostShmPath;
    this.segment = cached.segment;
    this.mapping = cached.mapping;
    this.localHit = true;
    this.tag = tag;
    this.recordTag = cached.recordTag;
    this.attached = false; // the cache holds neither holds nor shared leases
    this.readOnly = false;
  }

  /** The lease id (as shown by {@code Admin.ListLeases}). */
  public String id() {
    return id;
  }

  public int device() {
    return device;
  }

  /**
   * The caller's label for this use of the block. A lease served from the client's cache keeps
   * the daemon's record of the first tag (the daemon never saw this request).
   */
  public String tag() {
    return tag;
  }

  /** Bytes requested. */
  public long sizeBytes() {
    return sizeBytes;
  }

  /** Bytes reserved (the request rounded up to the pool's size classes); all usable. */
  public long blockBytes() {
    return blockBytes;
  }

  /** True when the lease was served from cached memory: the daemon's, or this client's own. */
  public boolean poolHit() {
    return poolHit;
  }

  /** True when this client served the lease from its own cache, without asking the daemon. */
  public boolean localHit() {
    return localHit;
  }

  /**
   * True for a hold on another lease's block, taken by {@link GpuMemClient#attach(String)} or
   * {@link GpuMemClient#lookup(String)}; false for a lease of this client's own.
   */
  public boolean attached() {
    return attached;
  }

  /**
   * True for a read-only hold. On host devices its {@link #buffer()} is read-only (writes throw
   * {@link java.nio.ReadOnlyBufferException}); on a CUDA device with VMM handles the segment is
   * mapped with read-only access (the driver faults a write through the pointer); with legacy
   * IPC handles, which cannot be opened read-only, the flag is advisory.
   */
  public boolean readOnly() {
    return readOnly;
  }

  /** True when this lease was shared or published, or is a hold: close releases it to the daemon. */
  boolean uncacheable() {
    return shared;
  }

  void markShared() {
    shared = true;
  }

  /**
   * Shares the block for 300 s (the daemon's default), writable, for any number of attaches.
   *
   * @see #share(ShareOptions)
   */
  public Share share() {
    return share(ShareOptions.DEFAULT);
  }

  /**
   * Shares the block.
   *
   * @param expiresAfter how long the token stays valid (whole seconds; zero for the daemon's
   *     default of 300 s; the daemon lowers it to its {@code --share-max-seconds})
   * @param readOnly holds taken with the token are read-only
   * @param maxAttaches attaches the token serves: 0 any number until it expires, 1 a one-shot
   *     hand-off
   */
  public Share share(Duration expiresAfter, boolean readOnly, int maxAttaches) {
    return share(new ShareOptions(expiresAfter, readOnly, maxAttaches));
  }

  /**
   * Makes a share token for this block: any session of the same tenant that has it may
   * {@link GpuMemClient#attach(String) attach} and gets a hold of its own. The token itself
   * holds the block while valid, so this process may close the lease, or exit, before the
   * other attaches. Closing the returned {@link Share} revokes the token.
   *
   * @throws IllegalStateException when the lease is closed or its session lost
   * @throws GpuMemException with the daemon's status (e.g. RESOURCE_EXHAUSTED at the tenant's
   *     bound on tokens and names)
   */
  public Share share(ShareOptions options) {
    checkOpen();
    return owner.share(this, options);
  }

  /** The segment the block is in (a wake may have moved it to another, at the same address here). */
  public long segmentId() {
    return segment != null ? segment.id() : grantedSegmentId;
  }

  public long segmentBytes() {
    return segmentBytes;
  }

  /** Offset of the block in its segment. */
  public long offset() {
    return offset;
  }

  /**
   * The shared-memory file holding the block's segment (host devices with {@code
   * --host-segments path}; null on CUDA, and for a segment passed as a file descriptor, which is
   * on no path). Another process of the same user (or the daemon's {@code --shm-group}) that
   * maps this file at {@link #offset()} sees the same bytes.
   */
  public String hostShmPath() {
    return segment != null ? segment.hostShmPath() : grantedHostShmPath;
  }

  SegmentMapping mapping() {
    checkSession();
    return mapping;
  }

  /** This process's mapping of the lease's segment; null for a test's lease. */
  MappedSegment segment() {
    return segment;
  }

  /** The daemon's tag of the lease (the first request's, for a lease served again from the client cache). */
  String recordTag() {
    return recordTag;
  }

  /**
   * True while the lease sleeps ({@link GpuMemClient#sleep}): the daemon keeps its contents in
   * host memory (level 1) or dropped them (level 2), and its buffer or pointer, which keeps its
   * address, must not be touched (it faults) until {@link GpuMemClient#wake}. Closing it still
   * releases it.
   */
  public boolean isAsleep() {
    return segment != null && segment.asleep();
  }

  /** The session that granted this lease, as the lease sees it. */
  Owner owner() {
    return owner;
  }

  /**
   * True when the session that granted this lease is lost (the daemon restarted, or ended the
   * session): the block is gone, and its memory must not be used. Closing it does nothing.
   */
  public boolean isLost() {
    return owner != null && owner.isLost(); // null: a test's lease without a client
  }

  /** True for a lease on a host (shared-memory) device. */
  public boolean isHost() {
    return mapping instanceof HostMapping;
  }

  /**
   * The leased memory as a buffer of {@link #sizeBytes()} bytes, shared with the daemon and
   * every other process that maps the same block (host devices only).
   */
  public ByteBuffer buffer() {
    checkOpen();
    if (!(mapping instanceof HostMapping host)) {
      throw new IllegalStateException("lease " + id + " is on a CUDA device: use devicePointer()");
    }
    return host.slice(offset, sizeBytes);
  }

  /** The whole block ({@link #blockBytes()}) as a buffer: what a local {@code zero} lease zeroes (host only). */
  ByteBuffer blockBuffer() {
    checkOpen();
    if (!(mapping instanceof HostMapping host)) {
      throw new IllegalStateException("lease " + id + " is on a CUDA device");
    }
    return host.slice(offset, blockBytes);
  }

  /** The block's CUDA device address in this process: segment base + offset (CUDA only). */
  public long devicePointer() {
    checkOpen();
    if (isHost()) {
      throw new IllegalStateException("lease " + id + " is on a host device: use buffer()");
    }
    return io.gpumemd.common.cuda.CudaHandles.address(CudaMappings.pointer(mapping, offset));
  }

  public boolean isClosed() {
    return closed.get();
  }

  private void checkOpen() {
    if (closed.get()) {
      throw new IllegalStateException("lease " + id + " is closed");
    }
    checkSession();
  }

  private void checkSession() {
    if (isLost()) {
      throw new IllegalStateException("lease " + id + ": session lost: the daemon restarted or ended the session; lease again");
    }
  }

  /**
   * Gives the lease back: into this client's cache (within its allowance), else to the daemon;
   * a hold, or a lease that was shared or published, always to the daemon.
   * On the session stream this never waits for the network; with unary calls it waits for the
   * daemon's answer. Later calls do nothing.
   */
  @Override
  public void close() {
    if (closed.compareAndSet(false, true)) {
      owner.giveBack(this);
    }
  }

  /** Gives the lease back without waiting for the daemon's answer. */
  public CompletableFuture<Void> closeAsync() {
    if (closed.compareAndSet(false, true)) {
      return owner.giveBackAsync(this);
    }
    return CompletableFuture.completedFuture(null);
  }

  /**
   * Closes the lease now and gives it back once {@code done} completes (see {@link
   * CudaLeases#closeAfter}); the caller does not wait.
   *
   * @return false when the lease was closed already: {@code done} is then the caller's to destroy
   */
  boolean closeWhen(PendingReleases.Completion done) {
    if (closed.compareAndSet(false, true)) {
      owner.giveBackWhen(this, done);
      return true;
    }
    return false;
  }

  @Override
  public String toString() {
    return "Lease[" + id + ", device " + device + ", " + sizeBytes + " bytes at segment " + segmentId()
        + "+" + offset + (attached ? ", attached" : localHit ? ", local hit" : poolHit ? ", hit" : ", miss")
        + (readOnly ? ", read-only" : "") + (closed.get() ? ", closed" : "")
        + (isAsleep() ? ", asleep" : "") + (isLost() ? ", session lost" : "") + "]";
  }
}
