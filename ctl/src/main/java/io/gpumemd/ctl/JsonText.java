package io.gpumemd.ctl;

import java.math.BigDecimal;
import java.math.RoundingMode;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Writes a tree of {@code Map<String, ?>}, {@code List<?>}, strings, numbers, booleans and nulls
 * as indented JSON: enough for the load generator's report without a JSON library on the
 * library's classpath. Integers print as integers, doubles with at most three decimals, non-finite doubles as null. Stateless.
 */
final class JsonText {
  private JsonText() {}

  static String write(Object value) {
    StringBuilder out = new StringBuilder();
    write(out, value, 0);
    return out.toString();
  }

  private static void write(StringBuilder out, Object value, int depth) {
    if (value == null) {
      out.append("null");
    } else if (value instanceof String s) {
      quote(out, s);
    } else if (value instanceof Double || value instanceof Float) {
      double d = ((Number) value).doubleValue();
      out.append(Double.isFinite(d)
          ? BigDecimal.valueOf(d).setScale(3, RoundingMode.HALF_EVEN).stripTrailingZeros().toPlainString() : "null");
    } else if (value instanceof Number || value instanceof Boolean) {
      out.append(value);
    } else if (value instanceof Map<?, ?> map) {
      if (map.isEmpty()) {
        out.append("{}");
        return;
      }
      out.append("{\n");
      Iterator<? extends Map.Entry<?, ?>> it = map.entrySet().iterator();
      while (it.hasNext()) {
        Map.Entry<?, ?> e = it.next();
        indent(out, depth + 1);
        quote(out, String.valueOf(e.getKey()));
        out.append(": ");
        write(out, e.getValue(), depth + 1);
        out.append(it.hasNext() ? ",\n" : "\n");
      }
      indent(out, depth);
      out.append('}');
    } else if (value instanceof List<?> list) {
      if (list.isEmpty()) {
        out.append("[]");
        return;
      }
      out.append("[\n");
      for (int i = 0; i < list.size(); i++) {
        indent(out, depth + 1);
        write(out, list.get(i), depth + 1);
        out.append(i + 1 < list.size() ? ",\n" : "\n");
      }
      indent(out, depth);
      out.append(']');
    } else {
      quote(out, value.toString());
    }
  }

  private static void indent(StringBuilder out, int depth) {
    out.append("  ".repeat(depth));
  }

  private static void quote(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }
}
