package io.gpumemd.server.testing;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

/**
 * Runs test client JVMs as another user: {@code setpriv --reuid UID --regid GID
 * --clear-groups} (or with the given supplementary groups), which needs root. The test
 * classpath usually lies where other users cannot read it (under /root), so it is copied once
 * per test JVM into a world-readable directory under /tmp.
 */
public final class OtherUser {
  /** The unprivileged user every distribution has. */
  public static final int NOBODY = 65534;

  private static Path sharedClasspath;

  private OtherUser() {}

  /** True when this JVM runs as root and can therefore start processes as other users. */
  public static boolean available() {
    try {
      return (Integer) Files.getAttribute(Path.of("/proc/self"), "unix:uid") == 0
          && Files.isExecutable(Path.of("/usr/bin/setpriv"));
    } catch (IOException e) {
      return false;
    }
  }

  /**
   * The command that runs {@code mainClass} as {@code uid}/{@code gid} with the given
   * supplementary groups (none when empty).
   */
  public static List<String> javaCommand(int uid, int gid, List<Integer> groups, String mainClass) {
    List<String> command = new ArrayList<>(List.of("setpriv", "--reuid", Integer.toString(uid),
        "--regid", Integer.toString(gid)));
    if (groups.isEmpty()) {
      command.add("--clear-groups");
    } else {
      command.add("--groups");
      command.add(String.join(",", groups.stream().map(String::valueOf).toList()));
    }
    List<String> java = DaemonProcess.javaCommand(mainClass);
    int cp = java.indexOf("-cp");
    java.set(cp + 1, classpath());
    // No perf data file: the user may have no writable home, and /tmp/hsperfdata_* is not needed.
    java.add(1, "-XX:-UsePerfData");
    command.addAll(java);
    return command;
  }

  /** Makes a directory (and the path to it) traversable by other users. */
  public static void openUp(Path dir) {
    try {
      for (Path p = dir; p != null && p.startsWith("/tmp") && !p.equals(Path.of("/tmp")); p = p.getParent()) {
        Files.setPosixFilePermissions(p, PosixFilePermissions.fromString("rwxr-xr-x"));
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static synchronized String classpath() {
    try {
      if (sharedClasspath == null) {
        Path dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-cp-");
        List<String> entries = new ArrayList<>();
        int i = 0;
        for (String entry : System.getProperty("java.class.path").split(File.pathSeparator)) {
          Path from = Path.of(entry);
          if (!Files.exists(from)) {
            continue;
          }
          Path to = dir.resolve((i++) + "-" + from.getFileName());
          copy(from, to);
          entries.add(to.toString());
        }
        try (Stream<Path> walk = Files.walk(dir)) {
          for (Path p : walk.toList()) {
            Files.setPosixFilePermissions(p, PosixFilePermissions.fromString(Files.isDirectory(p) ? "rwxr-xr-x" : "rw-r--r--"));
          }
        }
        Runtime.getRuntime().addShutdownHook(new Thread(() -> deleteTree(dir)));
        sharedClasspath = dir;
        System.setProperty("gpumemd.test.sharedcp", String.join(File.pathSeparator, entries));
      }
      return System.getProperty("gpumemd.test.sharedcp");
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static void deleteTree(Path dir) {
    try (Stream<Path> walk = Files.walk(dir)) {
      walk.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException e) {
      // best effort, at JVM exit
    }
  }

  private static void copy(Path from, Path to) throws IOException {
    if (!Files.isDirectory(from)) {
      Files.copy(from, to, StandardCopyOption.REPLACE_EXISTING);
      return;
    }
    try (Stream<Path> walk = Files.walk(from)) {
      for (Path p : walk.toList()) {
        Path target = to.resolve(from.relativize(p).toString());
        if (Files.isDirectory(p)) {
          Files.createDirectories(target);
        } else {
          Files.copy(p, target, StandardCopyOption.REPLACE_EXISTING);
        }
      }
    }
  }
}
