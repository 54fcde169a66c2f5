package io.gpumemd.common.unix;

import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A process's or thread's name, state, CPU time and start time as {@code /proc/PID/stat} (or
 * {@code /proc/PID/task/TID/stat}) gives them; start -1 when it is gone. The start time tells a
 * process from a later one that reuses its pid. Immutable.
 *
 * @param name the command name (a thread's own, as the JVM sets it), at most 15 bytes
 * @param cpuTicks user and system time, in clock ticks
 */
public record ProcessStat(String name, char state, long cpuTicks, long startTicks) {
  private static final ProcessStat GONE = new ProcessStat("", 'X', 0, -1);

  /**
   * Whether the process still holds its memory and descriptors: a zombie has released both
   * ({@code exit_mm}, {@code exit_files} run before it becomes one).
   */
  public boolean alive() {
    return startTicks >= 0 && state != 'Z' && state != 'X' && state != 'x';
  }

  public static ProcessStat read(long pid) {
    return read(Path.of("/proc/" + pid + "/stat"));
  }

  /** Every thread of process {@code pid} still listed (one that exited meanwhile left out); empty when it is gone. */
  public static List<ProcessStat> threads(long pid) {
    List<ProcessStat> threads = new ArrayList<>();
    try (DirectoryStream<Path> tasks = Files.newDirectoryStream(Path.of("/proc/" + pid + "/task"))) {
      for (Path task : tasks) {
        ProcessStat stat = read(task.resolve("stat"));
        if (stat.startTicks >= 0) {
          threads.add(stat);
        }
      }
    } catch (IOException | RuntimeException e) {
      return List.of(); // gone
    }
    return threads;
  }

  /**
   * Whether any thread of process {@code pid} still runs. A process's descriptors are closed when
   * its last thread exits, which may be after its first thread (whose state {@link #read} gives)
   * is a zombie; an exited thread leaves {@code /proc/PID/task} once it is past that point.
   */
  public static boolean anyThreadRuns(long pid) {
    return threads(pid).stream().anyMatch(ProcessStat::alive);
  }

  private static ProcessStat read(Path file) {
    try {
      String stat = Files.readString(file);
      // The command name (field 2) may hold spaces and ')': the fields resume after the last ')'.
      int close = stat.lastIndexOf(')');
      String[] fields = stat.substring(close + 2).split(" ");
      // After the name: state (0), ..., utime (11), stime (12), ..., starttime (19).
      return new ProcessStat(stat.substring(stat.indexOf('(') + 1, close), fields[0].charAt(0),
          Long.parseLong(fields[11]) + Long.parseLong(fields[12]), Long.parseLong(fields[19]));
    } catch (IOException | RuntimeException e) {
      return GONE;
    }
  }
}
