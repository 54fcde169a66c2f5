package io.gpumemd.common.unix;

import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * A process's state and start time as {@code /proc/PID/stat} gives them; start -1 when it is gone.
 * The start time tells a process from a later one that reuses its pid. Immutable.
 */
public record ProcessStat(char state, long startTicks) {
  /**
   * Whether the process still holds its memory and descriptors: a zombie has released both
   * ({@code exit_mm}, {@code exit_files} run before it becomes one).
   */
  public boolean alive() {
    return startTicks >= 0 && state != 'Z' && state != 'X' && state != 'x';
  }

  public static ProcessStat read(int pid) {
    return read(Path.of("/proc/" + pid + "/stat"));
  }

  /**
   * Whether any thread of process {@code pid} still runs. A process's descriptors are closed when
   * its last thread exits, which may be after its first thread (whose state {@link #read} gives)
   * is a zombie; an exited thread leaves {@code /proc/PID/task} once it is past that point.
   */
  public static boolean anyThreadRuns(int pid) {
    try (DirectoryStream<Path> tasks = Files.newDirectoryStream(Path.of("/proc/" + pid + "/task"))) {
      for (Path task : tasks) {
        if (read(task.resolve("stat")).alive()) {
          return true;
        }
      }
      return false;
    } catch (IOException | RuntimeException e) {
      return false; // gone
    }
  }

  private static ProcessStat read(Path file) {
    try {
      String stat = Files.readString(file);
      // The command name (field 2) may hold spaces and ')': the fields resume after the last ')'.
      String[] fields = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
      return new ProcessStat(fields[0].charAt(0), Long.parseLong(fields[19]));
    } catch (IOException | RuntimeException e) {
      return new ProcessStat('X', -1);
    }
  }
}
