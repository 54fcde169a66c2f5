package io.gpumemd.server;

import io.gpumemd.server.auth.IdentityPolicy;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The socket files of the daemon's listeners: where each is bound (a temporary path beside its
 * own, {@link #bindPath}), the move to its path over a predecessor's ({@link #publish}), whether
 * it is still there ({@link #socketProblem}, for readiness), and its removal at close unless a
 * successor replaced it. A fresh start replaces only a stale socket, never a live one or a file
 * that is not a socket; temporaries left by a daemon that died are cleared ({@link
 * #removeStaleTemporaries}).
 *
 * <p>Bound and published by the starting thread; {@link #socketProblem} may be read from any
 * thread. Logs under {@link Listeners}' name, as it always has.
 */
final class SocketFiles {
  private static final Logger log = LoggerFactory.getLogger(Listeners.class);

  /** The socket files bound, with their identity (device, inode) then: see {@link #socketProblem}. */
  private final List<BoundSocket> bound = new CopyOnWriteArrayList<>();
  /** Sockets of a successor bound at temporary paths, until {@link #publish}. */
  private final List<Pending> pending = new ArrayList<>();
  private boolean takingOver;

  /**
   * Where to bind a socket that belongs at {@code path}: a temporary path beside it, which
   * {@link #publish} renames to {@code path}. Always so, not only while taking over, because
   * Netty removes the file at the path it bound when it closes the listener: a daemon that
   * handed over must not remove its successor's socket, which by then is at {@code path}. A
   * fresh start first removes a stale socket at {@code path} (refusing a live one).
   */
  Path bindPath(Path path, String listener, String flag) throws IOException {
    if (!takingOver) {
      prepareSocketPath(path, listener, flag);
    }
    Files.createDirectories(path.getParent());
    removeStaleTemporaries(path);
    Path at = temporaryPath(path);
    Files.deleteIfExists(at);
    return at;
  }

  /** The path a successor binds before it replaces {@code path}: beside it, named by this process. */
  static Path temporaryPath(Path path) {
    return path.resolveSibling(path.getFileName() + ".new-" + ProcessHandle.current().pid());
  }

  /**
   * Removes the temporary sockets ({@link #temporaryPath}) beside {@code path} of processes that
   * no longer run: a daemon killed between binding and publishing leaves them, and nothing else
   * would. A file whose pid is a live process is left alone (it may be a daemon starting now), as
   * is anything that is not a socket of this uid. Logged at INFO, one line per file.
   */
  static void removeStaleTemporaries(Path path) {
    Path dir = path.toAbsolutePath().getParent();
    String prefix = path.getFileName() + ".new-";
    int uid = IdentityPolicy.currentUid();
    List<Path> candidates = new ArrayList<>();
    try (var files = Files.newDirectoryStream(dir, p -> p.getFileName().toString().startsWith(prefix))) {
      files.forEach(candidates::add);
    } catch (IOException e) {
      return; // no directory yet, or not readable: nothing this daemon left there
    }
    for (Path p : candidates) {
      String digits = p.getFileName().toString().substring(prefix.length());
      if (digits.isEmpty() || digits.length() > 10 || !digits.chars().allMatch(Character::isDigit)) {
        continue;
      }
      long pid = Long.parseLong(digits);
      if (ProcessHandle.of(pid).isPresent()) {
        continue;
      }
      try {
        int mode = (Integer) Files.getAttribute(p, "unix:mode", LinkOption.NOFOLLOW_LINKS);
        int owner = (Integer) Files.getAttribute(p, "unix:uid", LinkOption.NOFOLLOW_LINKS);
        if ((mode & 0170000) != 0140000 || owner != uid) {
          continue;
        }
        Files.deleteIfExists(p);
        log.info("Removed {}: a temporary socket of pid {}, which no longer runs (a start that did not finish)", p,
            pid);
      } catch (IOException e) {
        log.warn("Cannot remove {}, a temporary socket of pid {}, which no longer runs: {}", p, pid, e.toString());
      }
    }
  }

  /** Records a socket file this daemon bound at {@code at}, which belongs at {@code path}. */
  void owned(String name, Path at, Path path) {
    pending.add(new Pending(name, at, path));
  }

  /** A socket bound at a temporary path, to be renamed to its own at {@link #publish}. */
  private record Pending(String name, Path at, Path path) {}

  /**
   * Renames the sockets bound at temporary paths to their own paths, each in one atomic step
   * (replacing a predecessor's: a client connecting meanwhile reaches either the predecessor or
   * this daemon, never nothing); from now on they are this daemon's, removed at close while they
   * are still its own. Clients can connect only from here on.
   */
  void publish() throws IOException {
    for (Pending p : pending) {
      if (Files.exists(p.path(), LinkOption.NOFOLLOW_LINKS)
          && ((Integer) Files.getAttribute(p.path(), "unix:mode", LinkOption.NOFOLLOW_LINKS) & 0170000) != 0140000) {
        throw new IOException(p.name() + ": " + p.path() + " exists and is not a socket; gpumemd replaces only a "
            + "socket (expected: a free path)");
      }
      if (!takingOver) {
        // No predecessor handed over: a live socket there is another daemon's, never replaced.
        prepareSocketPath(p.path(), p.name(), "its path");
      }
      Files.move(p.at(), p.path(), StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
      bound.add(BoundSocket.of(p.name(), p.path()));
    }
    pending.clear();
    takingOver = false;
  }

  /** The sockets are a successor's: their paths are a live predecessor's until {@link #publish}. */
  void takingOver() {
    takingOver = true;
  }

  /** Whether the sockets are a successor's, not yet published over its predecessor's. */
  boolean takingOverNow() {
    return takingOver;
  }

  /**
   * There was no predecessor to take over from after all (nobody answered on the take-over
   * socket): {@link #publish} replaces only stale sockets, as a fresh start does.
   */
  void noPredecessor() {
    takingOver = false;
  }


  /**
   * Removes a stale socket file, refusing if a live daemon still answers on it, and refusing
   * anything that is not a socket: a mistyped {@code --socket} must never delete a file.
   */
  private static void prepareSocketPath(Path path, String listener, String flag) throws IOException {
    Files.createDirectories(path.getParent());
    if (!Files.exists(path, LinkOption.NOFOLLOW_LINKS)) {
      return;
    }
    int type = (Integer) Files.getAttribute(path, "unix:mode", LinkOption.NOFOLLOW_LINKS) & 0170000;
    if (type != 0140000) {
      String what = Files.isSymbolicLink(path) ? "a symbolic link" : Files.isDirectory(path, LinkOption.NOFOLLOW_LINKS)
          ? "a directory" : Files.isRegularFile(path, LinkOption.NOFOLLOW_LINKS) ? "a regular file" : "not a socket";
      throw new IOException(listener + ": " + path + " exists and is " + what
          + "; gpumemd replaces only a stale socket (expected: a free path for " + flag + ")");
    }
    boolean live;
    try (SocketChannel probe = SocketChannel.open(StandardProtocolFamily.UNIX)) {
      live = probe.connect(UnixDomainSocketAddress.of(path));
    } catch (IOException e) {
      live = false; // nobody listens: left by a daemon that died
    }
    if (live) {
      throw new IOException(listener + ": " + path + " is in use by a running process (expected: a free path)");
    }
    Files.delete(path);
  }


  /**
   * Null while every socket file this daemon bound is still at its path; otherwise which one is
   * gone or was replaced. A daemon whose socket was unlinked (an operator's {@code rm}, a cleaner
   * of the shared directory, a container that mounts it writable and meant well) still runs but
   * no client can reach it, and in a pod the socket directory is the only way in. One {@code
   * lstat} per socket: cheap enough for every readiness probe.
   */
  String socketProblem() {
    for (BoundSocket socket : bound) {
      String problem = socket.problem();
      if (problem != null) {
        return problem;
      }
    }
    return null;
  }

  /** A socket file as bound: its path and the file it was then ({@code fileKey}: device and inode). */
  private record BoundSocket(String name, Path path, Object fileKey) {
    static BoundSocket of(String name, Path path) throws IOException {
      return new BoundSocket(name, path,
          Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS).fileKey());
    }

    String problem() {
      try {
        Object now = Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS).fileKey();
        return fileKey == null || fileKey.equals(now) ? null
            : name + " " + path + " was replaced by another file: clients reach something else";
      } catch (NoSuchFileException e) {
        return name + " " + path + " is gone: no client can connect (restart the daemon to bind it again)";
      } catch (IOException e) {
        return name + " " + path + " cannot be checked: " + e.getMessage();
      }
    }
  }


  private static void remove(Path socket) {
    if (socket != null) {
      try {
        Files.deleteIfExists(socket);
      } catch (IOException e) {
        log.warn("Cannot remove socket {}: {}", socket, e.toString());
      }
    }
  }
  /** Where the socket named {@code name} is bound now: its temporary path until {@link #publish}, else null. */
  Path pendingAt(String name) {
    for (Pending p : pending) {
      if (p.name().equals(name)) {
        return p.at();
      }
    }
    return null;
  }

  /** Removes the socket files still this daemon's, and those never published. */
  void removeAll() {
    for (BoundSocket socket : bound) {
      if (socket.problem() == null) {
        remove(socket.path());
      }
    }
    for (Pending p : pending) {
      remove(p.at());
    }
  }
}
