package io.gpumemd.server.fd;

import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * The files a process maps or holds descriptors of, as the kernel shows them ({@code /proc/PID/maps}
 * and {@code /proc/PID/fd}): what {@link DescriptorPins} checks before it lets a holder of a host
 * segment go. Immutable once read.
 */
final class ProcessReach {
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
