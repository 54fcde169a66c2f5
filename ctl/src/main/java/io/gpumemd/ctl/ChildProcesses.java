package io.gpumemd.ctl;

import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Struct;
import com.google.protobuf.Value;
import com.google.protobuf.util.JsonFormat;
import io.gpumemd.common.Sizes;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.zip.DataFormatException;
import org.HdrHistogram.Histogram;

/**
 * The {@code procs} scenario: several client processes load the daemon at once. Each child is
 * {@code java -cp <this classpath> GpuMemCtl loadgen --child ...}; it warms up, prints
 * {@code READY}, waits for {@code GO} on stdin (so that every child measures the same window,
 * whatever its JVM start-up took), measures, and prints its result as JSON with the latency
 * histogram encoded (HdrHistogram's compressed form), so that the parent merges the real
 * distributions rather than averaging percentiles.
 *
 * <p>Children whose parent dies see end-of-file on stdin and stop. Not thread-safe.
 */
final class ChildProcesses {
  static final String READY = "READY";
  static final String GO = "GO";
  /** Small heaps and the serial collector: several JVMs share a small machine with the daemon. */
  private static final List<String> CHILD_JVM_OPTIONS = List.of("-Xmx256m", "-XX:+UseSerialGC");

  private ChildProcesses() {}

  private static final class Child {
    final Process process;
    final CountDownLatch ready = new CountDownLatch(1);
    final StringBuilder result = new StringBuilder();
    final Thread reader;
    final Thread errors;

    Child(int index, Process process, PrintStream err) {
      this.process = process;
      this.reader = new Thread(this::readOutput, "loadgen-child-" + index + "-out");
      this.errors = new Thread(() -> forward(index, err), "loadgen-child-" + index + "-err");
      reader.setDaemon(true);
      errors.setDaemon(true);
      reader.start();
      errors.start();
    }

