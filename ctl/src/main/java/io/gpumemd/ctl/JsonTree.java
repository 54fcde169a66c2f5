package io.gpumemd.ctl;

import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.ListValue;
import com.google.protobuf.NullValue;
import com.google.protobuf.Struct;
import com.google.protobuf.Value;
import com.google.protobuf.util.JsonFormat;
import java.math.BigDecimal;
import java.math.RoundingMode;
import java.util.List;
import java.util.Map;

/**
 * The load generator's JSON: its report (a tree of {@code Map<String, ?>}, {@code List<?>},
 * strings, numbers, booleans and nulls) becomes a {@code google.protobuf.Struct}, which
 * protobuf's {@link JsonFormat} prints, the same printer as the admin commands' output; no
 * hand-written JSON. Maps keep their insertion order. Doubles are rounded to three decimals
 * (nanosecond resolution of microsecond figures), non-finite doubles become null. Numbers are
 * JSON numbers (a Struct has only doubles, so integers print as {@code 1234.0}; any JSON reader
 * takes them, and every integer the tool reports is below 2^53). Stateless.
 */
final class JsonTree {
  private static final JsonFormat.Printer PRINTER = JsonFormat.printer();

  private JsonTree() {}

  /** @param tree a map at the top, as JSON documents have */
  static String print(Map<String, ?> tree) {
    try {
      return PRINTER.print(struct(tree));
    } catch (InvalidProtocolBufferException e) {
      throw new IllegalStateException("cannot print the report as JSON", e);
    }
  }

  static Struct struct(Map<?, ?> map) {
    Struct.Builder struct = Struct.newBuilder();
    map.forEach((key, value) -> struct.putFields(String.valueOf(key), value(value)));
    return struct.build();
  }

  static Value value(Object value) {
    Value.Builder v = Value.newBuilder();
    if (value == null) {
      v.setNullValue(NullValue.NULL_VALUE);
    } else if (value instanceof String s) {
      v.setStringValue(s);
    } else if (value instanceof Boolean b) {
      v.setBoolValue(b);
    } else if (value instanceof Double || value instanceof Float) {
      double d = ((Number) value).doubleValue();
      if (Double.isFinite(d)) {
        v.setNumberValue(BigDecimal.valueOf(d).setScale(3, RoundingMode.HALF_EVEN).doubleValue());
      } else {
        v.setNullValue(NullValue.NULL_VALUE);
      }
    } else if (value instanceof Number n) {
      v.setNumberValue(n.doubleValue());
    } else if (value instanceof Map<?, ?> map) {
      v.setStructValue(struct(map));
    } else if (value instanceof List<?> list) {
      ListValue.Builder items = ListValue.newBuilder();
      list.forEach(item -> items.addValues(value(item)));
      v.setListValue(items);
    } else {
      v.setStringValue(value.toString());
    }
    return v.build();
  }
}
