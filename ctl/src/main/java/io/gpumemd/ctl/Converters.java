package io.gpumemd.ctl;

import io.gpumemd.common.Sizes;
import java.util.Locale;
import picocli.CommandLine;
import picocli.CommandLine.ITypeConverter;
import picocli.CommandLine.TypeConversionException;

/**
 * gpumemctl's value types for picocli. Each converter's {@link TypeConversionException} message
 * is only the "expected" part; {@link UsageErrors} adds the flag and the value, so that every
 * bad value reads {@code --size: '12 parsecs' (expected: a byte size …)}. Stateless.
 */
final class Converters {
  private Converters() {}

  /** A byte size: {@code 4096}, {@code 512KiB}, {@code 64MiB}, {@code 1GiB} ({@link Sizes#parse}). */
  static final class Size implements ITypeConverter<Long> {
    @Override
    public Long convert(String value) {
      try {
        return Sizes.parse(value);
      } catch (IllegalArgumentException e) {
        throw new TypeConversionException(e.getMessage());
      }
    }
  }

  /**
   * Replaces picocli's number and boolean converters, whose messages ("'x' is not an int") are
   * not in the project's form.
   */
  static void register(CommandLine cli) {
    ITypeConverter<Integer> integer = value -> {
      try {
        return Integer.valueOf(value.trim());
      } catch (NumberFormatException e) {
        throw new TypeConversionException("an integer");
      }
    };
    ITypeConverter<Long> longInteger = value -> {
      try {
        return Long.valueOf(value.trim());
      } catch (NumberFormatException e) {
        throw new TypeConversionException("an integer");
      }
    };
    ITypeConverter<Double> number = value -> {
      try {
        double d = Double.parseDouble(value.trim());
        if (Double.isFinite(d)) {
          return d;
        }
      } catch (NumberFormatException e) {
        // reported below
      }
      throw new TypeConversionException("a number such as 5 or 0.25");
    };
    ITypeConverter<Boolean> bool = value -> switch (value.trim().toLowerCase(Locale.ROOT)) {
      case "true" -> true;
      case "false" -> false;
      default -> throw new TypeConversionException("no value: it is a switch");
    };
    cli.registerConverter(Boolean.class, bool);
    cli.registerConverter(boolean.class, bool);
    cli.registerConverter(Integer.class, integer);
    cli.registerConverter(int.class, integer);
    cli.registerConverter(Long.class, longInteger);
    cli.registerConverter(long.class, longInteger);
    cli.registerConverter(Double.class, number);
    cli.registerConverter(double.class, number);
  }
}