    private void readOutput() {
      try (BufferedReader in = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = in.readLine()) != null) {
          if (ready.getCount() > 0 && line.equals(READY)) {
            ready.countDown();
          } else {
            synchronized (result) {
              result.append(line).append('\n');
            }
          }
        }
      } catch (IOException e) {
        // the child ended
      } finally {
        ready.countDown(); // a child that dies early must not keep the parent waiting
      }
    }

    private void forward(int index, PrintStream err) {
      try (BufferedReader in = new BufferedReader(new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = in.readLine()) != null) {
          err.println("loadgen child " + index + ": " + line);
        }
      } catch (IOException e) {
        // the child ended
      }
    }

    String output() {
      synchronized (result) {
        return result.toString();
      }
    }
  }

  /** Runs {@code processes} children of {@code threads} threads doing lease+release pairs. */
  static LoadResult run(List<String> connectionFlags, int processes, int threads, long sizeBytes, int device,
      LoadDriver.Timing timing, PrintStream err) throws InterruptedException {
    String label = processes + " procs x " + threads + " threads x " + Sizes.label(sizeBytes);
    Map<String, Object> details = new LinkedHashMap<>();
    details.put("processes", processes);
    details.put("threadsPerProcess", threads);
    details.put("sizeBytes", sizeBytes);
    List<Child> children = new ArrayList<>();
    try {
      for (int i = 0; i < processes; i++) {
        List<String> command = new ArrayList<>();
        command.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        command.addAll(CHILD_JVM_OPTIONS);
        command.addAll(List.of("-cp", System.getProperty("java.class.path"), GpuMemCtl.class.getName()));
        command.addAll(connectionFlags);
        command.addAll(List.of("loadgen", "--child", "--threads", Integer.toString(threads),
            "--size", Long.toString(sizeBytes), "--device", Integer.toString(device),
            "--warmup-seconds", Double.toString(timing.warmupNanos() / 1e9),
            "--seconds", Double.toString(timing.measureNanos() / 1e9)));
        children.add(new Child(i, new ProcessBuilder(command).start(), err));
      }
      long startupDeadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60) + timing.warmupNanos();
      for (Child child : children) {
        long left = startupDeadline - System.nanoTime();
        if (!child.ready.await(Math.max(0, left), TimeUnit.NANOSECONDS) || !child.process.isAlive()) {
          return failed(label, details, "a child process did not get ready (exit "
              + (child.process.isAlive() ? "none yet" : child.process.exitValue()) + "): " + child.output().strip());
        }
      }
      for (Child child : children) {
        OutputStream stdin = child.process.getOutputStream();
        stdin.write((GO + "\n").getBytes(StandardCharsets.US_ASCII));
        stdin.flush();
      }
      Histogram merged = LoadDriver.newHistogram();
      long ops = 0;
      long elapsed = 0;
      long misses = 0;
      long errors = 0;
      String firstError = null;
      for (Child child : children) {
        long waitMillis = TimeUnit.NANOSECONDS.toMillis(timing.measureNanos()) + 60_000;
        if (!child.process.waitFor(waitMillis, TimeUnit.MILLISECONDS)) {
          return failed(label, details, "a child process did not finish within " + waitMillis + " ms");
        }
        child.reader.join(5_000);
        Struct result = parse(child.output());
        if (result == null) {
          return failed(label, details, "a child process (exit " + child.process.exitValue()
              + ") printed no result: " + child.output().strip());
        }
        ops += (long) number(result, "ops");
        elapsed = Math.max(elapsed, (long) number(result, "elapsedNanos"));
        misses += (long) number(result, "misses");
        errors += (long) number(result, "errors");
        if (firstError == null && result.containsFields("firstError")) {
          firstError = result.getFieldsOrThrow("firstError").getStringValue();
        }
        merged.add(decode(result.getFieldsOrThrow("histogram").getStringValue()));
      }
      return new LoadResult("procs", label, ops, elapsed, merged, misses, errors, firstError, details);
    } catch (IOException | DataFormatException e) {
      return failed(label, details, "child processes: " + e);
    } finally {
      for (Child child : children) {
        child.process.destroyForcibly();
      }
    }
  }

  private static LoadResult failed(String label, Map<String, Object> details, String error) {
    return new LoadResult("procs", label, 0, 0, LoadDriver.newHistogram(), -1, 1, error, details);
  }

  private static Struct parse(String text) {
    if (text.isBlank()) {
      return null;
    }
    Struct.Builder struct = Struct.newBuilder();
    try {
      JsonFormat.parser().merge(text, struct);
    } catch (InvalidProtocolBufferException e) {
      return null;
    }
    return struct.containsFields("histogram") ? struct.build() : null;
  }

  private static double number(Struct struct, String field) {
    Value value = struct.getFieldsOrDefault(field, Value.getDefaultInstance());
    return value.getNumberValue();
  }

  // ---------------------------------------------------------------------------- child side

  /** The child's half of the protocol: the gate between warm-up and measurement. */
  static LoadDriver.Gate childGate(PrintStream out) {
    return () -> {
      out.println(READY);
      out.flush();
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
      String line = in.readLine();
      if (!GO.equals(line)) {
        throw new IllegalStateException("parent went away before GO (read " + line + ")");
      }
    };
  }

  /** The child's result as one JSON document. */
  static String childResult(LoadResult result) {
    Map<String, Object> json = new LinkedHashMap<>();
    json.put("ops", result.ops);
    json.put("elapsedNanos", result.elapsedNanos);
    json.put("misses", Math.max(0, result.misses));
    json.put("errors", result.errors);
    if (result.firstError != null) {
      json.put("firstError", result.firstError);
    }
    json.put("histogram", encode(result.latency));
    return JsonTree.print(json);
  }

  static String encode(Histogram histogram) {
    ByteBuffer buffer = ByteBuffer.allocate(histogram.getNeededByteBufferCapacity());
    int length = histogram.encodeIntoCompressedByteBuffer(buffer);
    return Base64.getEncoder().encodeToString(java.util.Arrays.copyOf(buffer.array(), length));
  }

  static Histogram decode(String base64) throws DataFormatException {
    return Histogram.decodeFromCompressedByteBuffer(ByteBuffer.wrap(Base64.getDecoder().decode(base64)), 0);
  }
}
