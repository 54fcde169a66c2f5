package io.gpumemd.server.fd;

import io.gpumemd.common.Ticker;
import io.gpumemd.common.unix.ProcessStat;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.pool.DescriptorHolder;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
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
 * process (tests, embedded use) is not tracked: it cannot keep memory from the daemon. Nor, for
 * now, is one the kernel names pid 0, in a PID namespace this daemon cannot see: such a process
 * cannot be told from another or followed to its exit by pid ({@link #connected} warns once;
 * SECURITY.md, "Not yet across PID namespaces").
 *
 * <p>{@link #sweep} runs on the housekeeping thread: at once after a process's last connection
 * closed, else once a second for processes that may have exited.
 *
 * <p>Thread-safety: the open connections are guarded by this object's monitor; {@code /proc} is
 * read and the pools are called outside it. A holder is dropped only if its process opened no
 * connection since its check began (a grant always comes through a connection), so a
 * descriptor sent during a check keeps its holder. The processes it knows are bounded by the
 * live processes that connected: one that exited is forgotten at the next sweep.
 */
public final class DescriptorPins {
  private static final Logger log = LoggerFactory.getLogger(DescriptorPins.class);
  private static final long FULL_SWEEP_NANOS = TimeUnit.SECONDS.toNanos(1);
  private static final int SELF = (int) ProcessHandle.current().pid();

  /** A process that connected to the fd channel: kept until it has exited. */
  private static final class Peer {
    final long startTicks;
    int connections;
    /** The value of {@link #connects} when it last connected: a check begun before is stale. */
    long lastConnect;
    /** A connection of it ended with replies unread: it keeps what it was sent until it exits. */
    boolean leftUnread;

    Peer(long startTicks) {
      this.startTicks = startTicks;
    }
  }

  private final DevicePools pools;
  private final Ticker ticker;
  private final Map<Integer, Peer> peers = new HashMap<>(); // guarded by this
  private long connects; // guarded by this
  private boolean dirty; // guarded by this: a process closed its last connection
  private long lastSweepNanos; // housekeeping thread only
  /** Whether a peer whose pid this daemon cannot see was logged at WARN (once a daemon). */
  private final AtomicBoolean hiddenPeerWarned = new AtomicBoolean();

  public DescriptorPins(DevicePools pools, Ticker ticker) {
    this.pools = pools;
    this.ticker = ticker;
    this.lastSweepNanos = ticker.nanos();
  }

  /** A process connected to the fd channel (the kernel's pid, {@code SO_PEERCRED}). */
  void connected(Caller peer) {
    int pid = peer.pid();
    if (pid == 0 && hiddenPeerWarned.compareAndSet(false, true)) {
      log.atWarn().addKeyValue("uid", peer.uid()).log("fd channel: {} connected from a PID namespace this daemon "
          + "cannot see (the kernel gives its pid as 0): descriptors sent to such processes are not tracked, so "
          + "one that ends its session while it keeps a segment mapped is not charged for it (SECURITY.md, "
          + "'Not yet across PID namespaces'); logged once", peer);
    }
    if (pid <= 0 || pid == SELF) {
      return;
    }
    long start = ProcessStat.read(pid).startTicks();
    if (start < 0) {
      return; // gone already: its connection ends at once, and it was sent nothing
    }
    synchronized (this) {
      Peer p = peers.get(pid);
      if (p == null || p.startTicks != start) {
        p = new Peer(start);
        peers.put(pid, p);
      }
      p.connections++;
      p.lastConnect = ++connects;
    }
  }

  /**
   * A connection of a process closed.
   *
   * @param nothingUnread true when the kernel said the peer had read everything sent to it
   */
  synchronized void disconnected(Caller peer, boolean nothingUnread) {
    Peer p = peers.get(peer.pid());
    if (p == null || p.connections == 0) {
      return;
    }
    p.leftUnread |= !nothingUnread;
    if (--p.connections == 0) {
      dirty = true;
    }
  }

  /**
   * The fd channel is about to send a process a descriptor of a segment it holds for {@code
   * session}: from now on the process may map it, whatever becomes of the session.
   */
  void granted(Caller peer, String session, long segmentId) {
    long start;
    synchronized (this) {
      Peer p = peers.get(peer.pid());
      if (p == null || p.connections == 0) {
        return; // the daemon's own process (or a peer that exited as it connected)
      }
      start = p.startTicks;
    }
    DevicePool pool = pools.ofSegment(segmentId);
    if (pool != null) {
      pool.descriptorSent(segmentId, new DescriptorHolder(peer.pid(), start, session, peer.tenant()));
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
    for (String key : pools.descriptorHolders()) {
      DescriptorHolder holder = DescriptorHolder.parse(key);
      long checkedAt;
      synchronized (this) {
        Peer p = peers.get(holder.pid());
        boolean same = p != null && p.startTicks == holder.startTicks();
        if (same && (p.connections > 0 || p.leftUnread)) {
          continue; // a descriptor may wait unread in its socket: it keeps the segment
        }
        checkedAt = connects;
      }
      ProcessStat stat = ProcessStat.read(holder.pid());
      if (!stat.alive() || stat.startTicks() != holder.startTicks()) {
        log.debug("Process {} of {} exited: it maps nothing it was sent for session {}", holder.pid(),
            holder.tenant(), holder.session());
        pools.holderEnded(key);
        continue;
      }
      ProcessReach reach = reaches.computeIfAbsent(holder.pid(), ProcessReach::read);
      if (reach == null) {
        continue; // its /proc entries are not ours to read: it keeps what it was sent until it exits
      }
      for (DevicePool pool : pools.all()) {
        for (Map.Entry<Long, SegmentMemory> segment : pool.segmentsOf(key).entrySet()) {
          FileId file = FileId.of(segment.getValue());
          if (file != null && !reach.reaches(file) && unchangedSince(holder, checkedAt)) {
            log.debug("Process {} no longer maps segment {} nor holds its descriptor", holder.pid(), segment.getKey());
            pool.dropped(key, segment.getKey());
          }
        }
      }
    }
  }

  /**
   * True when the process has not connected since {@code checkedAt} (its {@code /proc} read
   * then may miss a descriptor sent since) and no connection of it left a reply unread.
   */
  private synchronized boolean unchangedSince(DescriptorHolder holder, long checkedAt) {
    Peer p = peers.get(holder.pid());
    return p == null || p.startTicks != holder.startTicks()
        || (p.connections == 0 && !p.leftUnread && p.lastConnect <= checkedAt);
  }

  /** Forgets processes without connections that have exited (their holders end in the sweep). */
  private void forgetExited() {
    List<Map.Entry<Integer, Long>> idle = new ArrayList<>();
    synchronized (this) {
      for (Map.Entry<Integer, Peer> e : peers.entrySet()) {
        if (e.getValue().connections == 0) {
          idle.add(Map.entry(e.getKey(), e.getValue().startTicks));
        }
      }
    }
    for (Map.Entry<Integer, Long> e : idle) {
      ProcessStat stat = ProcessStat.read(e.getKey());
      if (!stat.alive() || stat.startTicks() != e.getValue()) {
        synchronized (this) {
          Peer p = peers.get(e.getKey());
          if (p != null && p.connections == 0 && p.startTicks == e.getValue()) {
            peers.remove(e.getKey());
          }
        }
      }
    }
  }

  /** Processes the channel knows (for tests and metrics). */
  synchronized int knownProcesses() {
    return peers.size();
  }

  // ------------------------------------------------------------------------------ /proc

  /** A file by device and inode, as {@code stat} and {@code /proc/PID/maps} name it. */
  record FileId(long major, long minor, long inode) {
    /** The file of a host segment passed by descriptor; null for any other kind (not checkable). */
    static FileId of(SegmentMemory memory) {
      if (!(memory instanceof FdPassedSegment segment) || !(memory.handle() instanceof IpcHandle.HostFd)) {
        return null;
      }
      try (SegmentFd descriptor = segment.open(true)) {
        if (descriptor == null) {
          return null; // freed meanwhile
        }
        return ofPath(Path.of("/proc/self/fd/" + descriptor.number()));
      } catch (IOException | RuntimeException e) {
        return null;
      }
    }

    /** The file a path (or a {@code /proc} descriptor link) names, or null when it cannot be read. */
    static FileId ofPath(Path path) {
      try {
        long dev = (Long) Files.getAttribute(path, "unix:dev");
        long ino = (Long) Files.getAttribute(path, "unix:ino");
        // glibc's dev_t encoding (gnu_dev_major and gnu_dev_minor)
        long major = ((dev >>> 8) & 0xfff) | ((dev >>> 32) & ~0xfffL);
        long minor = (dev & 0xff) | ((dev >>> 12) & ~0xffL);
        return new FileId(major, minor, ino);
      } catch (IOException | RuntimeException e) {
        return null;
      }
    }
  }

  /** The files a process maps or holds descriptors of, as the kernel shows them. */
  static final class ProcessReach {
    private final Set<FileId> files;

    private ProcessReach(Set<FileId> files) {
      this.files = files;
    }

    boolean reaches(FileId file) {
      return files.contains(file);
    }

    /** Reads {@code /proc/PID/maps} and {@code /proc/PID/fd}; null when either cannot be read. */
    static ProcessReach read(int pid) {
      Set<FileId> files = new HashSet<>();
      Path proc = Path.of("/proc/" + pid);
      try {
        List<String> maps = Files.readAllLines(proc.resolve("maps"));
        for (String line : maps) {
          // address perms offset dev inode [path]
          String[] f = line.trim().split("\\s+", 6);
          if (f.length < 5 || f[4].equals("0")) {
            continue;
          }
          String[] dev = f[3].split(":");
          files.add(new FileId(Long.parseLong(dev[0], 16), Long.parseLong(dev[1], 16), Long.parseLong(f[4])));
        }
        try (DirectoryStream<Path> fds = Files.newDirectoryStream(proc.resolve("fd"))) {
          for (Path fd : fds) {
            FileId id = FileId.ofPath(fd);
            if (id != null) {
              files.add(id); // a descriptor closed meanwhile, or a socket: nothing to match
            }
          }
        }
        return files.isEmpty() ? null : new ProcessReach(files);
      } catch (IOException | RuntimeException e) {
        return null;
      }
    }
  }
}
