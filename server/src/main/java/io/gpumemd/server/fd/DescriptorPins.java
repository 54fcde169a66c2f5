package io.gpumemd.server.fd;

import io.gpumemd.common.Ticker;
import io.gpumemd.common.unix.Pidfd;
import io.gpumemd.common.unix.ProcessStat;
import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.pool.DescriptorHolder;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.IdentityHashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Keeps every byte a process was sent by descriptor on the books until that process can no
 * longer reach it. A mapping cannot be revoked, and a session's end says nothing about its
 * process: a client that ends its session (or lets it expire) while it keeps a segment mapped
 * would otherwise let the daemon count the segment free, reuse its budget, and pin memory
 * outside every quota.
 *
 * <p>So each descriptor the fd channel sends makes the receiving process a holder of the segment
 * ({@link DescriptorHolder}, in the pool's books beside the sessions). Such a holder ends:
 *
 * <ul>
 *   <li>when the session it fetched for confirms an unmap of the segment (the pool's unmap
 *       handshake: the client library unmaps and closes the descriptor before it confirms);
 *   <li>when the process has exited (its pid gone, a zombie, or a pid reused by a process that
 *       started later);
 *   <li>for a host segment, when the process has no connection to the fd channel open, every
 *       connection it had ended with nothing unread ({@link ConnectionEnd}), and the kernel shows
 *       it neither maps the segment ({@code /proc/PID/maps}) nor holds a descriptor of it
 *       ({@code /proc/PID/fd}). While a connection is open a descriptor may still wait unread
 *       in its socket, so the process is counted as reaching everything it was sent. A process
 *       whose {@code /proc} entries the daemon may not read (another uid, and the daemon not
 *       root), one that left a descriptor unread, and a CUDA VMM segment (whose mappings {@code
 *       /proc} does not show) keep the segment until the process exits.
 * </ul>
 *
 * <p>While such a holder lives, an evicted segment is not freed: it keeps its place in the
 * device's budget, and its bytes count against the process's tenant's quota ({@code
 * --tenant-max-leased-bytes}, see {@link DevicePools#pinnedBytes}). A client in the daemon's own
 * process (tests, embedded use) is not tracked: it cannot keep memory from the daemon.
 *
 * <p>A process in a PID namespace this daemon cannot see (a pod without {@code hostPID}: the
 * kernel gives its pid as 0) is followed by its pidfd instead ({@code SO_PEERPIDFD}; one per
 * process, known by its pidfs inode, Linux 6.9): it keeps what it was sent until it exits, as
 * its {@code /proc} is out of sight, and at most {@link #MAX_HIDDEN_PROCESSES_PER_TENANT} such
 * processes of a tenant are followed at once (a further one's connection is refused). Its
 * pidfd is closed once it has exited, or has no connection and keeps nothing. On an older
 * kernel such a process is not tracked, and {@link #connected} says so at WARN once
 * (SECURITY.md, "Across PID namespaces").
 *
 * <p>{@link #sweep} runs on the housekeeping thread: at once after a process's last connection
 * closed, else once a second for processes that may have exited.
 *
 * <p>Thread-safety: the open connections are guarded by this object's monitor; {@code /proc} is
 * read and the pools are called outside it. A holder is dropped only if its process opened no
 * connection since its check began (a grant always comes through a connection), so a
 * descriptor sent during a check keeps its holder; a process is forgotten only with no grant on
 * its way into the books. The processes it knows are bounded by the live processes that
 * connected: one that exited is forgotten at the next sweep.
 */
public final class DescriptorPins {
  private static final Logger log = LoggerFactory.getLogger(DescriptorPins.class);
  private static final long FULL_SWEEP_NANOS = TimeUnit.SECONDS.toNanos(1);
  private static final int SELF = (int) ProcessHandle.current().pid();
  /**
   * Processes of one tenant in PID namespaces this daemon cannot see that it follows by pidfd at
   * once (each costs the daemon a descriptor while it connects or keeps what it was sent); a
   * connection of a further one is closed as it is accepted.
   */
  static final int MAX_HIDDEN_PROCESSES_PER_TENANT = 1000;

  private final DevicePools pools;
  private final Ticker ticker;
  private final int hiddenPerTenant;
  private final Map<FdPeer.Key, FdPeer> peers = new HashMap<>(); // guarded by this
  /**
   * The process of each open connection, by the {@link Caller} instance {@link FdChannel} made
   * for that connection alone: a connection's grants and end find its own process, whatever pid
   * reuse or namespaces did since.
   */
  private final Map<Caller, FdPeer> connections = new IdentityHashMap<>(); // guarded by this
  private final Map<String, Integer> hiddenByTenant = new HashMap<>(); // guarded by this
  private long connects; // guarded by this
  private boolean dirty; // guarded by this: a process closed its last connection
  private long lastSweepNanos; // housekeeping thread only
  /** Whether an untracked peer (a kernel without pidfs) was logged at WARN (once a daemon). */
  private final AtomicBoolean untrackedWarned = new AtomicBoolean();

  public DescriptorPins(DevicePools pools, Ticker ticker) {
    this(pools, ticker, MAX_HIDDEN_PROCESSES_PER_TENANT);
  }

  /** @param hiddenPerTenant processes of one tenant followed by pidfd at once (tests set a small bound) */
  DescriptorPins(DevicePools pools, Ticker ticker, int hiddenPerTenant) {
    this.pools = pools;
    this.ticker = ticker;
    this.hiddenPerTenant = hiddenPerTenant;
    this.lastSweepNanos = ticker.nanos();
  }

  /**
   * A process connected to the fd channel: {@code peer} is the connection's own {@link Caller}
   * (the kernel's pid, {@code SO_PEERCRED}), {@code socket} its descriptor, where the kernel
   * names a process this daemon cannot see by pid ({@code SO_PEERPIDFD}).
   *
   * @return null, or why the connection must be closed: a process its tenant could not be
   *     charged for, as more than {@link #MAX_HIDDEN_PROCESSES_PER_TENANT} of its processes this
   *     daemon cannot see are followed, or the kernel would not name it
   */
  String connected(Caller peer, int socket) {
    int pid = peer.pid();
    if (pid == 0) {
      return connectedHidden(peer, socket);
    }
    if (pid < 0 || pid == SELF) {
      return null;
    }
    long start = ProcessStat.read(pid).startTicks();
    if (start < 0) {
      return null; // gone already: its connection ends at once, and it was sent nothing
    }
    synchronized (this) {
      FdPeer p = peers.computeIfAbsent(new FdPeer.Key(pid, start), key -> new FdPeer(key, null, peer.tenant()));
      connect(peer, p);
    }
    return null;
  }

  /**
   * A process in a PID namespace this daemon cannot see (pid 0): followed by its pidfd, one per
   * process (its pidfs inode), or, on a kernel that cannot name it so, not at all (WARN once).
   */
  private String connectedHidden(Caller peer, int socket) {
    Pidfd pidfd;
    try {
      pidfd = Pidfd.ofPeer(socket);
    } catch (IOException | LinkageError | RuntimeException e) {
      return "its process, in a PID namespace this daemon cannot see, could not be named by pidfd (" + e.getMessage()
          + "), so it could not be charged for what it is sent";
    }
    if (pidfd == null) {
      if (untrackedWarned.compareAndSet(false, true)) {
        log.atWarn().addKeyValue("uid", peer.uid()).log("fd channel: {} connected from a PID namespace this daemon "
            + "cannot see (the kernel gives its pid as 0), and this kernel cannot name it by pidfd (Linux 6.9 and "
            + "later can): descriptors sent to such processes are not tracked, so one that ends its session while "
            + "it keeps a segment mapped is not charged for it (SECURITY.md, 'Across PID namespaces'); logged once",
            peer);
      }
      return null;
    }
    String tenant = peer.tenant();
    synchronized (this) {
      FdPeer.Key key = new FdPeer.Key(0, pidfd.inode());
      FdPeer p = peers.get(key);
      if (p != null) {
        pidfd.close(); // a process already followed: its first pidfd serves
      } else if (hiddenByTenant.getOrDefault(tenant, 0) >= hiddenPerTenant) {
        pidfd.close();
        return "tenant " + tenant + " has " + hiddenPerTenant + " processes in PID namespaces this daemon cannot see "
            + "connected or keeping descriptors, its limit";
      } else {
        p = new FdPeer(key, pidfd, tenant);
        peers.put(key, p);
        hiddenByTenant.merge(tenant, 1, Integer::sum);
        log.debug("fd channel: following {} by {}", peer, pidfd);
      }
      connect(peer, p);
    }
    return null;
  }

  private void connect(Caller connection, FdPeer p) { // guarded by this
    p.connections++;
    p.lastConnect = ++connects;
    connections.put(connection, p);
  }

  /**
   * A connection closed.
   *
   * @param peer the connection's own {@link Caller}, as given to {@link #connected}
   * @param nothingUnread true when the kernel said the peer had read everything sent to it
   */
  synchronized void disconnected(Caller peer, boolean nothingUnread) {
    FdPeer p = connections.remove(peer);
    if (p == null) {
      return;
    }
    p.leftUnread |= !nothingUnread;
    if (--p.connections == 0) {
      dirty = true;
    }
  }

  /**
   * The fd channel is about to send the process of connection {@code peer} a descriptor of a
   * segment it holds for {@code session}: from now on the process may map it, whatever becomes
   * of the session.
   */
  void granted(Caller peer, String session, long segmentId) {
    FdPeer p;
    synchronized (this) {
      p = connections.get(peer);
      if (p == null) {
        return; // the daemon's own process, an untracked one, or a connection that ended
      }
      p.granting++;
    }
    try {
      DevicePool pool = pools.ofSegment(segmentId);
      if (pool != null) {
        pool.descriptorSent(segmentId, new DescriptorHolder(p.key.pid(), p.key.start(), session, peer.tenant()));
      }
    } finally {
      synchronized (this) {
        p.granting--;
      }
    }
  }

  /**
   * Ends the holders of processes that exited, and of host segments that processes without a
   * connection no longer reach. Cheap when there is nothing to do; called every 100 ms.
   */
  public void sweep() {
    long now = ticker.nanos();
    synchronized (this) {
      if (!dirty && now - lastSweepNanos < FULL_SWEEP_NANOS) {
        return;
      }
      dirty = false;
    }
    lastSweepNanos = now;
    forgetExited();
    Map<Integer, ProcessReach> reaches = new HashMap<>();
    Set<FdPeer.Key> holding = new HashSet<>();
    for (String key : pools.descriptorHolders()) {
      DescriptorHolder holder = DescriptorHolder.parse(key);
      FdPeer.Key process = new FdPeer.Key(holder.pid(), holder.startTicks());
      holding.add(process);
      long checkedAt;
      FdPeer p;
      synchronized (this) {
        p = peers.get(process);
        if (p != null && (p.connections > 0 || p.leftUnread)) {
          continue; // a descriptor may wait unread in its socket: it keeps the segment
        }
        checkedAt = connects;
      }
      if (p == null ? holder.pid() == 0 || FdPeer.gone(process) : p.exited()) {
        log.debug("Process {} of {} exited: it maps nothing it was sent for session {}",
            holder.pid() == 0 ? "(pidfd inode " + holder.startTicks() + ")" : holder.pid(), holder.tenant(),
            holder.session());
        pools.holderEnded(key);
        continue;
      }
      if (p != null && p.pidfd != null) {
        continue; // its /proc is not in this daemon's sight: it keeps what it was sent until it exits
      }
      ProcessReach reach = reaches.computeIfAbsent(holder.pid(), ProcessReach::read);
      if (reach == null) {
        continue; // its /proc entries are not ours to read: it keeps what it was sent until it exits
      }
      for (DevicePool pool : pools.all()) {
        for (Map.Entry<Long, SegmentMemory> segment : pool.segmentsOf(key).entrySet()) {
          ProcessReach.FileId file = ProcessReach.FileId.of(segment.getValue());
          if (file != null && !reach.reaches(file) && unchangedSince(process, checkedAt)) {
            log.debug("Process {} no longer maps segment {} nor holds its descriptor", holder.pid(), segment.getKey());
            pool.dropped(key, segment.getKey());
          }
        }
      }
    }
    forgetIdleHidden(holding);
  }

  /**
   * True when the process has not connected since {@code checkedAt} (its {@code /proc} read
   * then may miss a descriptor sent since) and no connection of it left a reply unread.
   */
  private synchronized boolean unchangedSince(FdPeer.Key process, long checkedAt) {
    FdPeer p = peers.get(process);
    return p == null || (p.connections == 0 && !p.leftUnread && p.lastConnect <= checkedAt);
  }

  /** Forgets processes without connections that have exited (their holders end in the sweep). */
  private void forgetExited() {
    List<FdPeer> idle = new ArrayList<>();
    synchronized (this) {
      for (FdPeer p : peers.values()) {
        if (p.connections == 0) {
          idle.add(p);
        }
      }
    }
    for (FdPeer p : idle) {
      if (p.exited()) {
        synchronized (this) {
          if (p.connections == 0 && p.granting == 0) {
            forget(p);
          }
        }
      }
    }
  }

  /**
   * Lets go of the pidfds of processes without a connection that keep nothing ({@code holding}
   * lists the processes the books named at this sweep's start), so that a live process that
   * was refused, or gave everything back, costs the daemon no descriptor.
   */
  private void forgetIdleHidden(Set<FdPeer.Key> holding) {
    List<FdPeer> idle = new ArrayList<>();
    long checkedAt;
    synchronized (this) {
      checkedAt = connects;
      for (FdPeer p : peers.values()) {
        if (p.pidfd != null && p.connections == 0 && p.granting == 0 && !holding.contains(p.key)) {
          idle.add(p);
        }
      }
    }
    if (idle.isEmpty()) {
      return;
    }
    // Read again: a grant that reached the books after the list above was read shows here.
    Set<FdPeer.Key> now = new HashSet<>();
    for (String key : pools.descriptorHolders()) {
      DescriptorHolder holder = DescriptorHolder.parse(key);
      now.add(new FdPeer.Key(holder.pid(), holder.startTicks()));
    }
    synchronized (this) {
      for (FdPeer p : idle) {
        if (p.connections == 0 && p.granting == 0 && p.lastConnect <= checkedAt && !now.contains(p.key)) {
          forget(p);
        }
      }
    }
  }

  private void forget(FdPeer p) { // guarded by this
    if (peers.remove(p.key, p) && p.pidfd != null) {
      hiddenByTenant.computeIfPresent(p.tenant, (t, n) -> n <= 1 ? null : n - 1);
      p.pidfd.close();
    }
  }

  // ------------------------------------------------------------------------------ take-over

  /**
   * For a take-over, with the books exported: a copy of the pidfd of each process followed by
   * pidfd that holds segments now, by its pidfs inode, for the successor to follow it on (a
   * process it could not follow would end its holders at once). The caller owns the copies.
   *
   * @throws IOException when a copy cannot be made (the copies made are closed)
   */
  public Map<Long, Integer> pidfdsToHandOver() throws IOException {
    Map<Long, Integer> copies = new LinkedHashMap<>();
    Set<Long> holding = hiddenHolders().keySet();
    try {
      synchronized (this) {
        for (long inode : holding) {
          FdPeer p = peers.get(new FdPeer.Key(0, inode));
          if (p != null) {
            copies.put(inode, p.pidfd.copy());
          }
        }
      }
      return copies;
    } catch (IOException e) {
      copies.values().forEach(UnixSockets::closeQuietly);
      throw e;
    }
  }

  /**
   * A successor's, once the pools are restored: follows on the processes the previous daemon
   * followed by pidfd ({@code pidfds}, by pidfs inode, as {@link #pidfdsToHandOver} gave them).
   * Owns every descriptor given from here: one that is not that process's pidfd, of a process no
   * holder names, or of one already followed (it connected since) is closed. A holder whose
   * pidfd cannot be taken (WARN) ends at the first sweep, as its process cannot be followed.
   * Adopted processes count toward {@link #MAX_HIDDEN_PROCESSES_PER_TENANT} but are not refused:
   * the previous daemon held them to it.
   */
  public void adopt(Map<Long, Integer> pidfds) {
    List<Map.Entry<Long, Integer>> left = new ArrayList<>(pidfds.entrySet());
    try {
      adoptEach(left);
    } finally {
      left.forEach(e -> UnixSockets.closeQuietly(e.getValue())); // not reached: a failure of its own
    }
  }

  /** Adopts each of {@code pidfds}, removing it from the list once it is owned or closed. */
  private void adoptEach(List<Map.Entry<Long, Integer>> pidfds) {
    Map<Long, String> tenants = hiddenHolders();
    int adopted = 0;
    int offered = pidfds.size();
    while (!pidfds.isEmpty()) {
      Map.Entry<Long, Integer> e = pidfds.remove(pidfds.size() - 1);
      String tenant = tenants.get(e.getKey());
      if (tenant == null) {
        UnixSockets.closeQuietly(e.getValue()); // no holder names it (any more): nothing to follow
        continue;
      }
      Pidfd pidfd;
      try {
        pidfd = Pidfd.adopt(e.getValue(), e.getKey()); // closes a descriptor it refuses
      } catch (IOException | RuntimeException failed) {
        log.warn("--take-over: the pidfd sent for the process of pidfs inode {} cannot be read ({}): that process's "
            + "holders end", e.getKey(), failed.toString());
        continue;
      }
      if (pidfd == null) {
        log.warn("--take-over: the descriptor sent for the process of pidfs inode {} is not its pidfd: that "
            + "process's holders end", e.getKey());
        continue;
      }
      synchronized (this) {
        FdPeer.Key key = new FdPeer.Key(0, pidfd.inode());
        if (peers.containsKey(key)) {
          pidfd.close();
          continue;
        }
        peers.put(key, new FdPeer(key, pidfd, tenant));
        hiddenByTenant.merge(tenant, 1, Integer::sum);
        adopted++;
      }
    }
    if (offered > 0) {
      log.debug("--take-over: following {} of {} process(es) in PID namespaces this daemon cannot see by the pidfds "
          + "the previous daemon sent", adopted, offered);
    }
  }

  /** The processes followed by pidfd that the books name as holders: pidfs inode to tenant. */
  private Map<Long, String> hiddenHolders() {
    Map<Long, String> tenants = new HashMap<>();
    for (String key : pools.descriptorHolders()) {
      DescriptorHolder holder = DescriptorHolder.parse(key);
      if (holder.pid() == 0) {
        tenants.putIfAbsent(holder.startTicks(), holder.tenant());
      }
    }
    return tenants;
  }

  /** Processes the channel knows (for tests and metrics). */
  synchronized int knownProcesses() {
    return peers.size();
  }

  /** Processes of {@code tenant} followed by pidfd (for tests). */
  synchronized int hiddenProcesses(String tenant) {
    return hiddenByTenant.getOrDefault(tenant, 0);
  }
}
