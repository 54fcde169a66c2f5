package io.gpumemd.server.testing;

import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import java.util.stream.Stream;

/**
 * The classes of a daemon's start, archived once per test JVM (dynamic class data sharing), for
 * the JVMs that {@link DaemonProcess#javaCommand} starts: the tests start hundreds of daemons and
 * client processes (a soak test alone 100 holders), and each loaded and verified the same gRPC,
 * Netty and protobuf classes again. The JVM archives classes from jar files only, so the test
 * classpath's directories are packed into jars first, beside the archive in {@code
 * target/class-archive}, and the processes run on that classpath.
 *
 * <p>Nothing depends on it: when the archive cannot be made (the dump failed, no daemon start),
 * processes start as before, on the test classpath. A JVM that cannot use the archive (another
 * classpath: {@link OtherUser}'s copy) starts without it, quietly ({@code -Xlog:cds=off}: its
 * warning would be a line in the process's output, which tests read).
 *
 * <p>Thread-safe: made once, under the class's lock.
 */
final class ClassArchive {
  /** The classpath to start processes on, and the flags that load the archive (none without one). */
  record Use(String classpath, List<String> flags) {}

  /** Keeps the JVM's warning about an archive it cannot use out of the process's output. */
  private static final List<String> QUIET = List.of("-Xlog:cds=off", "-Xlog:cds+dynamic=off");

  private static Use use;

  private ClassArchive() {}

  /**
   * What processes started with {@code java} and {@code jvmFlags} run on; the first call makes
   * the archive (a few seconds: one daemon started and stopped).
   */
  static synchronized Use get(String java, List<String> jvmFlags) {
    if (use == null) {
      String classpath = System.getProperty("java.class.path");
      try {
        use = make(java, jvmFlags, classpath);
      } catch (IOException | RuntimeException e) {
        System.err.println("No class archive for the test processes (" + e + "): they start without one");
        use = new Use(classpath, List.of());
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        use = new Use(classpath, List.of());
      }
    }
    return use;
  }

  private static Use make(String java, List<String> jvmFlags, String classpath)
      throws IOException, InterruptedException {
    Path dir = Files.createDirectories(Path.of("target", "class-archive").toAbsolutePath());
    String jars = jarsOnly(classpath, dir);
    Path archive = dir.resolve("processes.jsa");
    Path written = dir.resolve("processes.jsa.new");
    Files.deleteIfExists(written);
    Path run = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-archive-");
    List<String> command = new ArrayList<>(List.of(java));
    command.addAll(jvmFlags);
    command.add("-XX:ArchiveClassesAtExit=" + written);
    command.addAll(QUIET);
    command.addAll(List.of("-cp", jars, "io.gpumemd.server.Main"));
    command.addAll(List.of(TestDaemon.defaultFlags(run)));
    try (DaemonProcess daemon = DaemonProcess.launch(command, run, true, Map.of())) {
      daemon.terminate(30_000); // the JVM writes the archive as it exits
      if (!Files.exists(written)) {
        throw new IOException("the JVM wrote no archive: " + daemon.output());
      }
    }
    Files.move(written, archive, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    List<String> flags = new ArrayList<>(List.of("-XX:SharedArchiveFile=" + archive));
    flags.addAll(QUIET);
    return new Use(jars, List.copyOf(flags));
  }

  /** {@code classpath} with each directory in it packed into a jar in {@code dir}. */
  private static String jarsOnly(String classpath, Path dir) throws IOException {
    List<String> entries = new ArrayList<>();
    int n = 0;
    for (String entry : classpath.split(File.pathSeparator)) {
      Path from = Path.of(entry);
      if (Files.isDirectory(from)) {
        Path jar = dir.resolve("classes-" + n++ + ".jar");
        pack(from, jar);
        entries.add(jar.toString());
      } else {
        entries.add(entry);
      }
    }
    return String.join(File.pathSeparator, entries);
  }

  private static void pack(Path from, Path jar) throws IOException {
    try (OutputStream out = Files.newOutputStream(jar); JarOutputStream packed = new JarOutputStream(out);
        Stream<Path> files = Files.walk(from)) {
      for (Path file : (Iterable<Path>) files.sorted()::iterator) {
        if (Files.isDirectory(file) && !file.equals(from)) {
          packed.putNextEntry(new JarEntry(from.relativize(file).toString().replace(File.separatorChar, '/') + "/"));
          packed.closeEntry();
        } else if (Files.isRegularFile(file)) {
          packed.putNextEntry(new JarEntry(from.relativize(file).toString().replace(File.separatorChar, '/')));
          Files.copy(file, packed);
          packed.closeEntry();
        }
      }
    }
  }
}
