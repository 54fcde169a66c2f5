package io.gpumemd.server.testing;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The real daemon ({@code io.gpumemd.server.Main}) in its own JVM, started from the test
 * classpath, for end-to-end tests: signals, exit codes and logs are the real ones. Its output
 * is collected; {@link #awaitLine} waits for a log line.
 */
public final class DaemonProcess implements AutoCloseable {
  private static final Pattern TCP = Pattern.compile("Listening on tcp://[^:]+:(\\d+)");
  private static final Pattern METRICS = Pattern.compile("Metrics on http://[^:]+:(\\d+)/metrics");

  private final Process process;
  private final Path dir;
  /** False for {@link #startIn}: the caller's directory outlives this process. */
  private final boolean ownsDir;
  private final List<String> lines = Collections.synchronizedList(new ArrayList<>());
  private final CountDownLatch ready = new CountDownLatch(1);
  private volatile int tcpPort = -1;
  private volatile int metricsPort = -1;

  private final Thread reader;

  private DaemonProcess(Process process, Path dir, boolean ownsDir) {
    this.process = process;
    this.dir = dir;
    this.ownsDir = ownsDir;
    reader = new Thread(this::pump, "daemon-output");
    reader.setDaemon(true);
    reader.start();
  }

  /** Starts the daemon with {@link TestDaemon#defaultFlags} then {@code extraFlags}. */
  public static DaemonProcess start(String... extraFlags) {
    try {
      return launch(Files.createTempDirectory(Path.of("/tmp"), "gpumemd-proc-"), true, Map.of(), List.of(), extraFlags);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /**
   * Starts the daemon rooted at {@code dir} (its socket {@code dir/gpumemd.sock}, its shm-dir
   * {@code dir/shm}), which {@link #close} leaves in place: a daemon started again in the same
   * directory is the same daemon restarted, on the same socket path. The caller deletes it.
   */
  public static DaemonProcess startIn(Path dir, String... extraFlags) {
    return launch(dir, false, Map.of(), List.of(), extraFlags);
  }

  /**
   * {@link #start} with these environment variables added to (or, mapped to null, removed from)
   * the test's own: e.g. {@link #NO_GPU}, or another {@code CUDA_VISIBLE_DEVICES}.
   */
  public static DaemonProcess startWith(Map<String, String> environment, String... extraFlags) {
    try {
      return launch(Files.createTempDirectory(Path.of("/tmp"), "gpumemd-proc-"), true, environment, List.of(), extraFlags);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /**
   * The environment of a machine whose driver sees no GPU: the real driver and the stand-in
   * (cuda-standin/) both report no device when {@code CUDA_VISIBLE_DEVICES} is empty.
   */
  public static final Map<String, String> NO_GPU = Map.of("CUDA_VISIBLE_DEVICES", "");

  /** Applies {@code environment} to a process about to start (null values remove the name). */
  public static ProcessBuilder withEnvironment(ProcessBuilder builder, Map<String, String> environment) {
    environment.forEach((name, value) -> {
      if (value == null) {
        builder.environment().remove(name);
      } else {
        builder.environment().put(name, value);
      }
    });
    return builder;
  }

  /**
   * {@link #startIn} with {@code environment} added to (or, for a null value, removed from) the
   * test JVM's, e.g. {@code CUDA_VISIBLE_DEVICES} for a daemon that sees other GPUs.
   */
  public static DaemonProcess startIn(Path dir, Map<String, String> environment, String... extraFlags) {
    return launch(dir, false, environment, List.of(), extraFlags);
  }

  /**
   * A daemon in a temporary directory, its JVM started by {@code prefix} (a command that runs the
   * rest of its command line, e.g. {@code unshare --pid --fork --kill-child --mount-proc} for a
   * daemon in a PID namespace of its own); closing it kills the prefix's process.
   */
  public static DaemonProcess startUnder(List<String> prefix, String... extraFlags) {
    try {
      return launch(Files.createTempDirectory(Path.of("/tmp"), "gpumemd-proc-"), true, Map.of(), prefix, extraFlags);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static DaemonProcess launch(Path dir, boolean ownsDir, Map<String, String> environment, List<String> prefix,
      String... extraFlags) {
    List<String> command = new ArrayList<>(prefix);
    command.addAll(javaCommand("io.gpumemd.server.Main"));
    command.addAll(List.of(TestDaemon.defaultFlags(dir)));
    command.addAll(List.of(extraFlags));
    return launch(command, dir, ownsDir, environment);
  }

  /** Runs {@code command}, a daemon in {@code dir} (deleted at close if {@code ownsDir}), and waits until it is ready. */
  static DaemonProcess launch(List<String> command, Path dir, boolean ownsDir, Map<String, String> environment) {
    try {
      Process p = withEnvironment(new ProcessBuilder(command), environment).redirectErrorStream(true).start();
      DaemonProcess daemon = new DaemonProcess(p, dir, ownsDir);
      if (!daemon.ready.await(30, TimeUnit.SECONDS)) {
        daemon.close();
        throw new IllegalStateException("daemon did not become ready:\n" + daemon.output());
      }
      return daemon;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }

  /**
   * The system property that starts daemon and client processes as the image runs the daemon:
   * the JVM's optimising compiler, its default collector and the image's heap rule. Benchmarks set
   * it, so that what they time is what a deployed daemon runs, not the quick compiler and the
   * small serial-collected heap that let tests start hundreds of JVMs sooner.
   */
  public static final String FULL_JIT = "gpumemd.test.fullJit";

  /** {@code java -cp <this test classpath> mainClass}, for daemon and client processes. */
  public static List<String> javaCommand(String mainClass) {
    String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    // As the image and the README run it: an OutOfMemoryError ends the process.
    List<String> command = new ArrayList<>(List.of(java, "-XX:+ExitOnOutOfMemoryError"));
    if (Boolean.getBoolean(FULL_JIT)) {
      // The image's heap rule and the JVM's own choice of collector (G1 on a machine of two cores
      // or more): what a benchmark times should be collected as a deployed daemon is.
      command.add("-XX:MaxRAMPercentage=50");
    } else {
      // Tests start hundreds of short-lived JVMs: a small heap, the serial collector and the
      // quick compiler alone start them sooner, and so do the classes of a daemon's start
      // archived once (ClassArchive).
      List<String> flags = List.of("-Xmx" + System.getProperty("gpumemd.test.xmx", "256m"), "-XX:+UseSerialGC",
          "-XX:TieredStopAtLevel=1");
      command.addAll(flags);
      ClassArchive.Use archive = ClassArchive.get(java, flags);
      command.addAll(archive.flags());
      command.addAll(List.of("-cp", archive.classpath(), mainClass));
      return command;
    }
    command.addAll(List.of("-cp", System.getProperty("java.class.path"), mainClass));
    return command;
  }

  private void pump() {
    try (BufferedReader in = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
      String line;
      while ((line = in.readLine()) != null) {
        lines.add(line);
        Matcher m = TCP.matcher(line);
        if (m.find()) {
          tcpPort = Integer.parseInt(m.group(1));
        }
        Matcher mm = METRICS.matcher(line);
        if (mm.find()) {
          metricsPort = Integer.parseInt(mm.group(1));
        }
        if (line.contains("gpumemd ready")) {
          ready.countDown();
        }
      }
    } catch (IOException e) {
      // process ended
    } finally {
      ready.countDown();
    }
  }

  public Process process() {
    return process;
  }

  public String tcpTarget() {
    return "127.0.0.1:" + tcpPort;
  }

  public String unixTarget() {
    return "unix://" + dir.resolve("gpumemd.sock");
  }

  public int metricsPort() {
    return metricsPort;
  }

  public Path dir() {
    return dir;
  }

  public Path shmDir() {
    return dir.resolve("shm");
  }

  public String output() {
    synchronized (lines) {
      return String.join("\n", lines);
    }
  }

  /** Waits up to {@code millis} for a log line containing {@code text}. */
  public boolean awaitLine(String text, long millis) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    while (System.nanoTime() < deadline) {
      synchronized (lines) {
        for (String line : lines) {
          if (line.contains(text)) {
            return true;
          }
        }
      }
      Thread.sleep(20);
    }
    return false;
  }

  /**
   * Sends SIGTERM. (Not {@code Process.destroy()}: it also closes our end of the process's
   * output, and we would lose what the daemon logs while it shuts down.)
   */
  public void sigterm() {
    process.toHandle().destroy();
  }

  /** Sends SIGTERM and waits for the exit code. */
  public int terminate(long millis) throws InterruptedException {
    sigterm();
    return awaitExit(millis);
  }

  /**
   * Waits for the process to exit and for its output to be read to the end.
   *
   * @return the exit code, or -1 if it had to be killed
   */
  public int awaitExit(long millis) throws InterruptedException {
    if (!process.waitFor(millis, TimeUnit.MILLISECONDS)) {
      process.destroyForcibly();
      process.waitFor();
      reader.join(5000);
      return -1;
    }
    reader.join(5000);
    return process.exitValue();
  }

  @Override
  public void close() {
    if (process.isAlive()) {
      process.destroyForcibly();
      try {
        process.waitFor(10, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    if (!ownsDir) {
      return;
    }
    try (var walk = Files.walk(dir)) {
      walk.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException e) {
      // best effort
    }
  }
}
