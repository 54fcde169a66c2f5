package io.gpumemd.ctl;

import java.io.PrintStream;
import java.util.ArrayList;
import java.util.List;

/**
 * A text table with aligned columns for terminals: a header row, then rows, columns separated
 * by two spaces; numeric-looking columns are right-aligned. Not thread-safe.
 */
final class Table {
  private final String[] header;
  private final boolean[] rightAligned;
  private final List<String[]> rows = new ArrayList<>();

  /** Columns whose name starts with {@code >} are right-aligned (the marker is dropped). */
  Table(String... columns) {
    header = new String[columns.length];
    rightAligned = new boolean[columns.length];
    for (int i = 0; i < columns.length; i++) {
      rightAligned[i] = columns[i].startsWith(">");
      header[i] = rightAligned[i] ? columns[i].substring(1) : columns[i];
    }
  }

  Table row(Object... cells) {
    if (cells.length != header.length) {
      throw new IllegalArgumentException("row of " + cells.length + " cells (expected: " + header.length + ")");
    }
    String[] row = new String[cells.length];
    for (int i = 0; i < cells.length; i++) {
      row[i] = String.valueOf(cells[i]);
    }
    rows.add(row);
    return this;
  }

  boolean isEmpty() {
    return rows.isEmpty();
  }

  void print(PrintStream out) {
    int[] width = new int[header.length];
    for (int i = 0; i < header.length; i++) {
      width[i] = header[i].length();
      for (String[] row : rows) {
        width[i] = Math.max(width[i], row[i].length());
      }
    }
    printRow(out, header, width);
    for (String[] row : rows) {
      printRow(out, row, width);
    }
  }

  private void printRow(PrintStream out, String[] cells, int[] width) {
    StringBuilder line = new StringBuilder();
    for (int i = 0; i < cells.length; i++) {
      boolean last = i == cells.length - 1;
      String cell = cells[i];
      int pad = width[i] - cell.length();
      if (rightAligned[i]) {
        line.append(" ".repeat(pad)).append(cell);
      } else {
        line.append(cell);
        if (!last) {
          line.append(" ".repeat(pad));
        }
      }
      if (!last) {
        line.append("  ");
      }
    }
    out.println(line.toString().stripTrailing());
  }
}
